package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/protocol"
)

// Transactions (RocketMQ's two-phase send).
//
// A half message is stored in protocol.TransactionHalfTopic, queue 0, with its real topic and
// queue in REAL_TOPIC / REAL_QID and its transaction bits cleared: no consume queue a consumer
// reads ever holds it. END_TRANSACTION commits it (it is stored again, in its real topic) or
// rolls it back; either way an op message in protocol.TransactionOpTopic (tag "d", body the
// half queue offset) records that it is done. The op topic is the durable record: New
// rebuilds the set of pending half messages from the two queues, so a restarted broker still
// checks what was pending and never commits a resolved message again.
//
// Each check-back also appends an op message (tag "c", same body), so that the number of
// checks a half message had survives a restart and TransactionCheckMax holds across restarts.
//
// # Notes
//
//   - A commit stores the real message before its op message. A crash between the two leaves
//     the half message pending: the producer is asked again and a commit stores a second
//     copy. The other order could lose a committed message, which is worse.
//   - The pending set lives in memory, bounded by what producers leave unresolved for at most
//     TransactionCheckMax check intervals. Rebuilding it reads both queues from their start:
//     their size is bounded by the commit log's retention.

// Op message tags.
const (
	txnOpDone  = protocol.TransactionOpTag // resolved: committed, rolled back or discarded
	txnOpCheck = "c"                       // one check-back sent (or attempted)
)

// txnOutcomeProperty says, on an op message, how the half message was resolved.
const txnOutcomeProperty = "TXN_OUTCOME"

// Errors of END_TRANSACTION. Their text is the response's remark.
var (
	errTxnUnknown  = errors.New("no half message at that offset")
	errTxnResolved = errors.New("the transaction was already resolved")
	errTxnBusy     = errors.New("the transaction is being resolved by another request")
)

// halfMessage is a pending half message.
type halfMessage struct {
	queueOffset     int64 // in the half topic's queue 0
	commitLogOffset int64
	group           string    // PGROUP
	firstCheck      time.Time // store time + TransactionTimeout (or the message's immunity)
	checks          int
}

// txnTable holds the pending half messages. A half message being resolved is moved to busy,
// so that two requests (or a request and the check service) never resolve it twice. Its lock
// is a leaf: nothing is called while it is held.
type txnTable struct {
	mu      sync.Mutex
	pending map[int64]*halfMessage
	busy    map[int64]*halfMessage
	// end is one past the highest half offset known: an offset below it that is neither
	// pending nor busy was resolved. (The store's consume queue may not have it yet.)
	end int64
}

func newTxnTable() *txnTable {
	return &txnTable{pending: map[int64]*halfMessage{}, busy: map[int64]*halfMessage{}}
}

func (t *txnTable) add(h *halfMessage) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pending[h.queueOffset] = h
	t.end = max(t.end, h.queueOffset+1)
}

// seen records that the half queue holds offsets below end.
func (t *txnTable) seen(end int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.end = max(t.end, end)
}

// claim takes the pending half message at offset for resolution.
func (t *txnTable) claim(offset int64) (*halfMessage, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if h := t.pending[offset]; h != nil {
		delete(t.pending, offset)
		t.busy[offset] = h
		return h, nil
	}
	if t.busy[offset] != nil {
		return nil, errTxnBusy
	}
	if offset >= 0 && offset < t.end {
		return nil, errTxnResolved
	}
	return nil, errTxnUnknown
}

// release returns a claimed half message to the pending set: its resolution failed.
func (t *txnTable) release(h *halfMessage) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.busy, h.queueOffset)
	t.pending[h.queueOffset] = h
}

// done forgets a claimed half message: it is resolved.
func (t *txnTable) done(h *halfMessage) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.busy, h.queueOffset)
}

// due claims the pending half messages whose first check time has passed, in offset order.
func (t *txnTable) due(now time.Time) []*halfMessage {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*halfMessage
	for off, h := range t.pending {
		if !now.Before(h.firstCheck) {
			delete(t.pending, off)
			t.busy[off] = h
			out = append(out, h)
		}
	}
	return out
}

func (t *txnTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending) + len(t.busy)
}

// isHalfRaw reports whether a send is a transactional half message: prepared by its sysFlag
// or by the TRAN_MSG property of its raw property block (RocketMQ's broker goes by the
// property).
func isHalfRaw[P ~string | ~[]byte](sysFlag int32, raw P) bool {
	if sysFlag&protocol.MsgTransactionMask == protocol.MsgTransactionPrepared {
		return true
	}
	v, _ := protocol.PropertyIn(raw, protocol.PropertyTransactionPrepared)
	return strings.EqualFold(string(v), "true")
}

// toHalf rewrites m, a half message bound for its topic and queue, into the half topic.
func toHalf(m *protocol.MessageExt, producerGroup string) {
	m.Properties[protocol.PropertyRealTopic] = m.Topic
	m.Properties[protocol.PropertyRealQueueID] = strconv.Itoa(int(m.QueueID))
	m.Properties[protocol.PropertyTransactionPrepared] = "true"
	if m.Properties[protocol.PropertyProducerGroup] == "" {
		m.Properties[protocol.PropertyProducerGroup] = producerGroup
	}
	// The store keeps prepared messages out: in the half topic the message is an ordinary
	// one, which no consumer reads. The commit sets the commit type.
	m.SysFlag &^= protocol.MsgTransactionMask
	m.Topic, m.QueueID = protocol.TransactionHalfTopic, 0
}

// putHalf stores a half message and adds it to the pending set.
func (b *Broker) putHalf(ctx context.Context, m *protocol.MessageExt, producerGroup string) (store.PutResult, error) {
	toHalf(m, producerGroup)
	res, err := b.store.Put(ctx, m)
	if err != nil && !storedUnflushed(err, res.MsgID != "") {
		return res, err
	}
	b.txn.add(b.newHalf(res.QueueOffset, res.CommitLogOffset, res.StoreTimestamp, m.Properties, 0))
	return res, err
}

func (b *Broker) newHalf(queueOffset, commitLogOffset, storeMillis int64, props map[string]string, checks int) *halfMessage {
	wait := b.cfg.TransactionTimeout
	if s, err := strconv.ParseInt(props[protocol.PropertyCheckImmunityTime], 10, 64); err == nil && s > 0 {
		wait = max(wait, time.Duration(s)*time.Second)
	}
	return &halfMessage{
		queueOffset:     queueOffset,
		commitLogOffset: commitLogOffset,
		group:           props[protocol.PropertyProducerGroup],
		firstCheck:      time.UnixMilli(storeMillis).Add(wait),
		checks:          checks,
	}
}

// loadTransactions rebuilds the pending set from the half and op queues.
func (b *Broker) loadTransactions(ctx context.Context) error {
	done := map[int64]bool{}
	checks := map[int64]int{}
	err := b.scanQueue(ctx, protocol.TransactionOpTopic, func(m *protocol.MessageExt) {
		off, err := strconv.ParseInt(string(m.Body), 10, 64)
		if err != nil {
			b.log.Warn("transaction op message with a bad body skipped", "offset", m.QueueOffset, "body", string(m.Body))
			return
		}
		switch m.Tags() {
		case txnOpDone:
			done[off] = true
		case txnOpCheck:
			checks[off]++
		}
	})
	if err != nil {
		return err
	}
	n := 0
	b.txn.seen(b.store.MaxOffset(protocol.TransactionHalfTopic, 0))
	err = b.scanQueue(ctx, protocol.TransactionHalfTopic, func(m *protocol.MessageExt) {
		if !done[m.QueueOffset] {
			b.txn.add(b.newHalf(m.QueueOffset, m.CommitLogOffset, m.StoreTimestamp, m.Properties, checks[m.QueueOffset]))
			n++
		}
	})
	if err != nil {
		return err
	}
	if n > 0 {
		b.log.Info("pending transactions restored", "halfMessages", n)
	}
	return nil
}

// scanQueue calls fn for every message of queue 0 of topic, in order.
func (b *Broker) scanQueue(ctx context.Context, topic string, fn func(*protocol.MessageExt)) error {
	offset := b.store.MinOffset(topic, 0)
	for offset < b.store.MaxOffset(topic, 0) {
		res, err := b.store.GetMessage(ctx, topic, 0, offset, 32, 1<<20, nil)
		if err != nil {
			return fmt.Errorf("read %s at %d: %w", topic, offset, err)
		}
		for _, raw := range res.Messages {
			m, _, err := protocol.DecodeStored(raw)
			if err != nil {
				b.log.Error("corrupt transaction message skipped", "topic", topic, "err", err)
				continue
			}
			fn(m)
		}
		next := res.NextBeginOffset
		res.Release()
		if next <= offset {
			break
		}
		offset = next
	}
	return nil
}

// putTxnOp appends an op message about the half message at halfOffset.
func (b *Broker) putTxnOp(ctx context.Context, tag string, halfOffset int64, outcome string) error {
	props := map[string]string{protocol.PropertyTags: tag}
	if outcome != "" {
		props[txnOutcomeProperty] = outcome
	}
	m := &protocol.MessageExt{
		Message:       protocol.Message{Topic: protocol.TransactionOpTopic, Properties: props, Body: []byte(strconv.FormatInt(halfOffset, 10))},
		BornTimestamp: time.Now().UnixMilli(),
		BornHost:      parseAddrPort(b.addr),
	}
	if _, err := b.store.Put(ctx, m); err != nil && !storedUnflushed(err, true) {
		return fmt.Errorf("write transaction op for half offset %d: %w", halfOffset, err)
	}
	return nil
}

// halfAt reads and decodes a half message.
func (b *Broker) halfAt(h *halfMessage) (*protocol.MessageExt, error) {
	raw, err := b.store.MessageAt(h.commitLogOffset)
	if err != nil {
		return nil, fmt.Errorf("half message at half offset %d: %w", h.queueOffset, err)
	}
	m, _, err := protocol.DecodeStored(raw)
	if err != nil {
		return nil, fmt.Errorf("half message at half offset %d: %w", h.queueOffset, err)
	}
	if m.Topic != protocol.TransactionHalfTopic || m.QueueOffset != h.queueOffset {
		return nil, fmt.Errorf("half message at half offset %d: commit-log offset %d holds a message of %s offset %d: %w",
			h.queueOffset, h.commitLogOffset, m.Topic, m.QueueOffset, store.ErrNotFound)
	}
	return m, nil
}

// processEndTransaction serves END_TRANSACTION: commit or roll back a half message.
func (b *Broker) processEndTransaction(ctx context.Context, req *protocol.Command) *protocol.Command {
	if err := b.writable(); err != nil {
		return replicationRefusal(req, err)
	}
	var h protocol.EndTransactionRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	var outcome string
	switch h.CommitOrRollback {
	case protocol.MsgTransactionCommit:
		outcome = "commit"
	case protocol.MsgTransactionRollback:
		outcome = "rollback"
	case protocol.MsgTransactionNone:
		// The producer does not know yet: the check service will ask it again.
		b.log.Debug("transaction outcome unknown", "group", h.ProducerGroup, "halfOffset", h.TranStateTableOffset, "fromCheck", h.FromTransactionCheck)
		return protocol.NewResponse(req, protocol.Success, "")
	default:
		return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("commitOrRollback %d is neither commit (%d), rollback (%d) nor unknown (0)", h.CommitOrRollback, protocol.MsgTransactionCommit, protocol.MsgTransactionRollback))
	}
	hm, err := b.txn.claim(h.TranStateTableOffset)
	if err != nil {
		b.log.Warn("end transaction refused", "group", h.ProducerGroup, "halfOffset", h.TranStateTableOffset, "outcome", outcome, "err", err)
		return errorResponse(req, protocol.SystemError, fmt.Errorf("%s of half offset %d: %w", outcome, h.TranStateTableOffset, err))
	}
	if hm.commitLogOffset != h.CommitLogOffset || hm.group != h.ProducerGroup {
		b.txn.release(hm)
		return errorResponse(req, protocol.SystemError, fmt.Errorf("%s of half offset %d: the request names commit-log offset %d and producer group %q, the half message has %d and %q",
			outcome, h.TranStateTableOffset, h.CommitLogOffset, h.ProducerGroup, hm.commitLogOffset, hm.group))
	}
	if h.CommitOrRollback == protocol.MsgTransactionCommit {
		if resp := b.commitHalf(ctx, req, hm); resp != nil {
			b.txn.release(hm)
			return resp
		}
	}
	b.resolved(ctx, hm, outcome)
	return protocol.NewResponse(req, protocol.Success, "")
}

// resolved records a claimed half message as done.
func (b *Broker) resolved(ctx context.Context, hm *halfMessage, outcome string) {
	if err := b.putTxnOp(ctx, txnOpDone, hm.queueOffset, outcome); err != nil {
		// It stays resolved in memory; after a restart it would be checked again.
		b.log.Error("transaction resolved but its op record was not written", "halfOffset", hm.queueOffset, "outcome", outcome, "err", err)
	}
	b.txn.done(hm)
	b.log.Debug("transaction resolved", "group", hm.group, "halfOffset", hm.queueOffset, "outcome", outcome)
}

// commitHalf stores a half message in its real topic and queue. It returns an error response,
// or nil when the message is stored.
func (b *Broker) commitHalf(ctx context.Context, req *protocol.Command, hm *halfMessage) *protocol.Command {
	m, err := b.halfAt(hm)
	if err != nil {
		return errorResponse(req, protocol.SystemError, err)
	}
	props := m.Properties
	real := props[protocol.PropertyRealTopic]
	qid, _ := strconv.Atoi(props[protocol.PropertyRealQueueID])
	delete(props, protocol.PropertyRealTopic)
	delete(props, protocol.PropertyRealQueueID)
	delete(props, protocol.PropertyTransactionPrepared)
	tc, ok := b.topics.get(real)
	if !ok || tc.WriteQueueNums <= 0 {
		return errorResponse(req, protocol.TopicNotExist, fmt.Errorf("commit of half offset %d: topic %q does not exist any more, or has no write queue", hm.queueOffset, real))
	}
	if qid < 0 || qid >= tc.WriteQueueNums {
		qid = ((qid % tc.WriteQueueNums) + tc.WriteQueueNums) % tc.WriteQueueNums
	}
	out := &protocol.MessageExt{
		Message:                   protocol.Message{Topic: real, Flag: m.Flag, Properties: props, Body: m.Body},
		QueueID:                   int32(qid),
		SysFlag:                   m.SysFlag&^protocol.MsgTransactionMask | protocol.MsgTransactionCommit,
		BornTimestamp:             m.BornTimestamp,
		BornHost:                  m.BornHost,
		ReconsumeTimes:            m.ReconsumeTimes,
		PreparedTransactionOffset: hm.commitLogOffset,
	}
	if lvl, _ := strconv.Atoi(props[protocol.PropertyDelayLevel]); lvl > 0 {
		b.delayed(out, lvl)
	}
	if _, err := b.store.Put(ctx, out); err != nil && !storedUnflushed(err, true) {
		return storeErrorResponse(req, fmt.Errorf("commit of half offset %d to %s queue %d: %w", hm.queueOffset, real, qid, err))
	}
	return nil
}

// checkTransactions sends a check-back for every due half message, or discards those that
// were checked TransactionCheckMax times.
func (b *Broker) checkTransactions(ctx context.Context, now time.Time) {
	if b.isReplica() {
		return // the master checks back; a replica's pending set is rebuilt when promoted
	}
	for _, hm := range b.txn.due(now) {
		if ctx.Err() != nil {
			b.txn.release(hm)
			continue
		}
		if hm.checks >= b.cfg.TransactionCheckMax {
			b.discardHalf(ctx, hm, fmt.Sprintf("no outcome after %d check-backs", hm.checks))
			continue
		}
		m, err := b.halfAt(hm)
		if err != nil {
			// Retention deleted it, or the log is damaged: it can never be committed.
			b.discardHalf(ctx, hm, err.Error())
			continue
		}
		if err := b.putTxnOp(ctx, txnOpCheck, hm.queueOffset, ""); err != nil {
			b.log.Error("transaction check-back not recorded", "halfOffset", hm.queueOffset, "err", err)
			b.txn.release(hm)
			continue
		}
		hm.checks++
		checks := hm.checks
		// Released before the request goes out: the producer may answer at once.
		b.txn.release(hm)
		b.sendCheck(ctx, hm, m, checks)
	}
}

// discardHalf gives up on a half message: it is recorded as done, logged and reported.
func (b *Broker) discardHalf(ctx context.Context, hm *halfMessage, reason string) {
	topic, group := "", hm.group
	var qid int32
	if m, err := b.halfAt(hm); err == nil {
		topic = m.Properties[protocol.PropertyRealTopic]
		q, _ := strconv.Atoi(m.Properties[protocol.PropertyRealQueueID])
		qid = int32(q)
	}
	b.resolved(ctx, hm, "discard")
	b.log.Warn("transaction discarded", "group", group, "topic", topic, "halfOffset", hm.queueOffset, "checks", hm.checks, "reason", reason)
	b.events.emit(Event{Type: TransactionDiscarded, Topic: topic, QueueID: qid, Group: group, Offset: hm.queueOffset, Reason: reason})
}

// sendCheck sends CHECK_TRANSACTION_STATE, oneway, to one live producer of the half message's
// group. Without one the check counts all the same (as in RocketMQ): a group that never
// comes back has its half messages discarded.
// hm is no longer claimed: only its immutable fields are read.
func (b *Broker) sendCheck(ctx context.Context, hm *halfMessage, m *protocol.MessageExt, checks int) {
	conns := b.producers.conns(hm.group)
	if len(conns) == 0 {
		if b.checkOutside(ctx, hm, m, checks) {
			b.log.Debug("transaction checked back outside remoting", "group", hm.group, "halfOffset", hm.queueOffset, "checks", checks)
			return
		}
		b.log.Debug("transaction check-back: no live producer in the group", "group", hm.group, "halfOffset", hm.queueOffset, "checks", checks)
		return
	}
	offsetMsgID := protocol.OffsetMsgID(m.StoreHost, m.CommitLogOffset)
	m.Topic = m.Properties[protocol.PropertyRealTopic]
	q, _ := strconv.Atoi(m.Properties[protocol.PropertyRealQueueID])
	m.QueueID = int32(q)
	m.Properties[protocol.PropertyTransactionCheckTimes] = strconv.Itoa(checks)
	body, err := protocol.AppendStored(nil, m)
	if err != nil {
		b.log.Error("transaction check-back: encode the half message", "halfOffset", hm.queueOffset, "err", err)
		return
	}
	uniq := m.Properties[protocol.PropertyUniqueKey]
	h := &protocol.CheckTransactionStateRequestHeader{
		TranStateTableOffset: hm.queueOffset,
		CommitLogOffset:      hm.commitLogOffset,
		MsgID:                uniq,
		TransactionID:        cmp.Or(m.Properties[protocol.PropertyTransactionID], uniq),
		OffsetMsgID:          offsetMsgID,
	}
	c := conns[0] // the most recently seen
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := c.InvokeOneway(cctx, protocol.NewRequestWith(protocol.CheckTransactionState, h, body)); err != nil {
		b.log.Warn("transaction check-back failed", "group", hm.group, "halfOffset", hm.queueOffset, "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	b.log.Debug("transaction checked back", "group", hm.group, "halfOffset", hm.queueOffset, "checks", checks, "remote", c.RemoteAddr().String())
}

// PendingTransactions returns the number of half messages without an outcome.
func (b *Broker) PendingTransactions() int { return b.txn.len() }
