package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// popServed is nil unless this broker is a replica (or a master that fenced itself): the pop
// state is the master's alone (a replica gets only the consumed offsets, in the master's
// snapshots), so a replica hands out nothing and takes no acknowledgement, which would
// count nowhere once a client's refreshed route names the master. ErrNotMaster is answered
// as a refused send is (SERVICE_NOT_AVAILABLE, gRPC HA_NOT_AVAILABLE).
func (b *Broker) popServed(what string) error {
	if err := b.writable(); errors.Is(err, ErrNotMaster) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// PopAck acknowledges one handed-out message for good. Once it returns nil the message is
// never handed out again, a kill -9 of the broker included (docs/pop.md).
func (b *Broker) PopAck(ctx context.Context, group, topic, handle string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pop ack: %w", err)
	}
	q, e, release, err := b.popDelivery("pop ack", group, topic, handle)
	if err != nil {
		return err
	}
	defer release()
	return b.popFinish(q, e, false)
}

// popDelivery finds the delivery handle names for one of what's requests (PopAck,
// PopChangeInvisible, PopToDLQ) and returns it locked: the pop state's read lock and its
// queue's lock held until release. Errors are wrapped with what.
func (b *Broker) popDelivery(what, group, topic, handle string) (q *popQueue, e *popEntry, release func(), err error) {
	if err := b.popServed(what); err != nil {
		return nil, nil, nil, err
	}
	b.pop.mu.RLock()
	q, e, err = b.popEntryOf(group, topic, handle)
	if err != nil {
		b.pop.mu.RUnlock()
		return nil, nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	return q, e, func() {
		q.mu.Unlock()
		b.pop.mu.RUnlock()
	}, nil
}

// PopAckBatch acknowledges handles of group and topic together, as one AckMessage of a
// batch does: each queue's lock is taken once per run of its handles and the records go to
// the journal in one write, not one per message. errs[i] is handles[i]'s outcome, with
// PopAck's meaning: nil once the acknowledgement is journaled.
func (b *Broker) PopAckBatch(ctx context.Context, group, topic string, handles []string) []error {
	errs := make([]error, len(handles))
	err := ctx.Err()
	if err != nil {
		err = fmt.Errorf("pop ack: %w", err)
	} else {
		err = b.popServed("pop ack")
	}
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	return b.popAckEach(topic, errs, func(i int) (*popQueue, *popEntry, error) { return b.popEntryOf(group, topic, handles[i]) })
}

// popAckEach is PopAckBatch over len(errs) receipts, entry(i) finding the i-th one's delivery
// (its queue locked, as popEntryOf returns it).
func (b *Broker) popAckEach(topic string, errs []error, entry func(i int) (*popQueue, *popEntry, error)) []error {
	b.pop.mu.RLock()
	defer b.pop.mu.RUnlock()
	recs := make([]popRecord, 0, len(errs))
	done := make([]int, 0, len(errs)) // the indexes of receipts whose record is in recs
	var woken []string
	for i := range errs {
		q, e, err := entry(i)
		if err != nil {
			errs[i] = fmt.Errorf("pop ack: %w", err)
			continue
		}
		rec, released := b.popDone(q, e, false)
		q.mu.Unlock()
		recs = append(recs, rec)
		done = append(done, i)
		if released && !slices.Contains(woken, q.key.topic) {
			woken = append(woken, q.key.topic)
		}
	}
	if err := b.pop.jnl.append(recs); err != nil {
		for _, i := range done {
			errs[i] = fmt.Errorf("pop ack: journal %s: %w", topic, err)
		}
	}
	for _, t := range woken {
		b.pop.waiters.wake(t)
	}
	return errs
}

// popDone makes e done (acknowledged, or dead-lettered with dlq) in memory and returns the
// record to journal; q.mu is held.
func (b *Broker) popDone(q *popQueue, e *popEntry, dlq bool) (rec popRecord, released bool) {
	b.pop.timers.cancel(e)
	kind := recDone
	if dlq {
		kind = recDLQ
		q.dlq++
		b.pop.deadLettered.Add(1)
	} else {
		q.acked++
		b.pop.acked.Add(1)
	}
	rec = popRecord{kind: kind, q: q, offset: e.offset}
	return rec, q.done(e)
}

// popFinish makes e done (acknowledged, or dead-lettered with dlq) and journals it; q.mu is
// held.
func (b *Broker) popFinish(q *popQueue, e *popEntry, dlq bool) error {
	rec, released := b.popDone(q, e, dlq)
	err := b.pop.jnl.append([]popRecord{rec})
	if released {
		b.pop.waiters.wake(q.key.topic)
	}
	if err != nil {
		return fmt.Errorf("pop: journal %s/%d offset %d: %w", q.key.topic, q.key.queueID, rec.offset, err)
	}
	return nil
}

// PopChangeInvisible makes the message invisible for d (0..PopMaxInvisible) from now and
// returns its new handle; the old one stops working (ErrReceiptHandleExpired). d = 0 makes it
// visible at once, a negative acknowledgement.
func (b *Broker) PopChangeInvisible(ctx context.Context, group, topic, handle string, d time.Duration) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("pop change invisible: %w", err)
	}
	if d < 0 || d > PopMaxInvisible {
		return "", fmt.Errorf("pop change invisible: duration %v outside 0..%v: %w", d, PopMaxInvisible, ErrBadRequest)
	}
	q, e, release, err := b.popDelivery("pop change invisible", group, topic, handle)
	if err != nil {
		return "", err
	}
	defer release()
	now := b.pop.now()
	e.epoch = b.pop.epoch.Add(1)
	e.popTime = nextPopTime(e.popTime, now)
	e.deadline = e.popTime + d.Milliseconds()
	b.pop.timers.schedule(e)
	h := b.popHandle(q, e)
	if isExtraInfo(handle) {
		h = renewedExtraInfo(handle, e, d)
	}
	if err := b.pop.jnl.append([]popRecord{entryRecord(recPop, q, e)}); err != nil {
		return "", fmt.Errorf("pop change invisible: journal: %w", err)
	}
	return h, nil
}

// PopToDLQ sends the handed-out message to %DLQ%<group> now and acknowledges it.
func (b *Broker) PopToDLQ(ctx context.Context, group, topic, handle string) error {
	q, e, release, err := b.popDelivery("pop to DLQ", group, topic, handle)
	if err != nil {
		return err
	}
	defer release()
	if err := b.popDeadLetter(ctx, q, e); err != nil {
		return fmt.Errorf("pop to DLQ: %w", err)
	}
	return nil
}

// popDeadLetter writes e's message to the group's dead-letter topic, keeping its origin as
// a sent-back message does, and makes it done; q.mu is held.
func (b *Broker) popDeadLetter(ctx context.Context, q *popQueue, e *popEntry) error {
	orig, err := b.popRead(ctx, q.key, e.offset, false)
	if errors.Is(err, errPopGone) {
		return b.popFinish(q, e, true)
	}
	if err != nil {
		return err
	}
	props := originProperties(orig, "")
	props[protocol.PropertyReconsumeTimes] = strconv.Itoa(int(e.attempt))
	topic := DLQTopicPrefix + q.key.group
	if _, err := b.internalTopic(topic); err != nil {
		return err
	}
	m := &protocol.MessageExt{
		Message:        protocol.Message{Topic: topic, Flag: orig.Flag, Properties: props, Body: orig.Body},
		SysFlag:        orig.SysFlag,
		BornTimestamp:  orig.BornTimestamp,
		BornHost:       orig.BornHost,
		ReconsumeTimes: e.attempt,
	}
	if _, err := b.store.Put(ctx, m); err != nil {
		return fmt.Errorf("write %s: %w", topic, err)
	}
	b.events.emit(Event{Type: PopDeadLettered, Time: b.pop.now(), Group: q.key.group, Topic: q.key.topic, QueueID: q.key.queueID, Offset: e.offset, Reason: fmt.Sprintf("%d deliveries", e.attempt)})
	return b.popFinish(q, e, true)
}

// PopStats reports a group's pop progress in every queue it received from, by topic and
// queue.
func (b *Broker) PopStats(group string) []PopQueueStats {
	b.pop.qmu.Lock()
	var qs []*popQueue
	for k, q := range b.pop.queues {
		if k.group == group {
			qs = append(qs, q)
		}
	}
	b.pop.qmu.Unlock()
	out := make([]PopQueueStats, 0, len(qs))
	for _, q := range qs {
		q.mu.Lock()
		out = append(out, PopQueueStats{Topic: q.key.topic, QueueID: q.key.queueID, InFlight: q.inflight, Visible: len(q.visible),
			Acked: q.acked, DeadLettered: q.dlq, Redelivered: q.redeliv, ConsumedOffset: q.start, NextOffset: q.next, Receiver: q.receiver})
		q.mu.Unlock()
	}
	for i := range out {
		out[i].MaxOffset = b.store.MaxOffset(out[i].Topic, out[i].QueueID)
	}
	slices.SortFunc(out, func(a, b PopQueueStats) int {
		if a.Topic != b.Topic {
			if a.Topic < b.Topic {
				return -1
			}
			return 1
		}
		return int(a.QueueID - b.QueueID)
	})
	return out
}

// PopTotals are the broker's pop counters since it started, for metrics.
type PopTotals struct {
	InFlight                         int
	Acked, Redelivered, DeadLettered uint64
}

// PopTotals reads the broker's pop counters.
func (b *Broker) PopTotals() PopTotals {
	t := PopTotals{Acked: b.pop.acked.Load(), Redelivered: b.pop.redelivered.Load(), DeadLettered: b.pop.deadLettered.Load()}
	b.pop.timers.mu.Lock()
	t.InFlight = len(b.pop.timers.h)
	b.pop.timers.mu.Unlock()
	return t
}
