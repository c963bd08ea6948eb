package allocate

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/flowd-io/flowd/protocol"
)

// ByMachineRoom returns "MACHINE_ROOM": brokers are named "room@broker", and only queues of
// brokers whose room is in rooms are shared, averagely by count: with n such queues, member
// i takes [i*(n/nc), (i+1)*(n/nc)) and, if i < n%nc, also queue i + (n/nc)*nc.
//
// 10 queues, 0–4 on "room1@broker-a" and 5–9 on "room2@broker-b", rooms {room1}, 2 members:
// [0 1 4] and [2 3].
//
// # Notes
//
//   - Every member must be configured with the same rooms, or the group will disagree.
//   - A broker name is split on "@" as Java's String.split does (trailing empty parts
//     dropped) and must give exactly two parts: "a@b@" qualifies with room "a", "a@b@c" and
//     "a@" do not.
//   - The n%nc leftover queues, the last ones, go one each to the first n%nc members, so
//     those members' queues are not contiguous: that is the Java client's arithmetic, and
//     members must agree with it.
func ByMachineRoom(rooms []string) Strategy {
	set := make(map[string]struct{}, len(rooms))
	for _, r := range rooms {
		set[r] = struct{}{}
	}
	return byMachineRoom{rooms: set}
}

type byMachineRoom struct{ rooms map[string]struct{} }

func (byMachineRoom) Name() string { return NameByMachineRoom }

func (s byMachineRoom) Allocate(ctx context.Context, req Request) ([]protocol.MessageQueue, error) {
	index, err := begin(ctx, req)
	if err != nil {
		return nil, err
	}
	if index < 0 {
		return none(), nil
	}
	// Two passes over the queues instead of building the filtered list: count, then pick.
	// Queues come sorted by broker, so the room test is redone only when the broker changes.
	var w roomFilter
	n := 0
	for _, q := range req.Queues {
		if w.wanted(s.rooms, q.BrokerName) {
			n++
		}
	}
	nc := len(req.ClientIDs)
	mod, rem := n/nc, n%nc
	start, end := index*mod, index*mod+mod
	extra := -1
	if rem > index {
		extra = index + mod*nc
	}
	if start == end && extra < 0 {
		return none(), nil
	}
	out := make([]protocol.MessageQueue, 0, end-start+1)
	k := 0
	for _, q := range req.Queues {
		if !w.wanted(s.rooms, q.BrokerName) {
			continue
		}
		if (k >= start && k < end) || k == extra {
			out = append(out, q)
		}
		k++
	}
	return out, nil
}

// roomFilter remembers the verdict for the last broker name seen.
type roomFilter struct {
	broker string
	seen   bool
	want   bool
}

func (f *roomFilter) wanted(rooms map[string]struct{}, brokerName string) bool {
	if f.seen && brokerName == f.broker {
		return f.want
	}
	room, ok := brokerRoom(brokerName)
	if ok {
		_, ok = rooms[room]
	}
	f.broker, f.seen, f.want = brokerName, true, ok
	return ok
}

// brokerRoom splits "room@broker" the way Java's brokerName.split("@") followed by a
// length-2 check does: trailing empty parts are dropped, then exactly two parts must remain.
func brokerRoom(brokerName string) (string, bool) {
	if strings.IndexByte(brokerName, '@') < 0 {
		return "", false // Java returns the whole string as the only part
	}
	t := strings.TrimRight(brokerName, "@")
	room, rest, ok := strings.Cut(t, "@")
	if !ok || strings.IndexByte(rest, '@') >= 0 {
		return "", false
	}
	return room, true
}

// RoomResolver says where brokers and consumers are deployed, for [MachineRoomNearby]. Both
// methods must return a non-empty room, and every member of a group must resolve the same way.
type RoomResolver interface {
	// BrokerRoom is the room of the broker hosting q.
	BrokerRoom(q protocol.MessageQueue) string
	// ClientRoom is the room of the consumer with this client id.
	ClientRoom(clientID string) string
}

// MachineRoomNearby returns "MACHINE_ROOM_NEARBY-"+inner.Name(), a wrapper that keeps
// traffic inside a room while the room has consumers:
//
//   - the queues of a room that has members are shared by inner among that room's members
//     only;
//   - the queues of a room with no member are shared by inner among all members, room by
//     room in room-name order.
//
// Each call of inner sees a sub-request: the room's queues, the chosen members (both still
// sorted) and the full Previous map. It panics if inner or resolver is nil.
//
// # Notes
//
//   - This is the Java client's AllocateMachineRoomNearby, and it inherits its trait that
//     orphaned rooms are allocated one by one: with [Averagely] the first members take every
//     orphaned room's leftover queue. Members mixing Java and flowd must agree, so the trait
//     stays.
//   - A resolver returning "" for any queue or member is an error wrapping
//     [ErrInvalidConfig], as it is an exception in Java.
//   - The result is sorted in queue order (Java concatenates the own room's share and then
//     the orphaned rooms'; the set is the same).
func MachineRoomNearby(inner Strategy, resolver RoomResolver) Strategy {
	if inner == nil {
		panic("allocate: MachineRoomNearby with nil inner strategy")
	}
	if resolver == nil {
		panic("allocate: MachineRoomNearby with nil RoomResolver")
	}
	return machineRoomNearby{inner: inner, resolver: resolver}
}

type machineRoomNearby struct {
	inner    Strategy
	resolver RoomResolver
}

func (s machineRoomNearby) Name() string { return PrefixMachineRoomNearby + s.inner.Name() }

func (s machineRoomNearby) Allocate(ctx context.Context, req Request) ([]protocol.MessageQueue, error) {
	index, err := begin(ctx, req)
	if err != nil {
		return nil, err
	}
	if index < 0 {
		return none(), nil
	}

	// Group queues and members by room. Each room's entries end up contiguous in one array
	// per kind (a counting sort: a fixed number of allocations however many rooms).
	rooms := roomGroups{byName: make(map[string]int), last: -1}
	queueRoom := make([]int, len(req.Queues))
	for k, q := range req.Queues {
		room := s.resolver.BrokerRoom(q)
		if room == "" {
			return nil, fmt.Errorf("%w: %s: no machine room for %v", ErrInvalidConfig, s.Name(), q)
		}
		queueRoom[k] = rooms.of(room)
		rooms.groups[queueRoom[k]].nq++
	}
	clientRoom := make([]int, len(req.ClientIDs))
	for c, id := range req.ClientIDs {
		room := s.resolver.ClientRoom(id)
		if room == "" {
			return nil, fmt.Errorf("%w: %s: no machine room for client %q", ErrInvalidConfig, s.Name(), id)
		}
		clientRoom[c] = rooms.of(room)
		rooms.groups[clientRoom[c]].nc++
	}
	groups := rooms.groups
	queues := make([]protocol.MessageQueue, 0, len(req.Queues))
	clients := make([]string, 0, len(req.ClientIDs))
	for i := range groups {
		g := &groups[i]
		g.queues, queues = carve(queues, g.nq)
		g.clients, clients = carve(clients, g.nc)
	}
	for k, q := range req.Queues {
		g := &groups[queueRoom[k]]
		g.queues = append(g.queues, q)
	}
	for c, id := range req.ClientIDs {
		g := &groups[clientRoom[c]]
		g.clients = append(g.clients, id)
	}

	var out []protocol.MessageQueue
	share := func(g roomGroup, clients []string) error {
		sub := req
		sub.Queues, sub.ClientIDs = g.queues, clients
		got, err := s.inner.Allocate(ctx, sub)
		if err != nil {
			return fmt.Errorf("%s: room %q: %w", s.Name(), g.room, err)
		}
		out = append(out, got...)
		return nil
	}

	// The own room first, then rooms without members in name order, as Java does; the order
	// matters only if inner fails.
	own := groups[clientRoom[index]] // a copy: groups is sorted below
	if len(own.queues) > 0 {
		if err := share(own, own.clients); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(groups, func(a, b roomGroup) int { return strings.Compare(a.room, b.room) })
	for _, g := range groups {
		if len(g.clients) == 0 {
			if err := share(g, req.ClientIDs); err != nil {
				return nil, err
			}
		}
	}
	if out == nil {
		return none(), nil
	}
	slices.SortFunc(out, compareQueues)
	return out, nil
}

// roomGroup is one room's queues and members, in input order.
type roomGroup struct {
	room    string
	nq, nc  int
	queues  []protocol.MessageQueue
	clients []string
}

// roomGroups numbers rooms in order of first appearance.
type roomGroups struct {
	groups []roomGroup
	byName map[string]int
	last   int // the room of the previous call: neighbours usually share one
}

func (r *roomGroups) of(room string) int {
	if r.last >= 0 && r.groups[r.last].room == room {
		return r.last
	}
	g, ok := r.byName[room]
	if !ok {
		g = len(r.groups)
		r.byName[room] = g
		r.groups = append(r.groups, roomGroup{room: room})
	}
	r.last = g
	return g
}

// carve reserves the next n slots of s's spare capacity: part is empty with room for
// exactly n appends, and s grows past it.
func carve[T any](s []T, n int) (part, grown []T) {
	return s[len(s) : len(s) : len(s)+n], s[:len(s)+n]
}
