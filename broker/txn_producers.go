package broker

import (
	"slices"
	"sync"
	"time"

	"github.com/flowd-io/flowd/remoting"
)

// producerManager tracks the live members of every producer group, from the producerDataSet
// of heartbeats, so that a transaction check-back reaches a producer of the half message's
// group. A member leaves when it unregisters, when its connection closes, or after
// ClientExpiry without a heartbeat. Producers have no rebalance, so nothing is notified or
// emitted. Its lock is a leaf.
type producerManager struct {
	mu     sync.Mutex
	groups map[string]map[string]*member // group → client id → member
}

func newProducerManager() *producerManager {
	return &producerManager{groups: map[string]map[string]*member{}}
}

// heartbeat registers or refreshes a producer of group.
func (m *producerManager) heartbeat(group, clientID string, conn *remoting.Conn, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.groups[group]
	if g == nil {
		g = map[string]*member{}
		m.groups[group] = g
	}
	if mem := g[clientID]; mem != nil {
		mem.conn, mem.lastSeen = conn, now
		return
	}
	g[clientID] = &member{clientID: clientID, conn: conn, lastSeen: now}
}

func (m *producerManager) unregister(group, clientID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.removeLocked(group, clientID)
}

func (m *producerManager) removeLocked(group, clientID string) {
	if g := m.groups[group]; g != nil {
		delete(g, clientID)
		if len(g) == 0 {
			delete(m.groups, group)
		}
	}
}

// connClosed removes every producer that used conn.
func (m *producerManager) connClosed(conn *remoting.Conn) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for group, g := range m.groups {
		for id, mem := range g {
			if mem.conn == conn {
				m.removeLocked(group, id)
			}
		}
	}
}

// expire removes producers whose last heartbeat is before deadline.
func (m *producerManager) expire(deadline time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for group, g := range m.groups {
		for id, mem := range g {
			if mem.lastSeen.Before(deadline) {
				m.removeLocked(group, id)
			}
		}
	}
}

// conns returns the connections of group's producers, ordered by client id.
func (m *producerManager) conns(group string) []*remoting.Conn {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.groups[group]
	ids := make([]string, 0, len(g))
	for id, mem := range g {
		if mem.conn != nil {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	out := make([]*remoting.Conn, len(ids))
	for i, id := range ids {
		out[i] = g[id].conn
	}
	return out
}
