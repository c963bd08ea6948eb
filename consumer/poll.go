package consumer

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Poll returns the messages of one pull of one owned queue, and moves that queue's consume
// offset past them: with auto-commit they count as consumed from now on. It waits for
// messages until ctx ends (returning ctx's error) or for the poll timeout (returning no
// messages and no error). Queues take turns, so one busy queue cannot starve the others.
//
// A pull the broker refuses for a reason retrying does not change fails Poll with an error
// wrapping ErrSubscriptionRefused (the expression cannot be compiled: a SQL92 syntax error,
// a Wasm filter not deployed), ErrTopicNotExist or ErrGroupNotExist, and the *BrokerError
// with the broker's code and remark. Each refusal is reported once, before any message;
// the queue is pulled again after the pull-error delay, so a consumer that goes on polling
// resumes by itself once the cause is fixed. Other failures (a lost connection, a busy
// broker) are retried without failing Poll.
func (l *LitePull) Poll(ctx context.Context) ([]*Message, error) {
	if err := l.checkRunning(); err != nil {
		return nil, err
	}
	// The timer is made only when Poll has to wait: a consumer that keeps up finds a pull's
	// messages cached, and a timer made and stopped per Poll was an allocation and two
	// changes to the runtime's timer heap per batch.
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		l.mu.Lock()
		if l.closing {
			l.mu.Unlock()
			return nil, fmt.Errorf("poll: %w", ErrNotRunning)
		}
		if err := l.takeFailureLocked(); err != nil {
			l.mu.Unlock()
			return nil, fmt.Errorf("poll: %w", err)
		}
		msgs, q := l.takeLocked(time.Now())
		ch := l.dataCh
		if msgs == nil {
			l.dataWaited = true
		}
		l.mu.Unlock()
		if msgs != nil {
			q.signal() // its pull task may be waiting for room
			return msgs, nil
		}
		if timer == nil {
			timer = time.NewTimer(l.cfg.pollTimeout)
		}
		select {
		case <-ch:
		case <-timer.C:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// takeFailureLocked returns a refused pull not reported yet, the first queue's first, and
// forgets it.
func (l *LitePull) takeFailureLocked() error {
	if len(l.failures) == 0 {
		return nil
	}
	mq := slices.MinFunc(slices.Collect(maps.Keys(l.failures)), MessageQueue.Compare)
	err := l.failures[mq]
	delete(l.failures, mq)
	return err
}

// takeLocked hands out the first cached batch of the next queue that has one.
func (l *LitePull) takeLocked(now time.Time) ([]*Message, *queue) {
	n := len(l.order)
	for i := range n {
		idx := (l.cursor + i) % n
		q := l.order[idx]
		if !l.consumableLocked(q, now) {
			continue
		}
		q.skipEmptyLocked()
		if len(q.cache) == 0 {
			continue
		}
		b := q.cache[0]
		q.cache[0] = nil
		q.cache = q.cache[1:]
		q.count -= len(b.msgs)
		q.bytes -= b.bytes
		l.cachedBatches--
		q.consumeOffset = b.next
		q.skipEmptyLocked()
		l.cursor = idx + 1
		return b.msgs, q
	}
	return nil, nil
}

// consumableLocked reports whether q's messages may be handed out now.
func (l *LitePull) consumableLocked(q *queue, now time.Time) bool {
	if !q.active || q.dropped || l.paused[q.mq] {
		return false
	}
	return !l.lockedMode() || (q.locked && now.Before(q.lockValidUntil))
}

// lockedMode reports whether owned queues need a hand-over lock: subscriptions in clustering
// with hand-over locks on. Assigned queues are nobody else's business.
func (l *LitePull) lockedMode() bool { return l.cfg.handoverLocks && l.mode == modeSubscribe }

// skipEmptyLocked applies the offsets of the offset-only batches at the head of the cache.
func (q *queue) skipEmptyLocked() {
	for len(q.cache) > 0 && len(q.cache[0].msgs) == 0 {
		q.consumeOffset = q.cache[0].next
		q.cache[0] = nil
		q.cache = q.cache[1:]
	}
}

// clearCacheLocked forgets every cached batch of q.
func (l *LitePull) clearCacheLocked(q *queue) {
	for _, b := range q.cache {
		if len(b.msgs) > 0 {
			l.cachedBatches--
		}
	}
	q.cache, q.count, q.bytes = nil, 0, 0
}

// Pause stops pulling the given queues and handing out their messages, until Resume. Pausing
// outlives rebalances: a paused queue stays paused if it is reassigned later.
func (l *LitePull) Pause(queues ...MessageQueue) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, mq := range queues {
		l.paused[mq] = true
	}
}

// Resume undoes Pause.
func (l *LitePull) Resume(queues ...MessageQueue) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, mq := range queues {
		delete(l.paused, mq)
		if q, ok := l.queues[mq]; ok {
			q.signal()
		}
	}
	l.wakePollersLocked()
}

// wakePollersLocked wakes every waiting Poll.
func (l *LitePull) wakePollersLocked() {
	if l.dataWaited {
		close(l.dataCh)
		l.dataCh = make(chan struct{})
		l.dataWaited = false
	}
}
