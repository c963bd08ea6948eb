package producer

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/protocol"
)

// TxState is the outcome of a local transaction.
type TxState int

const (
	// TxUnknown: the outcome is not known yet; the broker will ask Check later.
	TxUnknown TxState = iota
	// TxCommit: deliver the message.
	TxCommit
	// TxRollback: drop the message.
	TxRollback
)

func (s TxState) String() string {
	switch s {
	case TxUnknown:
		return "UNKNOWN"
	case TxCommit:
		return "COMMIT"
	case TxRollback:
		return "ROLLBACK"
	}
	return "TX_STATE_" + strconv.Itoa(int(s))
}

// wire is the END_TRANSACTION commitOrRollback value of s.
func (s TxState) wire() int32 {
	switch s {
	case TxCommit:
		return protocol.MsgTransactionCommit
	case TxRollback:
		return protocol.MsgTransactionRollback
	}
	return protocol.MsgTransactionNone
}

// MessageExt is a stored message as the broker sends it in a transaction check-back: the
// half message with its real topic and queue, its properties and body.
type MessageExt = protocol.MessageExt

// TransactionListener runs a producer's local transactions and tells the broker their
// outcome. See WithTransactionListener.
type TransactionListener interface {
	// ExecuteLocal runs the local transaction that goes with msg, once the broker has stored
	// msg as a half message, which no consumer sees yet. Commit delivers it, Rollback drops
	// it, Unknown leaves the decision to a later Check.
	ExecuteLocal(ctx context.Context, msg *Message) TxState
	// Check is asked by the broker, for a half message left Unknown (or whose outcome was
	// lost), what became of its local transaction. It runs on a goroutine of its own; ctx
	// ends when the producer closes. Unknown makes the broker ask again later, up to its
	// check limit, after which the message is dropped.
	Check(ctx context.Context, msg *MessageExt) TxState
}

// TxResult is the outcome of SendInTransaction.
type TxResult struct {
	// SendResult describes the half message: QueueOffset is its offset in the broker's half
	// queue, TransactionID its unique id.
	SendResult
	// State is what ExecuteLocal returned (Rollback when the broker stored the half message
	// without flushing it in time: the local transaction is then not run).
	State TxState
}

// Errors of transactions.
var (
	// ErrNotTransactional: SendInTransaction on a producer built without
	// WithTransactionListener.
	ErrNotTransactional = errors.New("producer: no transaction listener")
	// ErrEndTransaction: the half message was stored and the local transaction ran, but its
	// outcome could not be given to the broker. The broker will ask Check for it.
	ErrEndTransaction = errors.New("producer: end transaction failed")
)

// maxConcurrentChecks bounds the check-backs run at once; the broker asks again for those
// dropped past it.
const maxConcurrentChecks = 16

// WithTransactionListener makes the producer transactional: SendInTransaction runs l's
// local transactions, and the broker's check-backs for the producer group are answered by
// l.Check. A group's transactional producers should all use the same listener logic, since
// the broker asks any of them.
func WithTransactionListener(l TransactionListener) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("%w: nil transaction listener", ErrInvalidOption)
		}
		c.txn = l
		return nil
	}
}

// SendInTransaction sends msg as a half message, runs the local transaction with
// ExecuteLocal once the broker stored it, and tells the broker the outcome. Consumers see
// msg only if the outcome is Commit (now, or from a later Check).
//
// An error before the half message is stored means nothing was stored and ExecuteLocal did
// not run. An error wrapping ErrEndTransaction means the local transaction ran (State says
// how) but the broker did not get its outcome: it will ask Check.
func (p *Producer) SendInTransaction(ctx context.Context, msg *Message) (TxResult, error) {
	if err := p.checkRunning(); err != nil {
		return TxResult{}, err
	}
	if p.cfg.txn == nil {
		return TxResult{}, ErrNotTransactional
	}
	if msg != nil && msg.DelayLevel > 0 {
		return TxResult{}, fmt.Errorf("%w: transactional messages cannot be delayed (topic %q)", ErrInvalidMessage, msg.Topic)
	}
	pm, err := p.prepare(msg, true, protocol.PropertyTransactionPrepared, "true", protocol.PropertyProducerGroup, p.group)
	if err != nil {
		return TxResult{}, err
	}
	pm.sysFlag |= protocol.MsgTransactionPrepared
	res, err := p.send(ctx, pm)
	if err != nil {
		return TxResult{}, fmt.Errorf("send half message: %w", err)
	}
	res.TransactionID = pm.uniq
	out := TxResult{SendResult: res, State: TxRollback}
	if res.Status == SendOK {
		out.State = p.cfg.txn.ExecuteLocal(ctx, msg)
	}
	if err := p.endTransaction(ctx, res, out.State); err != nil {
		return out, err
	}
	return out, nil
}

// endTransaction tells the broker that stored the half message of res its outcome.
func (p *Producer) endTransaction(ctx context.Context, res SendResult, state TxState) error {
	_, clOffset, err := protocol.ParseOffsetMsgID(res.OffsetMsgID)
	if err != nil {
		return fmt.Errorf("%w: the broker's message id %q: %w", ErrEndTransaction, res.OffsetMsgID, err)
	}
	addr, err := p.cl.FindBrokerAddr(ctx, res.Queue.BrokerName, res.Queue.Topic)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrEndTransaction, err)
	}
	h := &protocol.EndTransactionRequestHeader{
		ProducerGroup:        p.group,
		TranStateTableOffset: res.QueueOffset,
		CommitLogOffset:      clOffset,
		CommitOrRollback:     state.wire(),
		MsgID:                res.MsgID,
		TransactionID:        res.TransactionID,
		BrokerName:           res.Queue.BrokerName,
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.sendTimeout)
	defer cancel()
	if _, err := p.cl.InvokeOK(ctx, addr, protocol.NewRequestWith(protocol.EndTransaction, h, nil)); err != nil {
		return fmt.Errorf("%w: %s of %s at %s: %w", ErrEndTransaction, state, res.MsgID, addr, err)
	}
	return nil
}

// txnChecker answers check-backs for a producer; the client core calls it.
type txnChecker struct{ p *Producer }

var _ clientcore.TransactionChecker = txnChecker{}

// CheckTransaction runs the listener's Check on a goroutine of its own and sends the
// outcome, oneway (nobody waits for it; the broker asks again if it is lost).
func (c txnChecker) CheckTransaction(brokerAddr string, h *protocol.CheckTransactionStateRequestHeader, msg *MessageExt) {
	p := c.p
	select {
	case p.checkSlots <- struct{}{}:
	default:
		p.log.Warn("transaction check-back dropped: too many running", "halfOffset", h.TranStateTableOffset, "running", cap(p.checkSlots))
		return
	}
	p.mu.RLock()
	if p.state != stateRunning {
		p.mu.RUnlock()
		<-p.checkSlots
		return
	}
	p.checks.Add(1)
	p.mu.RUnlock()
	go func() {
		defer p.checks.Done()
		defer func() { <-p.checkSlots }()
		state := p.cfg.txn.Check(p.checkCtx, msg)
		if state == TxUnknown {
			return // the broker asks again
		}
		eh := &protocol.EndTransactionRequestHeader{
			ProducerGroup:        p.group,
			TranStateTableOffset: h.TranStateTableOffset,
			CommitLogOffset:      h.CommitLogOffset,
			CommitOrRollback:     state.wire(),
			FromTransactionCheck: true,
			MsgID:                msg.Properties[protocol.PropertyUniqueKey],
			TransactionID:        h.TransactionID,
		}
		ctx, cancel := context.WithTimeout(p.checkCtx, p.cfg.sendTimeout)
		defer cancel()
		if err := p.cl.InvokeOneway(ctx, brokerAddr, protocol.NewRequestWith(protocol.EndTransaction, eh, nil)); err != nil {
			p.log.Warn("answer to a transaction check-back failed", "broker", brokerAddr, "halfOffset", h.TranStateTableOffset, "state", state.String(), "err", err)
		}
	}()
}

// stopChecks stops answering check-backs and waits, within ctx, for those running.
func (p *Producer) stopChecks(ctx context.Context) error {
	if p.cfg.txn == nil {
		return nil
	}
	p.cl.SetTransactionChecker(p.group, nil)
	p.checkCancel()
	done := make(chan struct{})
	go func() {
		p.checks.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("transaction checks still running: %w", ctx.Err())
	}
}
