package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// Pop over the remoting protocol: POP_MESSAGE, ACK_MESSAGE, BATCH_ACK_MESSAGE and
// CHANGE_MESSAGE_INVISIBLETIME over the broker's pop state (pop.go), the same groups and
// deliveries as the gRPC endpoint's. A remoting receipt is RocketMQ's extra info
// (protocol.ExtraInfo, each message's POP_CK property), which names a delivery by its queue,
// offset and pop time; the broker also takes one wherever it takes a receipt handle, and a
// receipt handle in an ACK_MESSAGE's extraInfo, so a message popped over one protocol may be
// acknowledged over the other (docs/pop.md, Remoting).

// isExtraInfo tells a remoting receipt from a receipt handle, which is base64url and has no
// space.
func isExtraInfo(h string) bool { return strings.IndexByte(h, ' ') >= 0 }

// popEntryOfExtraInfo is popEntryOf for a remoting receipt.
func (b *Broker) popEntryOfExtraInfo(group, topic, info string) (*popQueue, *popEntry, error) {
	x, err := protocol.ParseExtraInfo(info)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalidReceiptHandle, err)
	}
	return b.popEntryAt(group, topic, x)
}

// popEntryAt is popEntryOf for a parsed remoting receipt.
func (b *Broker) popEntryAt(group, topic string, x protocol.ExtraInfo) (*popQueue, *popEntry, error) {
	if x.QueueOffset < 0 {
		return nil, nil, fmt.Errorf("%w: extra info %q names no queue offset", ErrInvalidReceiptHandle, x.String())
	}
	if x.Retry != "0" {
		return nil, nil, fmt.Errorf("%w: extra info %q names a pop retry topic, which this broker does not keep", ErrInvalidReceiptHandle, x.String())
	}
	q := b.pop.queue(popKey{group, topic, x.QueueID})
	if q == nil {
		return nil, nil, fmt.Errorf("%w: no pop progress of group %q in %s/%d", ErrInvalidReceiptHandle, group, topic, x.QueueID)
	}
	q.mu.Lock()
	e := q.entries[x.QueueOffset]
	switch {
	case e == nil:
		q.mu.Unlock()
		return nil, nil, fmt.Errorf("%w: %s/%d offset %d is already acknowledged or dead-lettered", ErrInvalidReceiptHandle, topic, x.QueueID, x.QueueOffset)
	case x.PopTime < e.popTime:
		q.mu.Unlock()
		return nil, nil, fmt.Errorf("%w: %s/%d offset %d was handed out again since", ErrReceiptHandleExpired, topic, x.QueueID, x.QueueOffset)
	case x.PopTime > e.popTime || x.PopTime+x.InvisibleTime != e.deadline:
		q.mu.Unlock()
		return nil, nil, fmt.Errorf("%w: %s/%d offset %d was not handed out at %d for %d ms", ErrInvalidReceiptHandle, topic, x.QueueID, x.QueueOffset, x.PopTime, x.InvisibleTime)
	case !e.inflight || e.deadline <= msNow(b.pop.now()):
		q.mu.Unlock()
		return nil, nil, fmt.Errorf("%w: %s/%d offset %d was invisible until %s", ErrReceiptHandleExpired, topic, x.QueueID, x.QueueOffset, time.UnixMilli(e.deadline).UTC().Format(time.RFC3339Nano))
	}
	return q, e, nil
}

// renewedExtraInfo is the receipt info with e's new pop time and invisibility d.
func renewedExtraInfo(info string, e *popEntry, d time.Duration) string {
	x, err := protocol.ParseExtraInfo(info)
	if err != nil {
		return info // popEntryOf parsed it already
	}
	x.PopTime, x.InvisibleTime = e.popTime, d.Milliseconds()
	return x.String()
}

// popReviveQid is the revive queue an extra info carries: RocketMQ's clients read 999 as an
// ordered pop's.
func popReviveQid(order bool) int32 {
	if order {
		return protocol.PopOrderReviveQueue
	}
	return 0
}

// popErrorResponse answers a pop request the broker refused.
func popErrorResponse(req *protocol.Command, err error, topicExists bool) *protocol.Command {
	switch {
	case errors.Is(err, ErrNotFound) && !topicExists:
		return errorResponse(req, protocol.TopicNotExist, err)
	case errors.Is(err, ErrNotFound):
		return errorResponse(req, protocol.SubscriptionGroupNotExist, err)
	case errors.Is(err, ErrBadFilter):
		return errorResponse(req, protocol.SubscriptionParseFailed, err)
	case errors.Is(err, ErrBadRequest):
		return errorResponse(req, protocol.InvalidParameter, err)
	case errors.Is(err, ErrInvalidReceiptHandle), errors.Is(err, ErrReceiptHandleExpired):
		return errorResponse(req, protocol.NoMessage, err)
	case errors.Is(err, ErrLimit):
		return errorResponse(req, protocol.SystemBusy, err)
	case errors.Is(err, ErrNotMaster):
		return errorResponse(req, protocol.ServiceNotAvailable, err)
	}
	return errorResponse(req, protocol.SystemError, err)
}

// popInline reports whether a POP_MESSAGE finds messages at once, so that it is served on
// the connection's read goroutine: a queue of the request with fresh messages and room in
// its window, or messages due again and no FIFO order holding them. A group's first
// receive of a queue, and one that would wait, go to a goroutine of their own.
func (b *Broker) popInline(req *protocol.Command) bool {
	group, topic := req.Ext2("consumerGroup", "topic")
	tc, ok := b.topics.get(topic)
	if !ok {
		return false
	}
	qid, err := strconv.ParseInt(req.Ext("queueId"), 10, 32)
	if err != nil {
		return false
	}
	first, n := int(qid), 1
	if qid < 0 {
		first, n = 0, tc.ReadQueueNums
	}
	if first >= tc.ReadQueueNums {
		return false
	}
	for i := first; i < first+n; i++ {
		q := b.pop.queue(popKey{group, topic, int32(i)})
		if q == nil {
			return false
		}
		q.mu.Lock()
		fresh := q.next < b.store.MaxOffset(topic, int32(i)) && q.next-q.start < popWindow
		due := len(q.visible) > 0 && !q.fifo
		q.mu.Unlock()
		if fresh || due {
			return true
		}
	}
	return false
}

// processPop serves POP_MESSAGE: up to maxMsgNums messages of any queue (queueId -1) or one,
// in one answer, each with its receipt in the POP_CK property.
func (b *Broker) processPop(ctx context.Context, req *protocol.Command) *protocol.Command {
	var h protocol.PopMessageRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	if err := ValidateGroup(h.ConsumerGroup); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	if _, ok := b.topics.get(h.Topic); !ok {
		return errorResponse(req, protocol.TopicNotExist, fmt.Errorf("topic %q does not exist", h.Topic))
	}
	if h.MaxMsgNums <= 0 || h.MaxMsgNums > PopMaxMessages {
		return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("maxMsgNums %d is outside 1..%d", h.MaxMsgNums, PopMaxMessages))
	}
	invisible := time.Duration(h.InvisibleTime) * time.Millisecond
	if invisible < PopMinInvisible || invisible > PopMaxInvisible {
		return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("invisibleTime %d ms is outside %d..%d", h.InvisibleTime, PopMinInvisible.Milliseconds(), PopMaxInvisible.Milliseconds()))
	}
	typ := h.ExpType
	if typ == "" {
		typ = protocol.ExpressionTag
	}
	wait := max(time.Duration(h.PollTime)*time.Millisecond, 0)
	if remoting.ServedInline(ctx) {
		// popInline saw messages; should another receive take them first, the answer
		// is empty at once and the client asks again.
		wait = 0
	}
	popped, err := b.Pop(ctx, PopRequest{
		Group: h.ConsumerGroup, Topic: h.Topic, QueueID: h.QueueID, MaxMessages: int(h.MaxMsgNums), Invisible: invisible,
		ExpressionType: typ, Expression: h.Exp, Wait: wait, Order: h.Order, NoHandles: true, RawProperties: true,
	})
	if err != nil && len(popped) == 0 {
		_, exists := b.topics.get(h.Topic)
		return popErrorResponse(req, err, exists)
	}
	rh := protocol.PopMessageResponseHeader{PopTime: msNow(b.pop.now()), InvisibleTime: h.InvisibleTime, ReviveQid: popReviveQid(h.Order)}
	if len(popped) == 0 {
		code := protocol.PullNotFound
		if wait > 0 {
			code = protocol.PollingTimeout
		}
		resp := protocol.NewResponse(req, code, "no new message")
		rh.EncodeTo(resp.ExtFields)
		return resp
	}
	body, err := b.popAnswerBody(&rh, popped, h.InvisibleTime)
	if err != nil {
		return errorResponse(req, protocol.SystemError, err)
	}
	resp := protocol.NewResponse(req, protocol.Success, "FOUND")
	rh.EncodeTo(resp.ExtFields)
	resp.Body = body
	remoting.WriteAnswerDirect(ctx) // the receiver waits for this batch: no hand-off to the flusher
	return resp
}

// popAnswerBody writes the popped messages (popped with RawProperties) in the stored layout,
// each with its POP_CK and 1ST_POP_TIME properties, and fills rh's per-queue infos and pop
// time.
func (b *Broker) popAnswerBody(rh *protocol.PopMessageResponseHeader, popped []PoppedMessage, invisible int64) ([]byte, error) {
	// The first offset handed out of each queue is its receipts' checkpoint offset: RocketMQ's
	// batch ack groups the receipts of one queue and pop time under it.
	type queueInfo struct {
		id      int32
		ck      int64
		offsets []int64
	}
	var qs []queueInfo
	size := 0
	for i := range popped {
		m := popped[i].Message
		size += m.StoredSize() + 96
		j := 0
		for j < len(qs) && qs[j].id != m.QueueID {
			j++
		}
		if j == len(qs) {
			qs = append(qs, queueInfo{id: m.QueueID, ck: m.QueueOffset})
		}
		qs[j].ck = min(qs[j].ck, m.QueueOffset)
		qs[j].offsets = append(qs[j].offsets, m.QueueOffset)
	}
	rh.PopTime = popped[0].PopTime
	var start, offs []byte
	for _, q := range qs {
		start = protocol.AppendStartOffsetInfo(start, q.id, q.ck)
		offs = protocol.AppendMsgOffsetInfo(offs, q.id, q.offsets)
	}
	rh.StartOffsetInfo, rh.MsgOffsetInfo = string(start), string(offs)
	body := make([]byte, 0, size)
	info := make([]byte, 0, 64)
	var props []byte
	for i := range popped {
		p := &popped[i]
		m := p.Message
		ck := m.QueueOffset
		for _, q := range qs {
			if q.id == m.QueueID {
				ck = q.ck
			}
		}
		x := protocol.ExtraInfo{CkQueueOffset: ck, PopTime: p.PopTime, InvisibleTime: invisible, ReviveQid: rh.ReviveQid,
			Retry: "0", BrokerName: b.cfg.BrokerName, QueueID: m.QueueID, QueueOffset: m.QueueOffset}
		info = x.Append(info[:0])
		orig := m.RawProperties
		props = protocol.AppendSetProperty(props[:0], orig, protocol.PropertyPopCK, string(info))
		if _, ok := protocol.PropertyIn(orig, protocol.PropertyFirstPopTime); !ok {
			first := p.FirstPopTime
			if first == 0 {
				first = p.PopTime
			}
			props = append(props, protocol.PropertyFirstPopTime...)
			props = append(props, protocol.NameValueSeparator)
			props = strconv.AppendInt(props, first, 10)
			props = append(props, protocol.PropertySeparator)
		}
		m.RawProperties = props
		var err error
		body, err = protocol.AppendStored(body, m)
		m.RawProperties = orig
		if err != nil {
			return nil, fmt.Errorf("pop: encode %s/%d offset %d: %w", m.Topic, m.QueueID, m.QueueOffset, err)
		}
	}
	return body, nil
}

// remotingReceipt is the receipt an ACK_MESSAGE or CHANGE_MESSAGE_INVISIBLETIME names: its
// extraInfo with the header's queue and offset, or a receipt handle given as extraInfo.
func remotingReceipt(extraInfo string, queueID int32, offset int64) (string, error) {
	if !isExtraInfo(extraInfo) {
		return extraInfo, nil // a receipt handle of a gRPC receive
	}
	x, err := protocol.ParseExtraInfo(extraInfo)
	if err != nil {
		return "", err
	}
	if x.QueueID != queueID || (x.QueueOffset >= 0 && x.QueueOffset != offset) {
		return "", fmt.Errorf("%w: %q names queue %d offset %d, the request queue %d offset %d", protocol.ErrBadExtraInfo, extraInfo, x.QueueID, x.QueueOffset, queueID, offset)
	}
	x.QueueOffset = offset
	return x.String(), nil
}

// Bounds of one BATCH_ACK_MESSAGE. A client merges the receipts of the messages it acks into
// one entry per queue and pop (at most PopMaxMessages offsets, within the queue's window of
// messages in flight), so these are far above what a client sends, and far below what
// would cost the broker memory or hold the pop state: each offset becomes a receipt.
const (
	maxBatchAckOffsets = 64 * PopMaxMessages
	maxBatchAckSpan    = 64 * popWindow // offsets from an entry's start its bit set may reach
)

// checkBatchAckSize refuses a batch ack naming more offsets than maxBatchAckOffsets, or an
// entry whose bit set reaches past maxBatchAckSpan, before any is expanded.
func checkBatchAckSize(acks []protocol.BatchAck) error {
	total := 0
	for i := range acks {
		a := &acks[i]
		if len(a.Bits)*8 > maxBatchAckSpan {
			return fmt.Errorf("batch ack entry %d (%s queue %d): a bit set of %d bytes reaches past %d offsets from its start %d",
				i, a.Topic, a.QueueID, len(a.Bits), maxBatchAckSpan, a.StartOffset)
		}
		total += a.Count()
	}
	if total > maxBatchAckOffsets {
		return fmt.Errorf("batch ack of %d offsets exceeds %d", total, maxBatchAckOffsets)
	}
	return nil
}

// requestReceipt checks the topic and queue of an ACK_MESSAGE or
// CHANGE_MESSAGE_INVISIBLETIME and makes the receipt its extra info and offset name; a
// refusal comes back as the answer.
func (b *Broker) requestReceipt(req *protocol.Command, topic string, queueID int32, extraInfo string, offset int64) (string, *protocol.Command) {
	if bad := b.checkPopTarget(req, topic, queueID); bad != nil {
		return "", bad
	}
	receipt, err := remotingReceipt(extraInfo, queueID, offset)
	if err != nil {
		return "", errorResponse(req, protocol.MessageIllegal, err)
	}
	return receipt, nil
}

// processAck serves ACK_MESSAGE.
func (b *Broker) processAck(ctx context.Context, req *protocol.Command) *protocol.Command {
	var h protocol.AckMessageRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	receipt, bad := b.requestReceipt(req, h.Topic, h.QueueID, h.ExtraInfo, h.Offset)
	if bad != nil {
		return bad
	}
	if err := b.PopAck(ctx, h.ConsumerGroup, h.Topic, receipt); err != nil {
		return popErrorResponse(req, err, true)
	}
	return protocol.NewResponse(req, protocol.Success, "")
}

// checkPopTarget answers TOPIC_NOT_EXIST for a missing topic and MESSAGE_ILLEGAL for a queue
// it has not, as RocketMQ's acknowledgements do.
func (b *Broker) checkPopTarget(req *protocol.Command, topic string, queueID int32) *protocol.Command {
	tc, ok := b.topics.get(topic)
	if !ok {
		return errorResponse(req, protocol.TopicNotExist, fmt.Errorf("topic %q does not exist", topic))
	}
	if queueID < 0 || int(queueID) >= tc.ReadQueueNums {
		return errorResponse(req, protocol.MessageIllegal, fmt.Errorf("queueId %d is illegal: topic %q has %d read queues", queueID, topic, tc.ReadQueueNums))
	}
	return nil
}

// processBatchAck serves BATCH_ACK_MESSAGE: every entry's offsets acknowledged in one pass
// per group and topic (PopAckBatch). It answers SUCCESS when all were acknowledged, else
// NO_MESSAGE with the count and the first failure (the others were acknowledged).
func (b *Broker) processBatchAck(ctx context.Context, req *protocol.Command) *protocol.Command {
	var body protocol.BatchAckMessageRequestBody
	if len(req.Body) > 0 {
		if err := json.Unmarshal(req.Body, &body); err != nil {
			return errorResponse(req, protocol.MessageIllegal, fmt.Errorf("batch ack body: %w", err))
		}
	}
	if len(body.Acks) == 0 {
		return errorResponse(req, protocol.NoMessage, errors.New("the batch ack holds no entry"))
	}
	if err := checkBatchAckSize(body.Acks); err != nil {
		return errorResponse(req, protocol.MessageIllegal, err)
	}
	failed, total := 0, 0
	var first error
	fail := func(n int, err error) {
		failed += n
		if first == nil {
			first = err
		}
	}
	// One PopAckBatch per run of entries of one group and topic: a client's batch is one.
	for i := 0; i < len(body.Acks); {
		a := &body.Acks[i]
		j := i
		var receipts []protocol.ExtraInfo
		for ; j < len(body.Acks) && body.Acks[j].ConsumerGroup == a.ConsumerGroup && body.Acks[j].Topic == a.Topic; j++ {
			e := &body.Acks[j]
			offs := e.Offsets()
			total += len(offs)
			if bad := b.checkPopTarget(req, e.Topic, e.QueueID); bad != nil {
				fail(len(offs), errors.New(bad.Remark))
				continue
			}
			x := protocol.ExtraInfo{CkQueueOffset: e.StartOffset, PopTime: e.PopTime, InvisibleTime: e.InvisibleTime, ReviveQid: e.ReviveQueueID,
				Retry: e.Retry, BrokerName: b.cfg.BrokerName, QueueID: e.QueueID}
			for _, o := range offs {
				x.QueueOffset = o
				receipts = append(receipts, x)
			}
		}
		if len(receipts) > 0 {
			if err := ctx.Err(); err != nil {
				fail(len(receipts), fmt.Errorf("pop ack: %w", err))
			} else {
				errs := b.popAckEach(a.Topic, make([]error, len(receipts)), func(k int) (*popQueue, *popEntry, error) {
					return b.popEntryAt(a.ConsumerGroup, a.Topic, receipts[k])
				})
				for k, err := range errs {
					if err != nil {
						fail(1, fmt.Errorf("%s: %w", receipts[k], err))
					}
				}
			}
		}
		i = j
	}
	if failed > 0 {
		return errorResponse(req, protocol.NoMessage, fmt.Errorf("%d of %d messages not acknowledged, the first: %w", failed, total, first))
	}
	return protocol.NewResponse(req, protocol.Success, "")
}

// processChangeInvisible serves CHANGE_MESSAGE_INVISIBLETIME: the answer's pop time,
// invisible time and revive queue make the new receipt.
func (b *Broker) processChangeInvisible(ctx context.Context, req *protocol.Command) *protocol.Command {
	var h protocol.ChangeInvisibleTimeRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	receipt, bad := b.requestReceipt(req, h.Topic, h.QueueID, h.ExtraInfo, h.Offset)
	if bad != nil {
		return bad
	}
	d := time.Duration(h.InvisibleTime) * time.Millisecond
	renewed, err := b.PopChangeInvisible(ctx, h.ConsumerGroup, h.Topic, receipt, d)
	if err != nil {
		return popErrorResponse(req, err, true)
	}
	rh := protocol.ChangeInvisibleTimeResponseHeader{InvisibleTime: h.InvisibleTime}
	if x, err := protocol.ParseExtraInfo(renewed); err == nil {
		rh.PopTime, rh.ReviveQid = x.PopTime, x.ReviveQid
	} else {
		// A receipt handle came in: the new handle goes back in the remark.
		rh.PopTime = msNow(b.pop.now())
		resp := protocol.NewResponse(req, protocol.Success, renewed)
		rh.EncodeTo(resp.ExtFields)
		return resp
	}
	resp := protocol.NewResponse(req, protocol.Success, "")
	rh.EncodeTo(resp.ExtFields)
	return resp
}
