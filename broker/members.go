package broker

import (
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowd-io/flowd/internal/remoting"
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
	lastSeen time.Time // last heartbeat; see consumerManager.seen for other requests
	// allocator is the allocation strategy identity the member's heartbeat reported
	// (protocol.ConsumerData.Allocator); "" for a client that reports none.
	allocator string
}

// consumerGroup is the live state of one group: its members and what they subscribe to.
type consumerGroup struct {
	name             string
	consumeType      string
	messageModel     string
	consumeFromWhere string
	subs             map[string]Subscription
	members          map[string]*member
	// allocators is the sorted, distinct allocator identities reported when the group last
	// disagreed, joined by "\n"; "" while the reporting members agree. An AllocatorMismatch
	// event goes out when it changes.
	allocators string
}

// consumerManager tracks the members of every consumer group.
//
// # Notes
//
// A member leaves when it unregisters, when its connection closes, or when it has been
// silent for ClientExpiry. Silent means no request at all on its connection, not only no
// heartbeat: a client whose heartbeats were refused or delayed but that keeps pulling and
// committing is alive. Every change is reported to the caller so that the broker can notify
// the group's remaining members at once (RocketMQ clients otherwise wait for their 20 s
// rebalance timer), and emitted as an event under the lock, so that a join and a leave of
// one client come out in the order they happened.
//
// Lock order: mu, then seenMu, then the event bus.
type consumerManager struct {
	events *eventBus
	log    *slog.Logger

	mu     sync.Mutex
	groups map[string]*consumerGroup

	// seen is the time (Unix ns) of the latest request on each member connection. Every
	// request touches it, so it has a lock of its own that the request path only reads.
	seenMu sync.RWMutex
	seen   map[*remoting.Conn]*atomic.Int64
}

func newConsumerManager(events *eventBus, log *slog.Logger) *consumerManager {
	return &consumerManager{events: events, log: log, groups: map[string]*consumerGroup{}, seen: map[*remoting.Conn]*atomic.Int64{}}
}

// memberChange is one join or leave. Its event was emitted under the manager's lock; the
// change itself is returned to the caller, which notifies the group after the lock is
// released.
type memberChange struct {
	group, clientID string
	joined          bool
	reason          string
}

func (m *consumerManager) emitLocked(ch memberChange) {
	typ := MemberJoined
	if !ch.joined {
		typ = MemberLeft
	}
	m.events.emit(Event{Type: typ, Group: ch.group, ClientID: ch.clientID, Reason: ch.reason})
}

// touch records a request on conn: its members stay alive.
func (m *consumerManager) touch(conn *remoting.Conn) {
	m.seenMu.RLock()
	at := m.seen[conn]
	m.seenMu.RUnlock()
	if at != nil {
		at.Store(time.Now().UnixNano()) // read only here: a producer's sends need no clock
	}
}

// heartbeat registers or refreshes a member and its subscriptions, and reports a join.
// allocator is the strategy identity the member reported ("" when none).
// allocatorChanged reports that the member's allocator changed: the group is to be told, so
// that its members read the new identities and agree on their strategy.
func (m *consumerManager) heartbeat(name, clientID string, conn *remoting.Conn, consumeType, model, from, allocator string, subs []Subscription, now time.Time) (joined, allocatorChanged bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if conn != nil {
		m.seenMu.Lock()
		at := m.seen[conn]
		if at == nil {
			at = new(atomic.Int64)
			m.seen[conn] = at
		}
		at.Store(now.UnixNano())
		m.seenMu.Unlock()
	}
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
		g.members[clientID] = &member{clientID: clientID, conn: conn, lastSeen: now, allocator: allocator}
		m.emitLocked(memberChange{group: name, clientID: clientID, joined: true})
		m.checkAllocatorsLocked(g)
		return true, false
	}
	mem.conn, mem.lastSeen = conn, now
	if mem.allocator != allocator {
		mem.allocator = allocator
		m.checkAllocatorsLocked(g)
		return false, true
	}
	return false, false
}

// checkAllocatorsLocked compares the allocators g's members reported and emits an
// AllocatorMismatch event when the group starts disagreeing, disagrees differently, or
// agrees again. Members that reported none (RocketMQ clients) are left out: they do not say.
func (m *consumerManager) checkAllocatorsLocked(g *consumerGroup) {
	reported := map[string]string{}
	var distinct []string
	for id, mem := range g.members {
		if mem.allocator != "" {
			reported[id] = mem.allocator
			distinct = append(distinct, mem.allocator)
		}
	}
	slices.Sort(distinct)
	distinct = slices.Compact(distinct)
	key := ""
	if len(distinct) > 1 {
		key = strings.Join(distinct, "\n")
	}
	if key == g.allocators {
		return
	}
	g.allocators = key
	reason := "members run different allocators"
	if key == "" {
		reason = "agreed"
		m.log.Info("consumer group members agree on their allocator again", "group", g.name, "allocators", distinct)
	} else {
		m.log.Warn("consumer group members run different allocators: they all fall back to the built-in averagely strategy until they agree", "group", g.name, "allocators", reported)
	}
	m.events.emit(Event{Type: AllocatorMismatch, Group: g.name, Reason: reason, Allocators: reported})
}

// allocators returns the allocator identity each member of the group reported ("" for none).
func (m *consumerManager) allocators(name string) map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]string{}
	if g := m.groups[name]; g != nil {
		for id, mem := range g.members {
			out[id] = mem.allocator
		}
	}
	return out
}

func (m *consumerManager) unregister(name, clientID string) []memberChange {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.groups[name]
	if g == nil || g.members[clientID] == nil {
		return nil
	}
	return []memberChange{m.removeLocked(g, clientID, "unregister")}
}

// connClosed removes every member that used conn.
func (m *consumerManager) connClosed(conn *remoting.Conn) []memberChange {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seenMu.Lock()
	delete(m.seen, conn)
	m.seenMu.Unlock()
	var out []memberChange
	for _, g := range m.groups {
		for id, mem := range g.members {
			if mem.conn == conn {
				out = append(out, m.removeLocked(g, id, "connection closed"))
			}
		}
	}
	return out
}

// expire removes members that sent nothing since before deadline.
func (m *consumerManager) expire(deadline time.Time) []memberChange {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seenMu.RLock()
	defer m.seenMu.RUnlock()
	var out []memberChange
	for _, g := range m.groups {
		for id, mem := range g.members {
			last := mem.lastSeen
			if at := m.seen[mem.conn]; at != nil {
				if t := time.Unix(0, at.Load()); t.After(last) {
					last = t
				}
			}
			if last.Before(deadline) {
				out = append(out, m.removeLocked(g, id, "expired"))
			}
		}
	}
	return out
}

func (m *consumerManager) removeLocked(g *consumerGroup, clientID, reason string) memberChange {
	delete(g.members, clientID)
	if len(g.members) == 0 {
		delete(m.groups, g.name)
	}
	ch := memberChange{group: g.name, clientID: clientID, reason: reason}
	m.emitLocked(ch)
	if len(g.members) > 0 {
		m.checkAllocatorsLocked(g)
	}
	return ch
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

// clientOf returns the id of the group's member registered on conn.
func (m *consumerManager) clientOf(name string, conn *remoting.Conn) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if g := m.groups[name]; g != nil {
		for id, mem := range g.members {
			if mem.conn == conn {
				return id, true
			}
		}
	}
	return "", false
}

// live reports whether the group has members.
func (m *consumerManager) live(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.groups[name] != nil
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
