package broker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/protocol"
)

// scheduleGroup is the pseudo consumer group under which the delay service records how far it
// has delivered each delay level's queue.
const scheduleGroup = "%SCHEDULE%"

// scheduleLoop delivers the delayed messages of one level. A message sent with delay level L
// (or sent back for a retry) is stored in queue L-1 of ScheduleTopic with its real topic and
// queue in properties; once its delay has passed since it was stored, it is stored again in
// its real topic, where consumers see it. Messages of one level are due in the order they were
// stored, so the loop only ever waits for the head of its queue.
func (b *Broker) scheduleLoop(ctx context.Context, level int) {
	delay := b.delays[level]
	qid := int32(level)
	for ctx.Err() == nil {
		if b.isReplica() {
			// The master delivers; its progress reaches this replica with the offsets.
			sleepCtx(ctx, time.Second)
			continue
		}
		offset, _ := b.offsets.query(scheduleGroup, ScheduleTopic, qid)
		res, err := b.store.GetMessage(ctx, ScheduleTopic, qid, offset, 32, 1<<20, nil)
		if err != nil {
			b.log.Error("delay service read failed", "level", level+1, "err", err)
			sleepCtx(ctx, time.Second)
			continue
		}
		if len(res.Messages) == 0 {
			res.Release()
			if res.NextBeginOffset != offset {
				b.offsets.commit(scheduleGroup, ScheduleTopic, qid, res.NextBeginOffset, time.Now(), nil)
				continue
			}
			w := b.poll.watch(ScheduleTopic, qid, offset)
			if b.store.MaxOffset(ScheduleTopic, qid) > offset {
				b.poll.unpark(w)
				continue
			}
			select {
			case <-ctx.Done():
			case <-w.ready:
			case <-time.After(time.Second):
			}
			b.poll.unpark(w)
			continue
		}
		next := offset
		for _, raw := range res.Messages {
			m, _, err := protocol.DecodeStored(raw)
			if err != nil {
				b.log.Error("delay service skips a corrupt message", "level", level+1, "offset", next, "err", err)
				next++
				continue
			}
			due := time.UnixMilli(m.StoreTimestamp).Add(delay)
			if wait := time.Until(due); wait > 0 {
				b.offsets.commit(scheduleGroup, ScheduleTopic, qid, next, time.Now(), nil)
				sleepCtx(ctx, min(wait, time.Second))
				break
			}
			if err := b.deliverDelayed(ctx, m); err != nil {
				if errors.Is(err, errUndeliverable) {
					// Retrying cannot help, and the level's later messages wait behind this one.
					b.log.Error("delay service drops an undeliverable message", "level", level+1, "offset", next, "err", err)
					next++
					continue
				}
				// Transient (the store refused the write): keep the offset and retry, so the
				// message is not lost.
				b.log.Error("delay service could not deliver", "level", level+1, "offset", next, "err", err)
				sleepCtx(ctx, time.Second)
				break
			}
			next++
		}
		res.Release()
		b.offsets.commit(scheduleGroup, ScheduleTopic, qid, next, time.Now(), nil)
	}
}

// errUndeliverable marks a delayed message that can never be delivered (its real topic was
// deleted, or its name is invalid); the delay service drops it with a log line rather than
// retry it forever.
var errUndeliverable = errors.New("undeliverable delayed message")

// deliverDelayed stores a due message in its real topic and queue.
func (b *Broker) deliverDelayed(ctx context.Context, m *protocol.MessageExt) error {
	props := m.Properties
	real := props[protocol.PropertyRealTopic]
	qid, _ := strconv.Atoi(props[protocol.PropertyRealQueueID])
	delete(props, protocol.PropertyRealTopic)
	delete(props, protocol.PropertyRealQueueID)
	delete(props, protocol.PropertyDelayLevel)
	if err := ValidateTopic(real); err != nil {
		return fmt.Errorf("%w: real topic: %w", errUndeliverable, err)
	}
	// Never create the topic here: a topic deleted while the message waited must stay
	// deleted (a delivery used to re-create it, with one queue). A topic deleted and then
	// created again receives the message. deleteMu keeps a deletion from falling between
	// the lookup and the append (not the fsync wait after it: see below).
	b.deleteMu.RLock()
	tc, ok := b.topics.get(real)
	if !ok {
		b.deleteMu.RUnlock()
		return fmt.Errorf("%w: topic %q was deleted while the message waited", errUndeliverable, real)
	}
	// The topic may have been deleted and re-created with fewer queues while the message
	// waited: a queue id past its write queues would be stored where no route points.
	if qid < 0 || qid >= tc.WriteQueueNums {
		qid %= tc.WriteQueueNums
		if qid < 0 {
			qid += tc.WriteQueueNums
		}
	}
	out := &protocol.MessageExt{
		Message:        protocol.Message{Topic: real, Flag: m.Flag, Properties: props, Body: m.Body},
		QueueID:        int32(qid),
		SysFlag:        m.SysFlag,
		BornTimestamp:  m.BornTimestamp,
		BornHost:       m.BornHost,
		ReconsumeTimes: m.ReconsumeTimes,
	}
	// Appended under deleteMu, waited for (SYNC_FLUSH: up to SyncFlushTimeout) without it,
	// so that a waiting deletion does not hold up every other delivery meanwhile.
	stored := make(chan error, 1)
	b.store.PutAsync(ctx, out, func(_ store.PutResult, err error) { stored <- err })
	b.deleteMu.RUnlock()
	var err error
	select {
	case err = <-stored:
	case <-ctx.Done(): // as Put: stored, perhaps not yet durable; delivered again after a restart
		err = ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("deliver delayed message to %s queue %d: %w", real, qid, err)
	}
	return nil
}

// delayed rewrites m, bound for its topic with a delay level, into the schedule topic.
func (b *Broker) delayed(m *protocol.MessageExt, level int) {
	level = min(level, len(b.delays))
	m.Properties[protocol.PropertyRealTopic] = m.Topic
	m.Properties[protocol.PropertyRealQueueID] = strconv.Itoa(int(m.QueueID))
	m.Properties[protocol.PropertyDelayLevel] = strconv.Itoa(level)
	m.Topic = ScheduleTopic
	m.QueueID = int32(level - 1)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
