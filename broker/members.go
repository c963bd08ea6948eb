package broker

import (
	"slices"
	"sync"
	"time"

	"github.com/flowd-io/flowd/remoting"
)

// Subscription is what a group member consumes from one topic.
type Subscription struct {
	Topic          string
	Expression     string
	ExpressionType string
	Tags           []string
	Codes          []int64
	Version        int64
}

// member is one client of a consumer group.
type member struct {
	clientID string
	conn     *remoting.Conn
	lastSeen time.Time
}

// consumerGroup is the live state of one group: its members and what they subscribe to.
type consumerGroup struct {
	name             string
	consumeType      string
	messageModel     string
	consumeFromWhere string
	subs             map[string]Subscription
	members          map[string]*member
}

// consumerManager tracks the members of every consumer group.
//
// # Notes
//
// A member leaves when it unregisters, when its connection closes, or when it has been
// silent for ClientExpiry. Every change is reported to the caller so that the broker can
// notify the group's remaining members at once (RocketMQ clients otherwise wait for their
// 20 s rebalance timer).
type consumerManager struct {
	mu     sync.Mutex
	groups map[string]*consumerGroup
}

func newConsumerManager() *consumerManager {
	return &consumerManager{groups: map[string]*consumerGroup{}}
}

// memberChange is one join or leave, reported after the manager's lock is released.
type memberChange struct {
	group, clientID string
	joined          bool
	reason          string
}

// heartbeat registers or refreshes a member and its subscriptions.
func (m *consumerManager) heartbeat(name, clientID string, conn *remoting.Conn, consumeType, model, from string, subs []Subscription, now time.Time) (joined bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.groups[name]
	if g == nil {
		g = &consumerGroup{name: name, members: map[string]*member{}, subs: map[string]Subscription{}}
		m.groups[name] = g
	}
	g.consumeType, g.messageModel, g.consumeFromWhere = consumeType, model, from
	for _, s := range subs {
		if old, ok := g.subs[s.Topic]; !ok || s.Version >= old.Version {
			g.subs[s.Topic] = s
		}
	}
	mem := g.members[clientID]
	if mem == nil {
		g.members[clientID] = &member{clientID: clientID, conn: conn, lastSeen: now}
		return true
	}
	mem.conn, mem.lastSeen = conn, now
	return false
}

func (m *consumerManager) unregister(name, clientID string) []memberChange {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.groups[name]
	if g == nil || g.members[clientID] == nil {
		return nil
	}
	m.removeLocked(g, clientID)
	return []memberChange{{group: name, clientID: clientID, reason: "unregister"}}
}

// connClosed removes every member that used conn.
func (m *consumerManager) connClosed(conn *remoting.Conn) []memberChange {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []memberChange
	for _, g := range m.groups {
		for id, mem := range g.members {
			if mem.conn == conn {
				m.removeLocked(g, id)
				out = append(out, memberChange{group: g.name, clientID: id, reason: "connection closed"})
			}
		}
	}
	return out
}

// expire removes members silent since before deadline.
func (m *consumerManager) expire(deadline time.Time) []memberChange {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []memberChange
	for _, g := range m.groups {
		for id, mem := range g.members {
			if mem.lastSeen.Before(deadline) {
				m.removeLocked(g, id)
				out = append(out, memberChange{group: g.name, clientID: id, reason: "expired"})
			}
		}
	}
	return out
}

func (m *consumerManager) removeLocked(g *consumerGroup, clientID string) {
	delete(g.members, clientID)
	if len(g.members) == 0 {
		delete(m.groups, g.name)
	}
}

// clientIDs returns the group's member ids, sorted: the order every member allocates by.
func (m *consumerManager) clientIDs(name string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.groups[name]
	if g == nil {
		return nil
	}
	ids := make([]string, 0, len(g.members))
	for id := range g.members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// conns returns the connections of the group's members, to notify them.
func (m *consumerManager) conns(name string) []*remoting.Conn {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.groups[name]
	if g == nil {
		return nil
	}
	out := make([]*remoting.Conn, 0, len(g.members))
	for _, mem := range g.members {
		if mem.conn != nil {
			out = append(out, mem.conn)
		}
	}
	return out
}

// subscription returns the group's subscription to topic, if any member registered one.
func (m *consumerManager) subscription(name, topic string) (Subscription, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.groups[name]
	if g == nil {
		return Subscription{}, false
	}
	s, ok := g.subs[topic]
	return s, ok
}

// conn returns the connection of one member of a group.
func (m *consumerManager) conn(name, clientID string) *remoting.Conn {
	m.mu.Lock()
	defer m.mu.Unlock()
	if g := m.groups[name]; g != nil {
		if mem := g.members[clientID]; mem != nil {
			return mem.conn
		}
	}
	return nil
}
