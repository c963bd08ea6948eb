package broker

import (
	"slices"
	"sync"
	"time"

	"github.com/flowd-io/flowd/internal/remoting"
)

// producerManager tracks the live connections of every producer group, so that a
// transaction check-back reaches a producer of the half message's group. A connection joins
// a group with a heartbeat naming it in producerDataSet, or by sending a half message for it
// (a client may send before its first heartbeat reaches this broker: RocketMQ's Go client
// heartbeats only every 30 s). It leaves when its client unregisters from the group, when it
// closes, or after ClientExpiry without either. Producers have no rebalance, so nothing is
// notified or emitted. Its lock is a leaf.
type producerManager struct {
	mu     sync.Mutex
	groups map[string]map[*remoting.Conn]*member // group → connection → member
}

func newProducerManager() *producerManager {
	return &producerManager{groups: map[string]map[*remoting.Conn]*member{}}
}

// seen registers or refreshes conn as a producer of group; clientID may be empty when the
// connection has not said it (a send).
func (m *producerManager) seen(group, clientID string, conn *remoting.Conn, now time.Time) {
	if conn == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.groups[group]
	if g == nil {
		g = map[*remoting.Conn]*member{}
		m.groups[group] = g
	}
	mem := g[conn]
	if mem == nil {
		mem = &member{conn: conn}
		g[conn] = mem
	}
	if clientID != "" {
		mem.clientID = clientID
	}
	mem.lastSeen = now
}

// unregister removes the client's connections from group.
func (m *producerManager) unregister(group, clientID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.removeLocked(group, func(mem *member) bool { return mem.clientID == clientID })
}

func (m *producerManager) removeLocked(group string, drop func(*member) bool) {
	g := m.groups[group]
	for c, mem := range g {
		if drop(mem) {
			delete(g, c)
		}
	}
	if len(g) == 0 {
		delete(m.groups, group)
	}
}

// connClosed removes conn from every group.
func (m *producerManager) connClosed(conn *remoting.Conn) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for group := range m.groups {
		m.removeLocked(group, func(mem *member) bool { return mem.conn == conn })
	}
}

// expire removes producers last seen before deadline.
func (m *producerManager) expire(deadline time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for group := range m.groups {
		m.removeLocked(group, func(mem *member) bool { return mem.lastSeen.Before(deadline) })
	}
}

// conns returns the connections of group's producers, most recently seen first.
func (m *producerManager) conns(group string) []*remoting.Conn {
	m.mu.Lock()
	defer m.mu.Unlock()
	mems := make([]*member, 0, len(m.groups[group]))
	for _, mem := range m.groups[group] {
		mems = append(mems, mem)
	}
	slices.SortFunc(mems, func(a, b *member) int { return b.lastSeen.Compare(a.lastSeen) })
	out := make([]*remoting.Conn, len(mems))
	for i, mem := range mems {
		out[i] = mem.conn
	}
	return out
}
