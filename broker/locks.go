package broker

import (
	"sync"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// lockTable holds the queue locks orderly consumers take with LOCK_BATCH_MQ: a queue locked by
// one client of a group cannot be locked by another until the holder unlocks it or its lease
// runs out.
type lockTable struct {
	lease time.Duration

	mu    sync.Mutex
	locks map[string]map[protocol.MessageQueue]queueLock // by group
}

type queueLock struct {
	clientID string
	renewed  time.Time
}

func newLockTable(lease time.Duration) *lockTable {
	return &lockTable{lease: lease, locks: map[string]map[protocol.MessageQueue]queueLock{}}
}

// lock takes or renews the locks of mqs for clientID and returns the queues it now holds.
func (t *lockTable) lock(group, clientID string, mqs []protocol.MessageQueue, now time.Time) []protocol.MessageQueue {
	t.mu.Lock()
	defer t.mu.Unlock()
	g := t.locks[group]
	if g == nil {
		g = map[protocol.MessageQueue]queueLock{}
		t.locks[group] = g
	}
	out := make([]protocol.MessageQueue, 0, len(mqs))
	for _, mq := range mqs {
		cur, held := g[mq]
		if held && cur.clientID != clientID && now.Sub(cur.renewed) < t.lease {
			continue
		}
		g[mq] = queueLock{clientID: clientID, renewed: now}
		out = append(out, mq)
	}
	return out
}

// unlock releases the queues clientID holds; locks held by others are left alone.
func (t *lockTable) unlock(group, clientID string, mqs []protocol.MessageQueue) {
	t.mu.Lock()
	defer t.mu.Unlock()
	g := t.locks[group]
	for _, mq := range mqs {
		if cur, ok := g[mq]; ok && cur.clientID == clientID {
			delete(g, mq)
		}
	}
	if len(g) == 0 {
		delete(t.locks, group)
	}
}

// releaseClient drops every lock a departed client held, so its queues move at once.
func (t *lockTable) releaseClient(group, clientID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	g := t.locks[group]
	for mq, cur := range g {
		if cur.clientID == clientID {
			delete(g, mq)
		}
	}
	if len(g) == 0 {
		delete(t.locks, group)
	}
}

// held returns the queues locked in group and by whom, leases that ran out excluded.
func (t *lockTable) held(group string, now time.Time) map[protocol.MessageQueue]string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[protocol.MessageQueue]string{}
	for mq, l := range t.locks[group] {
		if now.Sub(l.renewed) < t.lease {
			out[mq] = l.clientID
		}
	}
	return out
}
