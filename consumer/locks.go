package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// byBroker groups queues by broker name.
func byBroker(mqs []MessageQueue) map[string][]MessageQueue {
	out := map[string][]MessageQueue{}
	for _, mq := range mqs {
		out[mq.BrokerName] = append(out[mq.BrokerName], mq)
	}
	return out
}

// lockRequest sends code (LOCK_BATCH_MQ or UNLOCK_BATCH_MQ) for mqs to their brokers, one
// request per broker, waiting for each answer, and passes each successful answer to answer.
func (l *LitePull) lockRequest(ctx context.Context, code protocol.RequestCode, mqs []MessageQueue, answer func(addr string, resp *protocol.Command) error) error {
	var errs []error
	for name, group := range byBroker(mqs) {
		addr, err := l.cl.FindBrokerAddr(ctx, name, group[0].Topic)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s of %d queues: %w", code, len(group), err))
			continue
		}
		body, err := protocol.MarshalBody(&protocol.LockBatchRequestBody{ConsumerGroup: l.group, ClientID: l.ClientID(), MQSet: group})
		if err != nil {
			return fmt.Errorf("%s: %w", code, err)
		}
		resp, err := l.cl.InvokeOK(ctx, addr, protocol.NewRequest(code, nil, body))
		if err == nil && answer != nil {
			err = answer(addr, resp)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s of %d queues on %s: %w", code, len(group), name, err))
		}
	}
	return errors.Join(errs...)
}

// unlock releases the broker locks of mqs (UNLOCK_BATCH_MQ), waiting for each answer.
func (l *LitePull) unlock(ctx context.Context, mqs []MessageQueue) error {
	return l.lockRequest(ctx, protocol.UnlockBatchMQ, mqs, nil)
}

// lock asks the brokers for the locks of mqs (LOCK_BATCH_MQ) and returns the queues held, the
// time the requests were sent (the lease runs from no earlier than that), and the lock epoch
// before they were sent: an answer that crossed a lost connection (the epoch moved on) is
// not to be trusted.
func (l *LitePull) lock(ctx context.Context, mqs []MessageQueue) (held map[MessageQueue]bool, sent time.Time, epoch uint64, err error) {
	l.mu.Lock()
	epoch = l.lockEpoch
	l.mu.Unlock()
	sent = time.Now()
	held = map[MessageQueue]bool{}
	err = l.lockRequest(ctx, protocol.LockBatchMQ, mqs, func(addr string, resp *protocol.Command) error {
		var out protocol.LockBatchResponseBody
		if err := protocol.UnmarshalBody(resp.Body, &out); err != nil {
			return fmt.Errorf("answer from %s: %w", addr, err)
		}
		for _, mq := range out.LockOKMQSet {
			held[mq] = true
		}
		return nil
	})
	return held, sent, epoch, err
}

// renewLocks renews the locks of the queues being read. A queue whose lock the broker gives to
// someone else (our lease ran out, or our connection closed) is dropped without committing
// (its offset is no longer ours to write) and waits to be locked again. It reports false when
// the brokers could not be asked.
func (l *LitePull) renewLocks(ctx context.Context) bool {
	l.mu.Lock()
	if !l.lockedMode() {
		l.mu.Unlock()
		return true
	}
	var held []MessageQueue
	for _, q := range l.order {
		if q.locked && !q.dropped {
			held = append(held, q.mq)
		}
	}
	l.mu.Unlock()
	if len(held) == 0 {
		return true
	}
	got, sent, epoch, err := l.lock(ctx, held)
	if err != nil {
		if ctx.Err() == nil {
			l.log.Warn("lock renewal failed", "err", err)
		}
		return false // the locks lapse locally at half the lease; a later renewal may still save them
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lockEpoch != epoch {
		// A connection was lost meanwhile: the answer is not to be trusted. ConnectionLost
		// asked for another renewal if it concerned a lock held; the others keep their
		// validity until the next renewal.
		return true
	}
	defer l.wakePollersLocked() // queues whose lock had lapsed may have cached messages
	lost := false
	for _, mq := range held {
		q, ok := l.queues[mq]
		if !ok || q.dropped || !q.locked {
			continue
		}
		if got[mq] && q.lockLost {
			// Granted again after the broker had released it: a new lock, not a renewal.
			l.log.Info("queue lock regained after a lost connection: its committed offset is read again", "queue", mq.String())
			fresh := newQueue(mq, q.sub)
			if q.active {
				fresh.resume = &resumePoint{persisted: q.persisted, consume: q.consumeOffset}
			}
			l.detachLocked(q)
			l.queues[mq] = fresh
			lost = true
			continue
		}
		if got[mq] {
			q.lockValidUntil = sent.Add(l.cfg.lockLease / 2)
			continue
		}
		l.log.Warn("queue lock lost to another member", "queue", mq.String())
		l.detachLocked(q)
		l.queues[mq] = newQueue(mq, q.sub)
		lost = true
	}
	if lost {
		l.rebuildOrderLocked()
	}
	return true
}
