package broker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// ProduceRequest is one message from a producer that does not speak remoting (the gRPC
// endpoint of RocketMQ 5 clients): what SEND_MESSAGE carries in its header, as plain fields.
type ProduceRequest struct {
	// Message is the message, its properties as a producer sets them (TAGS, KEYS,
	// UNIQ_KEY, user properties). Produce adds the broker's own.
	Message protocol.Message
	// QueueID is the write queue; negative picks one at random.
	QueueID int32
	// ProducerGroup names the group a transactional message's check-back goes to.
	ProducerGroup string
	// BornTimestamp (Unix milliseconds) and BornHost are the producer's; zero means now and
	// the broker's own address.
	BornTimestamp int64
	BornHost      netip.AddrPort
	// DelayLevel > 0 delays the message by that level of Config.DelayLevels.
	DelayLevel int
	// Half stores a transactional half message, which EndTransaction commits or rolls back.
	Half bool
}

// ProduceResult is where Produce stored a message. For a half message, HalfOffset and
// CommitLogOffset name it for EndTransaction.
type ProduceResult struct {
	SendResult
	HalfOffset, CommitLogOffset int64
}

// Produce stores one message in an existing, writable topic through the send path a remoting
// producer's message takes: delayed into the schedule topic by DelayLevel, or a half message
// into the half topic. Topics are never created here (RocketMQ 5 clients do not create
// them). It fails with ErrNotFound for an unknown topic or queue, ErrReserved for one of the
// broker's own or a topic that is not writable, ErrBadMessage for an empty or oversized body.
// In a replica set it obeys the set as a remoting send does: ErrNotMaster or
// ErrNotEnoughInSync with nothing stored, and in sync mode it returns once enough members
// hold the message, or with its result and ErrNotReplicated.
func (b *Broker) Produce(ctx context.Context, r ProduceRequest) (ProduceResult, error) {
	m := r.Message
	tc, ok := b.topics.get(m.Topic)
	if !ok {
		return ProduceResult{}, fmt.Errorf("send to %q: %w", m.Topic, ErrNotFound)
	}
	if isSystemTopic(m.Topic) || strings.HasPrefix(m.Topic, RetryTopicPrefix) || strings.HasPrefix(m.Topic, DLQTopicPrefix) {
		return ProduceResult{}, fmt.Errorf("send to %q: %w", m.Topic, ErrReserved)
	}
	if !tc.Writable() {
		return ProduceResult{}, fmt.Errorf("send to %q: not writable (perm %d): %w", m.Topic, tc.Perm, ErrReserved)
	}
	if err := b.writable(); err != nil {
		return ProduceResult{}, fmt.Errorf("send to %q: %w", m.Topic, err)
	}
	if len(m.Body) == 0 {
		return ProduceResult{}, fmt.Errorf("send to %q: the body is empty: %w", m.Topic, ErrBadMessage)
	}
	if len(m.Body) > b.cfg.MaxMessageSize {
		return ProduceResult{}, fmt.Errorf("send to %q: a body of %d bytes exceeds the %d-byte limit: %w", m.Topic, len(m.Body), b.cfg.MaxMessageSize, ErrBadMessage)
	}
	if err := protocol.CheckProperties(protocol.EncodeProperties(m.Properties)); err != nil {
		return ProduceResult{}, fmt.Errorf("send to %q: properties: %v: %w", m.Topic, err, ErrBadMessage)
	}
	queueID := r.QueueID
	if queueID < 0 {
		queueID = rand.Int32N(int32(tc.WriteQueueNums))
	} else if int(queueID) >= tc.WriteQueueNums {
		return ProduceResult{}, fmt.Errorf("send to %q: queue %d (%d write queues): %w", m.Topic, queueID, tc.WriteQueueNums, ErrNotFound)
	}
	props := make(map[string]string, len(m.Properties)+4)
	for k, v := range m.Properties {
		props[k] = v
	}
	props = b.stampStored(nil, r.ProducerGroup, props)
	born, host := r.BornTimestamp, r.BornHost
	if born == 0 {
		born = time.Now().UnixMilli()
	}
	if !host.IsValid() {
		host = b.store.StoreHost()
	}
	ext := protocol.MessageExt{
		Message:       protocol.Message{Topic: m.Topic, Flag: m.Flag, Body: m.Body, Properties: props},
		QueueID:       queueID,
		BornTimestamp: born,
		BornHost:      host,
	}
	if r.Half {
		return b.produceHalf(ctx, &ext, r)
	}
	if r.DelayLevel > 0 {
		props[protocol.PropertyDelayLevel] = strconv.Itoa(r.DelayLevel)
		b.delayed(&ext, r.DelayLevel)
	}
	res, err := b.store.Put(ctx, &ext)
	if err != nil && !storedUnflushed(err, res.Size > 0) {
		return ProduceResult{}, fmt.Errorf("send to %q: %w", m.Topic, err)
	}
	if o := b.cfg.Observer; o != nil {
		o.MessagesIn(m.Topic, 1, len(m.Body))
	}
	return ProduceResult{SendResult: SendResult{
		MsgID: res.MsgID, UniqKey: props[protocol.PropertyUniqueKey], QueueID: queueID, QueueOffset: res.QueueOffset,
		StoreTime: time.UnixMilli(res.StoreTimestamp).UTC(),
	}, CommitLogOffset: res.CommitLogOffset}, b.replicated(ctx, m.Topic, res.CommitLogOffset+int64(res.Size))
}

func (b *Broker) produceHalf(ctx context.Context, ext *protocol.MessageExt, r ProduceRequest) (ProduceResult, error) {
	if r.ProducerGroup == "" {
		return ProduceResult{}, fmt.Errorf("send to %q: a transactional message needs a producer group: %w", ext.Topic, ErrBadMessage)
	}
	if r.DelayLevel > 0 {
		// Delivered with its delay once committed (commitHalf reads DELAY).
		ext.Properties[protocol.PropertyDelayLevel] = strconv.Itoa(r.DelayLevel)
	}
	topic, queueID := ext.Topic, ext.QueueID
	res, err := b.putHalf(ctx, ext, r.ProducerGroup)
	if err != nil && !storedUnflushed(err, res.MsgID != "") {
		return ProduceResult{}, fmt.Errorf("send half message to %q: %w", topic, err)
	}
	return ProduceResult{SendResult: SendResult{
		MsgID: res.MsgID, UniqKey: ext.Properties[protocol.PropertyUniqueKey], QueueID: queueID, QueueOffset: res.QueueOffset,
		StoreTime: time.UnixMilli(res.StoreTimestamp).UTC(),
	}, HalfOffset: res.QueueOffset, CommitLogOffset: res.CommitLogOffset}, b.replicated(ctx, topic, res.CommitLogOffset+int64(res.Size))
}

// ErrTransaction is returned by EndTransaction for a half message it cannot resolve: none
// at that offset, already resolved, being resolved by another request, or one whose
// commit-log offset or producer group differ from the request's.
var ErrTransaction = errors.New("transaction cannot be resolved")

// Transaction outcomes of EndTransactionRequest.
const (
	TransactionUnknown  = protocol.MsgTransactionNone
	TransactionCommit   = protocol.MsgTransactionCommit
	TransactionRollback = protocol.MsgTransactionRollback
)

// EndTransactionRequest resolves the half message that Produce stored at HalfOffset.
type EndTransactionRequest struct {
	ProducerGroup               string
	HalfOffset, CommitLogOffset int64
	// Outcome is TransactionCommit, TransactionRollback or TransactionUnknown (checked
	// back again later).
	Outcome   int32
	FromCheck bool
}

// EndTransaction commits or rolls back a half message as END_TRANSACTION does (the same
// code serves both). It fails with ErrTransaction when the half message cannot be resolved
// and ErrNotFound when a commit's topic is gone.
func (b *Broker) EndTransaction(ctx context.Context, r EndTransactionRequest) error {
	h := &protocol.EndTransactionRequestHeader{
		ProducerGroup:        r.ProducerGroup,
		TranStateTableOffset: r.HalfOffset,
		CommitLogOffset:      r.CommitLogOffset,
		CommitOrRollback:     r.Outcome,
		FromTransactionCheck: r.FromCheck,
	}
	resp := b.processEndTransaction(ctx, protocol.NewRequestWith(protocol.EndTransaction, h, nil))
	switch protocol.ResponseCode(resp.Code) {
	case protocol.Success:
		return nil
	case protocol.TopicNotExist:
		return fmt.Errorf("end transaction at half offset %d: %s: %w", r.HalfOffset, resp.Remark, ErrNotFound)
	case protocol.InvalidParameter:
		return fmt.Errorf("end transaction at half offset %d: %s: %w", r.HalfOffset, resp.Remark, ErrBadMessage)
	case protocol.SystemError:
		if strings.Contains(resp.Remark, "half offset") {
			return fmt.Errorf("end transaction: %s: %w", resp.Remark, ErrTransaction)
		}
	}
	return fmt.Errorf("end transaction at half offset %d: code %d: %s", r.HalfOffset, resp.Code, resp.Remark)
}

// TransactionCheck is a check-back of a half message for a producer that is not a
// remoting connection: the half message as its producer sent it (its real topic and queue)
// and what EndTransaction needs to resolve it.
type TransactionCheck struct {
	ProducerGroup               string
	Message                     *protocol.MessageExt
	HalfOffset, CommitLogOffset int64
	Checks                      int
}

// SetTransactionChecker installs the check-back path for producers outside remoting (the
// gRPC endpoint's Telemetry streams). A check-back whose group has no live remoting
// producer is offered to fn, which reports whether it reached a producer. nil removes it.
func (b *Broker) SetTransactionChecker(fn func(context.Context, TransactionCheck) bool) {
	if fn == nil {
		b.txnChecker.Store(nil)
		return
	}
	b.txnChecker.Store(&fn)
}

// checkOutside offers a check-back to the installed checker; it reports whether one took it.
func (b *Broker) checkOutside(ctx context.Context, hm *halfMessage, m *protocol.MessageExt, checks int) bool {
	fn := b.txnChecker.Load()
	if fn == nil {
		return false
	}
	// The producer sees the message it sent: its real topic and queue, not the half topic's.
	out := *m
	out.Properties = make(map[string]string, len(m.Properties))
	for k, v := range m.Properties {
		out.Properties[k] = v
	}
	out.Topic = m.Properties[protocol.PropertyRealTopic]
	q, _ := strconv.Atoi(m.Properties[protocol.PropertyRealQueueID])
	out.QueueID = int32(q)
	out.Properties[protocol.PropertyTransactionCheckTimes] = strconv.Itoa(checks)
	return (*fn)(ctx, TransactionCheck{ProducerGroup: hm.group, Message: &out, HalfOffset: hm.queueOffset, CommitLogOffset: hm.commitLogOffset, Checks: checks})
}

// MaxMessageSize is the largest message body the broker accepts (Config.MaxMessageSize).
func (b *Broker) MaxMessageSize() int { return b.cfg.MaxMessageSize }

// DelayLevels are the delays of levels 1, 2, … (Config.DelayLevels), shortest first.
func (b *Broker) DelayLevels() []time.Duration { return append([]time.Duration(nil), b.delays...) }

// ExternalMember reports a consumer that is a member of group outside remoting (a gRPC
// client's Telemetry session) as a MemberJoined or MemberLeft event, so that subscribers
// of the broker's events see those consumers come and go too. reason is a leave's.
func (b *Broker) ExternalMember(group, clientID string, joined bool, reason string) {
	typ := MemberJoined
	if !joined {
		typ = MemberLeft
	}
	b.events.emit(Event{Type: typ, Group: group, ClientID: clientID, Reason: reason})
}
