package consumer

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// ActiveQueues returns the queues being read now: locked (with hand-over locks) and pulling,
// the group's retry topic left out (see RetryQueues).
func (l *LitePull) ActiveQueues() []MessageQueue {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	var out []MessageQueue
	for _, q := range l.order {
		if l.consumableLocked(q, now) && !isRetryTopic(q.mq.Topic) {
			out = append(out, q.mq)
		}
	}
	return out
}

// CachedCount returns the number of messages cached for mq.
func (l *LitePull) CachedCount(mq MessageQueue) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if q, ok := l.queues[mq]; ok {
		return q.count
	}
	return 0
}

// OwnedQueues returns the owned queues, sorted, the group's retry topic left out.
func (l *LitePull) OwnedQueues() []MessageQueue {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.SortedFunc(maps.Keys(l.queues), MessageQueue.Compare)
	return slices.DeleteFunc(out, func(mq MessageQueue) bool { return isRetryTopic(mq.Topic) })
}

// CrashForTest kills the consumer's connections without committing, unlocking or
// unregistering, as a crashed process would.
func (l *LitePull) CrashForTest() {
	l.mu.Lock()
	l.closing = true
	l.mu.Unlock()
	l.cancel()
	l.wg.Wait()
	_ = l.cl.Close(context.Background())
}

// Hooks exposes what the client core calls.
func (l *LitePull) Hooks() interface {
	RunningInfo() *protocol.ConsumerRunningInfo
	ResetOffset(topic string, offsets map[protocol.MessageQueue]int64)
	NotifyConsumerIDsChanged()
} {
	return (*hooks)(l)
}

// Settling reports whether the consumer is still re-reading the group's lock table on the
// lock-retry timer.
func (l *LitePull) Settling() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.settling
}

// HeartbeatForTest sends a heartbeat now.
func (l *LitePull) HeartbeatForTest(ctx context.Context) error { return l.cl.SendHeartbeat(ctx) }

// Rebalances returns how many rebalances ran.
func (l *LitePull) Rebalances() uint64 { return l.rebalances.Load() }

// LockValidUntil returns until when the consumer trusts its lock of mq (zero when it holds
// none).
func (l *LitePull) LockValidUntil(mq MessageQueue) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if q, ok := l.queues[mq]; ok && q.locked {
		return q.lockValidUntil
	}
	return time.Time{}
}
