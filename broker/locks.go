package broker

import (
	"sync"
	"time"

	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// lockTable holds the queue locks orderly consumers take with LOCK_BATCH_MQ: a queue locked by
// one client of a group cannot be locked by another until the holder unlocks it or its lease
// runs out.
//
// Groups and queues come from clients, so the table must not keep what nobody holds: a
// lock call drops its group's expired entries, sweep drops every expired entry, and a group
// whose last entry goes is removed.
type lockTable struct {
	lease time.Duration

	mu    sync.Mutex
	locks map[string]map[protocol.MessageQueue]queueLock // by group
}

type queueLock struct {
	clientID string
	conn     *remoting.Conn // the connection the lock was taken on; nil in table tests
	renewed  time.Time
}

func newLockTable(lease time.Duration) *lockTable {
	return &lockTable{lease: lease, locks: map[string]map[protocol.MessageQueue]queueLock{}}
}

// lock takes or renews the locks of mqs for clientID and returns the queues it now holds.
func (t *lockTable) lock(group, clientID string, mqs []protocol.MessageQueue, now time.Time) []protocol.MessageQueue {
	return t.lockFrom(group, clientID, nil, mqs, now)
}

// lockFrom is lock for a request that arrived on conn, which is remembered with the lock.
func (t *lockTable) lockFrom(group, clientID string, conn *remoting.Conn, mqs []protocol.MessageQueue, now time.Time) []protocol.MessageQueue {
	t.mu.Lock()
	defer t.mu.Unlock()
	g := t.locks[group]
	if g == nil {
		g = map[protocol.MessageQueue]queueLock{}
		t.locks[group] = g
	}
	for mq, cur := range g {
		if now.Sub(cur.renewed) >= t.lease {
			delete(g, mq)
		}
	}
	out := make([]protocol.MessageQueue, 0, len(mqs))
	for _, mq := range mqs {
		cur, held := g[mq]
		if held && cur.clientID != clientID && now.Sub(cur.renewed) < t.lease {
			continue
		}
		g[mq] = queueLock{clientID: clientID, conn: conn, renewed: now}
		out = append(out, mq)
	}
	if len(g) == 0 {
		delete(t.locks, group)
	}
	return out
}

// holder returns the client holding mq's lock in group, and the connection it locked on, if
// a lease is running.
func (t *lockTable) holder(group string, mq protocol.MessageQueue, now time.Time) (string, *remoting.Conn, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.locks[group][mq]
	if !ok || now.Sub(l.renewed) >= t.lease {
		return "", nil, false
	}
	return l.clientID, l.conn, true
}

// sweep drops every lock whose lease ran out, and the groups left without locks.
func (t *lockTable) sweep(now time.Time) (changed []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for group, g := range t.locks {
		n := len(g)
		for mq, l := range g {
			if now.Sub(l.renewed) >= t.lease {
				delete(g, mq)
			}
		}
		if len(g) != n {
			changed = append(changed, group)
		}
		if len(g) == 0 {
			delete(t.locks, group)
		}
	}
	return changed
}

// dropGroup forgets every lock of a group.
func (t *lockTable) dropGroup(group string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.locks, group)
}

// size is the number of groups and of locks in the table.
func (t *lockTable) size() (groups, locks int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, g := range t.locks {
		locks += len(g)
	}
	return len(t.locks), locks
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
