package broker

import (
	"context"
	"fmt"
	"path/filepath"
	"time"
)

// popExpireBatch bounds the deadlines one pass of the expiry loop handles before it looks
// at the journal and its context again.
const popExpireBatch = 256

// popExpireLoop redelivers (or dead-letters) the deliveries whose invisibility passed, on
// one timer for all of them, and compacts the journal when it grew past popCompactBytes.
func (b *Broker) popExpireLoop(ctx context.Context) {
	tm := time.NewTimer(time.Hour)
	defer tm.Stop()
	for {
		if _, more := b.popExpireDue(ctx); more {
			continue
		}
		if b.pop.jnl.needsCompaction() {
			b.pop.mu.Lock()
			if err := b.pop.compact(); err != nil {
				b.log.Error("pop journal compaction failed", "err", err)
			}
			b.pop.mu.Unlock()
		}
		// Read again under the heap's lock: what was scheduled since the pass, without a
		// kick for being later than the deadline armed then, is in it.
		next := b.pop.timers.arm()
		wait := time.Hour
		if next != 0 {
			wait = max(time.Duration(next-msNow(b.pop.now()))*time.Millisecond, time.Millisecond)
		}
		tm.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-tm.C:
		case <-b.pop.timers.kick:
		case <-b.pop.jnl.full:
		}
		// Reset needs no drain: since Go 1.23 a reset timer delivers no stale tick.
	}
}

// popExpireDue handles the deliveries due now: it returns the next deadline (0: none) and
// whether more were due than one pass takes.
func (b *Broker) popExpireDue(ctx context.Context) (next int64, more bool) {
	// One pass at a time: when a pass returns, everything due when it began is handled,
	// even what a concurrent pass took off the heap.
	b.pop.expireMu.Lock()
	defer b.pop.expireMu.Unlock()
	now := b.pop.now()
	due, next := b.pop.timers.due(msNow(now), popExpireBatch)
	if len(due) == 0 {
		return next, false
	}
	b.pop.mu.RLock()
	defer b.pop.mu.RUnlock()
	for _, e := range due {
		b.popExpire(ctx, e, now)
	}
	return next, len(due) == popExpireBatch
}

// popExpire makes e visible again, or dead-letters it after the group's last attempt.
func (b *Broker) popExpire(ctx context.Context, e *popEntry, now time.Time) {
	q := e.q
	q.mu.Lock()
	defer q.mu.Unlock()
	// Acknowledged, or rescheduled (a change of invisibility) since it was taken off the heap.
	if q.entries[e.offset] != e || !e.inflight || e.deadline > msNow(now) || b.pop.timers.scheduled(e) {
		return
	}
	if int(e.attempt) > b.popMaxRetries(q.key.group) {
		if err := b.popDeadLetter(ctx, q, e); err != nil {
			// Try again shortly: the message stays in flight meanwhile.
			b.log.Error("pop: dead-lettering failed", "group", q.key.group, "topic", q.key.topic, "queue", q.key.queueID, "offset", e.offset, "err", err)
			e.deadline = msNow(now.Add(time.Second))
			b.pop.timers.schedule(e)
		}
		return
	}
	e.inflight = false
	q.inflight--
	q.visible = append(q.visible, e.offset)
	b.pop.waiters.wake(q.key.topic)
}

// popMaxRetries is how many redeliveries a group's message gets: its RetryMaxTimes, else
// Config.MaxReconsumeTimes. A message is delivered at most that many times plus one.
func (b *Broker) popMaxRetries(group string) int {
	if g, ok := b.groups.get(group); ok && g.RetryMaxTimes > 0 {
		return g.RetryMaxTimes
	}
	return b.cfg.MaxReconsumeTimes
}

// PopMaxAttempts is how many times a message of group is delivered by pop before it goes
// to %DLQ%<group>: the group's RetryMaxTimes (else Config.MaxReconsumeTimes) plus one, what
// RocketMQ 5 tells its clients as the consumer policy's max attempts.
func (b *Broker) PopMaxAttempts(group string) int { return b.popMaxRetries(group) + 1 }

// openPop loads the pop state of the data directory.
func (b *Broker) openPop() error {
	t, err := openPopTable(filepath.Join(b.cfg.DataDir, "pop"))
	if err != nil {
		return fmt.Errorf("open pop state: %w", err)
	}
	b.pop = t
	return nil
}

// closePop writes the pop state's snapshot (a clean restart replays no journal) and closes
// the journal.
func (b *Broker) closePop() error {
	b.pop.mu.Lock()
	defer b.pop.mu.Unlock()
	err := b.pop.compact()
	if cerr := b.pop.jnl.close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("close pop state: %w", err)
	}
	return nil
}
