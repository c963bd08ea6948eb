package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowd-io/flowd/broker/filter"
	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/protocol"
)

// PropertyShardingKey is the property RocketMQ 5 keeps a message's message group in
// (MessageConst.PROPERTY_SHARDING_KEY): a FIFO pop group hands out one message of each
// message group of a queue at a time.
const PropertyShardingKey = "__SHARDINGKEY"

// Bounds of a PopRequest.
const (
	PopMaxMessages  = 32
	PopMinInvisible = time.Second
	PopMaxInvisible = 12 * time.Hour
)

var (
	// ErrInvalidReceiptHandle: the handle is malformed, forged, issued for another group or
	// topic, or names a message already acknowledged or dead-lettered.
	ErrInvalidReceiptHandle = errors.New("invalid receipt handle")
	// ErrReceiptHandleExpired: the handle named a delivery whose invisibility passed, or one
	// superseded by a redelivery or a change of invisibility; the message was or will be
	// handed out again under a new handle.
	ErrReceiptHandleExpired = errors.New("receipt handle expired")
	// ErrBadFilter: a receive's filter expression does not compile (or names an expression
	// type this broker does not serve).
	ErrBadFilter = errors.New("bad filter expression")
	// ErrBadRequest: a pop request out of bounds (group, message count, invisible duration,
	// queue id).
	ErrBadRequest = errors.New("bad request")
)

// PopRequest asks for up to MaxMessages messages of Topic for Group.
type PopRequest struct {
	Group, Topic string
	// QueueID: a queue of the topic, or -1 for any queue (the broker picks, round robin from
	// a per-group cursor, skipping empty queues), as RocketMQ's proxy does.
	QueueID int32
	// MaxMessages: 1..PopMaxMessages; anything else is ErrBadRequest.
	MaxMessages int
	// Invisible: how long handed-out messages stay invisible, PopMinInvisible..PopMaxInvisible.
	Invisible time.Duration
	// ExpressionType ("TAG", "SQL92", "WASM"; empty means TAG) and Expression ("*" or "" =
	// all), compiled through the broker's filter registry.
	ExpressionType, Expression string
	// Wait: long-poll up to this long (capped by Config.MaxLongPoll) when nothing is
	// available (0 = answer at once); ctx cancellation ends the wait early with no messages
	// and no error.
	Wait time.Duration
	// ClientID of the receiver, shown as PopQueueStats.Receiver (optional).
	ClientID string
	// Order makes this receive hand out in order per message group, as for a group with
	// ConsumeOrderly (docs/pop.md, FIFO), and the messages it reads without a message group
	// in order per queue: the order flag of RocketMQ's POP_MESSAGE.
	Order bool
	// NoHandles leaves PoppedMessage.Handle empty: the caller names each delivery by its
	// queue, offset and PopTime (a remoting receipt, protocol.ExtraInfo), and saves the
	// handle's MAC.
	NoHandles bool
	// RawProperties hands each message out with its property block raw
	// (protocol.MessageExt.RawProperties) instead of decoded into Properties: for a caller
	// that writes the messages out again in the stored layout.
	RawProperties bool
}

// PoppedMessage is one handed-out message.
type PoppedMessage struct {
	// Message is a decoded copy; QueueId/QueueOffset set; its ReconsumeTimes = Attempt-1.
	Message *protocol.MessageExt
	// Handle is the receipt handle: opaque base64url ASCII (docs/pop.md).
	Handle string
	// Attempt is 1 on first delivery, +1 per redelivery.
	Attempt        int
	InvisibleUntil time.Time
	// PopTime is the hand-out's time in Unix ms, unique among the message's deliveries: with
	// the queue and offset it names the delivery, as a remoting receipt does (ExtraInfo).
	PopTime int64
	// FirstPopTime is the Unix ms of the message's first hand-out (RocketMQ's 1ST_POP_TIME).
	// After a restart it is the first hand-out the pop state kept: a snapshot keeps it, a
	// journal record of a redelivery does not, and then it is that redelivery's.
	FirstPopTime int64
}

// PopQueueStats is a pop group's progress in one queue.
type PopQueueStats struct {
	Topic   string
	QueueID int32
	// InFlight: handed out and neither acknowledged nor expired.
	InFlight int
	// Visible: read and not done, waiting to be handed out (expired, or held by FIFO).
	Visible int
	// Acked, DeadLettered and Redelivered count since the progress was made (persisted).
	Acked, DeadLettered, Redelivered uint64
	// ConsumedOffset: every message below it is acknowledged or dead-lettered.
	ConsumedOffset int64
	// NextOffset: the next offset read fresh; [ConsumedOffset, NextOffset) is the window.
	NextOffset int64
	// MaxOffset is the queue's end; MaxOffset-ConsumedOffset is the lag, unacknowledged
	// messages included.
	MaxOffset int64
	// Receiver is the ClientID of the last receive that got messages of the queue (since the
	// broker started); empty when none said.
	Receiver string
}

// popTable is the broker's pop state: the progress of every (group, topic, queue), the
// deadline heap, the parked receives and the journal.
type popTable struct {
	key   *handleKey
	epoch atomic.Uint64
	// skew is added to the wall clock: tests move pop time forward with it, exactly and
	// without sleeping.
	skew    atomic.Int64
	timers  popTimers
	waiters popWaiters
	jnl     *popJournal
	// expireMu serializes the passes of popExpireDue.
	expireMu sync.Mutex

	// mu is held shared by every operation and exclusively by the journal's compaction,
	// which snapshots all queues at one point of the journal.
	mu      sync.RWMutex
	qmu     sync.Mutex // guards queues and cursors
	queues  map[popKey]*popQueue
	cursors map[string]uint32 // group+"\x00"+topic → the next queue an any-queue receive tries

	redelivered, deadLettered, acked atomic.Uint64
}

func (t *popTable) now() time.Time { return time.Now().Add(time.Duration(t.skew.Load())) }

func (t *popTable) queue(key popKey) *popQueue {
	t.qmu.Lock()
	defer t.qmu.Unlock()
	return t.queues[key]
}

// queueOrCreate returns the queue's progress, making it from start() when absent.
func (t *popTable) queueOrCreate(key popKey, fifo bool, start func() int64) *popQueue {
	if q := t.queue(key); q != nil {
		return q
	}
	s := start()
	t.qmu.Lock()
	defer t.qmu.Unlock()
	if q := t.queues[key]; q != nil {
		return q
	}
	q := newPopQueue(key, s, fifo)
	q.jid = t.jnl.define(q)
	t.queues[key] = q
	return q
}

func (t *popTable) cursor(group, topic string, n int) int {
	t.qmu.Lock()
	defer t.qmu.Unlock()
	k := group + "\x00" + topic
	c := t.cursors[k]
	t.cursors[k] = c + 1
	return int(c % uint32(n))
}

// Pop hands out up to req.MaxMessages messages of req.Topic to req.Group, each invisible for
// req.Invisible, long-polling up to req.Wait when none is available (docs/pop.md). The group
// is created on first use, as a pull creates it; with Config.DisableAutoCreateGroups an
// unknown group is ErrNotFound.
func (b *Broker) Pop(ctx context.Context, req PopRequest) ([]PoppedMessage, error) {
	tc, f, err := b.popPrepare(ctx, &req)
	if err != nil {
		return nil, err
	}
	wait := min(req.Wait, b.cfg.MaxLongPoll)
	var deadline <-chan time.Time
	for {
		var ch chan struct{}
		if wait > 0 {
			// Register before reading: an arrival between the read and the wait wakes it.
			b.pop.waiters.n.Add(1)
			ch = b.pop.waiters.wait(tc.Name)
		}
		out, err := b.popOnce(ctx, tc, req, f)
		if o := b.cfg.Observer; o != nil && len(out) > 0 {
			size := 0
			for _, m := range out {
				size += int(m.Message.StoreSize)
			}
			o.MessagesOut(tc.Name, len(out), size)
		}
		if err != nil || len(out) > 0 || wait <= 0 {
			if wait > 0 {
				b.pop.waiters.n.Add(-1)
			}
			return out, err
		}
		if deadline == nil {
			tm := time.NewTimer(wait)
			defer tm.Stop()
			deadline = tm.C
		}
		select {
		case <-ch:
			b.pop.waiters.n.Add(-1)
		case <-deadline:
			b.pop.waiters.n.Add(-1)
			return nil, nil
		case <-ctx.Done():
			b.pop.waiters.n.Add(-1)
			return nil, nil
		case <-b.ctx.Done():
			b.pop.waiters.n.Add(-1)
			return nil, nil
		}
	}
}

// popPrepare validates req, creates its group on first use and compiles its filter.
func (b *Broker) popPrepare(ctx context.Context, req *PopRequest) (TopicConfig, *store.Filter, error) {
	if err := b.popServed("pop"); err != nil {
		return TopicConfig{}, nil, err
	}
	if isInternalGroup(req.Group) || req.Group == protocol.ReaderGroup {
		return TopicConfig{}, nil, fmt.Errorf("pop: group %q keeps no pop state: %w", req.Group, ErrBadRequest)
	}
	// A known group costs a map lookup; only new names go through the pattern.
	if _, known := b.groups.get(req.Group); !known {
		if err := ValidateGroup(req.Group); err != nil {
			return TopicConfig{}, nil, fmt.Errorf("pop: %w: %w", ErrBadRequest, err)
		}
	}
	if req.MaxMessages < 1 || req.MaxMessages > PopMaxMessages {
		return TopicConfig{}, nil, fmt.Errorf("pop: maxMessages %d outside 1..%d: %w", req.MaxMessages, PopMaxMessages, ErrBadRequest)
	}
	if req.Invisible < PopMinInvisible || req.Invisible > PopMaxInvisible {
		return TopicConfig{}, nil, fmt.Errorf("pop: invisible duration %v outside %v..%v: %w", req.Invisible, PopMinInvisible, PopMaxInvisible, ErrBadRequest)
	}
	tc, ok := b.topics.get(req.Topic)
	if !ok {
		return tc, nil, fmt.Errorf("pop: topic %q: %w", req.Topic, ErrNotFound)
	}
	if !tc.Readable() {
		return tc, nil, fmt.Errorf("pop: topic %q is not readable (perm %d): %w", req.Topic, tc.Perm, ErrBadRequest)
	}
	if req.QueueID < -1 || int(req.QueueID) >= tc.ReadQueueNums {
		return tc, nil, fmt.Errorf("pop: queue %d of topic %q (%d read queues): %w", req.QueueID, req.Topic, tc.ReadQueueNums, ErrBadRequest)
	}
	if err := b.popEnsureGroup(req.Group); err != nil {
		return tc, nil, err
	}
	f, err := b.cfg.Filters.Filter(ctx, filter.Subscription{Group: req.Group, Topic: req.Topic, ExpressionType: req.ExpressionType, Expression: req.Expression})
	if err != nil {
		return tc, nil, fmt.Errorf("pop: %w: %w", ErrBadFilter, err)
	}
	return tc, f, nil
}

func (b *Broker) popEnsureGroup(group string) error {
	if _, ok := b.groups.get(group); ok {
		return nil
	}
	if b.cfg.DisableAutoCreateGroups {
		return fmt.Errorf("pop: subscription group %q: %w", group, ErrNotFound)
	}
	_, _, err := b.groups.createIfAbsent(GroupConfig{Name: group, ConsumeEnable: true, RetryQueueNums: 1, RetryMaxTimes: b.cfg.MaxReconsumeTimes}, time.Now(), b.events)
	if err != nil {
		return fmt.Errorf("pop: %w", err)
	}
	return nil
}

// popOnce takes what is available now, queue after queue from the group's cursor.
func (b *Broker) popOnce(ctx context.Context, tc TopicConfig, req PopRequest, f *store.Filter) ([]PoppedMessage, error) {
	b.pop.mu.RLock()
	defer b.pop.mu.RUnlock()
	gc, _ := b.groups.get(req.Group)
	n, first := 1, int(req.QueueID)
	if req.QueueID < 0 {
		n = tc.ReadQueueNums
		first = b.pop.cursor(req.Group, tc.Name, n)
	}
	out := make([]PoppedMessage, 0, req.MaxMessages)
	// One pop time for the whole answer: RocketMQ 4.9's clients build each message's
	// receipt from the answer's pop time.
	now := b.pop.now()
	for i := 0; i < n && len(out) < req.MaxMessages; i++ {
		qid := int32((first + i) % max(tc.ReadQueueNums, 1))
		key := popKey{req.Group, tc.Name, qid}
		fifo := gc.ConsumeOrderly || req.Order
		q := b.pop.queueOrCreate(key, fifo, func() int64 { return b.popStart(key) })
		var err error
		out, err = b.popQueue(ctx, q, req, fifo, f, now, out)
		if err != nil && len(out) == 0 {
			return nil, err
		}
		if err != nil {
			break // hand out what was taken; the next receive meets the error again
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// popStart is where a group's first receive of a queue begins: the group's committed
// offset (a group moving from pull to pop), else the queue's first message.
func (b *Broker) popStart(key popKey) int64 {
	if off, ok := b.offsets.query(key.group, key.topic, key.queueID); ok && off >= 0 {
		return off
	}
	return b.store.MinOffset(key.topic, key.queueID)
}

// popQueue hands out q's visible messages (expired, or released by FIFO), then reads fresh
// ones from q.next in one read of the queue, appending to out.
func (b *Broker) popQueue(ctx context.Context, q *popQueue, req PopRequest, fifo bool, f *store.Filter, now time.Time, out []PoppedMessage) ([]PoppedMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.setFIFO(fifo)
	if now.Sub(q.seen) > time.Minute {
		// A pop group has no heartbeating members: receiving is what keeps it from being
		// forgotten as idle (sweepGroups).
		q.seen = now
		b.groups.markActive(q.key.group, time.Now())
	}
	var recs []popRecord
	if len(q.visible) > 0 {
		slices.Sort(q.visible)
		for _, off := range slices.Clone(q.visible) {
			if len(out) >= req.MaxMessages {
				break
			}
			e := q.entries[off]
			if !q.eligible(e) {
				continue
			}
			m, err := b.popRead(ctx, q.key, off, req.RawProperties)
			if errors.Is(err, errPopGone) {
				q.done(e) // retention removed it: nothing to hand out
				recs = append(recs, popRecord{kind: recDone, q: q, offset: off})
				continue
			}
			if err != nil {
				b.pop.jnl.append(recs)
				return out, err
			}
			if e.attempt > 0 {
				q.redeliv++
				b.pop.redelivered.Add(1)
			}
			out = append(out, b.handOut(q, e, m, now, req.Invisible, req.NoHandles))
			recs = append(recs, entryRecord(recPop, q, e))
		}
	}
	room := min(req.MaxMessages-len(out), popWindow-int(q.next-q.start))
	if room > 0 && q.next < b.store.MaxOffset(q.key.topic, q.key.queueID) {
		var err error
		out, recs, err = b.popFresh(ctx, q, req, f, now, room, out, recs)
		if err != nil {
			b.pop.jnl.append(recs)
			return out, err
		}
	}
	if len(out) > 0 && req.ClientID != "" && q.receiver != req.ClientID {
		q.receiver = strings.Clone(req.ClientID)
	}
	if err := b.pop.jnl.append(recs); err != nil {
		b.log.Error("pop journal write failed", "group", q.key.group, "topic", q.key.topic, "queue", q.key.queueID, "err", err)
	}
	return out, nil
}

// popFresh reads up to room messages from q.next in one read.
func (b *Broker) popFresh(ctx context.Context, q *popQueue, req PopRequest, f *store.Filter, now time.Time, room int, out []PoppedMessage, recs []popRecord) ([]PoppedMessage, []popRecord, error) {
	res, err := b.store.GetMessage(ctx, q.key.topic, q.key.queueID, q.next, room, 0, f)
	if err != nil {
		return out, recs, fmt.Errorf("pop: read %s/%d from %d: %w", q.key.topic, q.key.queueID, q.next, err)
	}
	defer res.Release()
	// The batch's messages in one allocation and their bodies (and raw property blocks),
	// copied out of the read's buffer before it goes back to the store, in one more: not two
	// allocations a message.
	ms := make([]protocol.MessageExt, len(res.Messages))
	opts := protocol.DecodeOptions{VerifyCRC: true}
	if req.RawProperties {
		opts.RawProperties, opts.Topic = true, q.key.topic
	}
	var decodeErr error
	size := 0
	for i, raw := range res.Messages {
		if _, err := protocol.DecodeStoredTo(&ms[i], raw, opts); err != nil {
			decodeErr = fmt.Errorf("pop: decode %s/%d near %d: %w", q.key.topic, q.key.queueID, q.next, err)
			ms = ms[:i] // hand out those before it, as one by one would
			break
		}
		size += len(ms[i].Body) + len(ms[i].RawProperties)
	}
	bodies := make([]byte, 0, size)
	if out == nil {
		out = make([]PoppedMessage, 0, req.MaxMessages)
	}
	if recs == nil {
		recs = make([]popRecord, 0, len(ms))
	}
	for i := range ms {
		m := &ms[i]
		at := len(bodies)
		bodies = append(bodies, m.Body...)
		m.Body = bodies[at:len(bodies):len(bodies)]
		if m.RawProperties != nil {
			at = len(bodies)
			bodies = append(bodies, m.RawProperties...)
			m.RawProperties = bodies[at:len(bodies):len(bodies)]
		}
		if m.QueueOffset < q.next {
			continue
		}
		// Offsets between q.next and this one were rejected by the filter (or removed by
		// retention): done for this group.
		q.next = m.QueueOffset + 1
		mg := popMessageGroup(m)
		if mg == "" && req.Order {
			// RocketMQ's ordered pop keeps a whole queue in order: a message without a
			// message group is in the queue's own.
			mg = popQueueGroup
		}
		e := q.add(m.QueueOffset, mg)
		if !q.eligible(e) {
			q.visible = append(q.visible, e.offset)
			recs = append(recs, entryRecord(recHold, q, e))
			continue
		}
		out = append(out, b.handOut(q, e, m, now, req.Invisible, req.NoHandles))
		recs = append(recs, entryRecord(recPop, q, e))
	}
	if decodeErr != nil {
		return out, recs, decodeErr
	}
	if res.NextBeginOffset > q.next {
		q.next = res.NextBeginOffset
		if q.next-q.start > popWindow {
			q.next = q.start + popWindow // never happens with room bounded; keep the bound exact
		}
	}
	if res.Status == store.OffsetTooSmall && res.NextBeginOffset > q.start {
		b.popDropBelow(q, res.NextBeginOffset)
	}
	q.advance()
	return out, recs, nil
}

// popDropBelow forgets the window below off: retention removed those messages.
func (b *Broker) popDropBelow(q *popQueue, off int64) {
	for o, e := range q.entries {
		if o < off {
			b.pop.timers.cancel(e)
			q.done(e)
		}
	}
	q.start = max(q.start, off)
	q.next = max(q.next, off)
}

var errPopGone = errors.New("message no longer in the queue")

// popDecode decodes a stored message into a copy that outlives the read's buffers; with
// rawProps its property block stays raw, copied with the body in one allocation.
func popDecode(raw []byte, topic string, rawProps bool) (*protocol.MessageExt, error) {
	if !rawProps {
		m, _, err := protocol.DecodeStored(raw)
		if err != nil {
			return nil, err
		}
		m.Body = bytes.Clone(m.Body)
		return m, nil
	}
	m := new(protocol.MessageExt)
	if _, err := protocol.DecodeStoredTo(m, raw, protocol.DecodeOptions{RawProperties: true, Topic: topic}); err != nil {
		return nil, err
	}
	buf := make([]byte, len(m.Body)+len(m.RawProperties))
	n := copy(buf, m.Body)
	copy(buf[n:], m.RawProperties)
	m.Body, m.RawProperties = buf[:n:n], buf[n:]
	return m, nil
}

// popQueueGroup is the message group an ordered receive (PopRequest.Order) reads a message
// without one into: the queue's own, a name starting with a NUL, which no message group a
// client sets is expected to take.
const popQueueGroup = "\x00queue"

// popMessageGroup is m's message group (PropertyShardingKey), from either form of its
// properties.
func popMessageGroup(m *protocol.MessageExt) string {
	if m.RawProperties != nil {
		if v, ok := protocol.PropertyIn(m.RawProperties, PropertyShardingKey); ok {
			return string(v)
		}
		return ""
	}
	return m.Properties[PropertyShardingKey]
}

// popRead reads the one message at off (its properties raw with rawProps).
func (b *Broker) popRead(ctx context.Context, key popKey, off int64, rawProps bool) (*protocol.MessageExt, error) {
	res, err := b.store.GetMessage(ctx, key.topic, key.queueID, off, 1, 0, nil)
	if err != nil {
		return nil, fmt.Errorf("pop: read %s/%d at %d: %w", key.topic, key.queueID, off, err)
	}
	defer res.Release()
	if len(res.Messages) == 0 {
		return nil, errPopGone
	}
	m, err := popDecode(res.Messages[0], key.topic, rawProps)
	if err != nil {
		return nil, fmt.Errorf("pop: decode %s/%d at %d: %w", key.topic, key.queueID, off, err)
	}
	if m.QueueOffset != off {
		return nil, errPopGone
	}
	return m, nil
}

// handOut makes e in flight until now+invisible and returns it to the receiver.
func (b *Broker) handOut(q *popQueue, e *popEntry, m *protocol.MessageExt, now time.Time, invisible time.Duration, noHandle bool) PoppedMessage {
	if !e.inflight {
		q.unvisible(e.offset)
		q.inflight++
	}
	e.inflight = true
	e.attempt++
	e.epoch = b.pop.epoch.Add(1)
	e.popTime = nextPopTime(e.popTime, now)
	if e.attempt == 1 || e.firstPop == 0 {
		e.firstPop = e.popTime
	}
	e.deadline = e.popTime + invisible.Milliseconds()
	b.pop.timers.schedule(e)
	m.ReconsumeTimes = e.attempt - 1
	p := PoppedMessage{Message: m, Attempt: int(e.attempt), InvisibleUntil: time.UnixMilli(e.deadline), PopTime: e.popTime, FirstPopTime: e.firstPop}
	if !noHandle {
		p.Handle = b.popHandle(q, e)
	}
	return p
}

// nextPopTime is now in Unix ms, or one past the previous hand-out's when that is not
// earlier: a delivery's pop time is unique among the message's deliveries, so that a
// remoting receipt, which names a delivery by it, never names a later one.
func nextPopTime(prev int64, now time.Time) int64 {
	return max(msNow(now), prev+1)
}

func (b *Broker) popHandle(q *popQueue, e *popEntry) string {
	return encodeHandle(b.pop.key, q.key.group, q.key.topic, receipt{queueID: q.key.queueID, offset: e.offset, popTime: e.popTime, deadline: e.deadline, attempt: e.attempt, epoch: e.epoch})
}

// popEntryOf finds the in-flight delivery a handle names, with its queue locked; the caller
// unlocks q.mu. The caller holds b.pop.mu shared.
func (b *Broker) popEntryOf(group, topic, handle string) (*popQueue, *popEntry, error) {
	if isExtraInfo(handle) {
		return b.popEntryOfExtraInfo(group, topic, handle)
	}
	r, err := decodeHandle(b.pop.key, group, topic, handle)
	if err != nil {
		return nil, nil, err
	}
	q := b.pop.queue(popKey{group, topic, r.queueID})
	if q == nil {
		return nil, nil, fmt.Errorf("%w: no pop progress of group %q in %s/%d", ErrInvalidReceiptHandle, group, topic, r.queueID)
	}
	q.mu.Lock()
	e := q.entries[r.offset]
	switch {
	case e == nil:
		q.mu.Unlock()
		return nil, nil, fmt.Errorf("%w: %s/%d offset %d is already acknowledged or dead-lettered", ErrInvalidReceiptHandle, topic, r.queueID, r.offset)
	case e.epoch != r.epoch:
		q.mu.Unlock()
		return nil, nil, fmt.Errorf("%w: %s/%d offset %d was handed out again since", ErrReceiptHandleExpired, topic, r.queueID, r.offset)
	case !e.inflight || e.deadline <= msNow(b.pop.now()):
		q.mu.Unlock()
		return nil, nil, fmt.Errorf("%w: %s/%d offset %d was invisible until %s", ErrReceiptHandleExpired, topic, r.queueID, r.offset, time.UnixMilli(e.deadline).UTC().Format(time.RFC3339Nano))
	}
	return q, e, nil
}

// forgetPop drops a group's pop progress (the group was deleted or forgotten as idle).
func (b *Broker) forgetPop(group string) {
	b.pop.mu.Lock()
	defer b.pop.mu.Unlock()
	b.pop.qmu.Lock()
	defer b.pop.qmu.Unlock()
	var recs []popRecord
	for k, q := range b.pop.queues {
		if k.group != group {
			continue
		}
		for _, e := range q.entries {
			b.pop.timers.cancel(e)
		}
		delete(b.pop.queues, k)
		recs = append(recs, popRecord{kind: recForget, q: q})
	}
	for k := range b.pop.cursors {
		if strings.HasPrefix(k, group+"\x00") {
			delete(b.pop.cursors, k)
		}
	}
	if err := b.pop.jnl.append(recs); err != nil {
		b.log.Error("pop journal write failed", "group", group, "err", err)
	}
}
