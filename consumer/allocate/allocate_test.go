package allocate

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// queueList returns n queues of topic "T" on "broker-a", ids 0..n-1: sorted.
func queueList(n int) []protocol.MessageQueue {
	qs := make([]protocol.MessageQueue, n)
	for i := range qs {
		qs[i] = protocol.MessageQueue{Topic: "T", BrokerName: "broker-a", QueueID: i}
	}
	return qs
}

// clientList returns n sorted client ids c000, c001, ...
func clientList(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("c%03d", i)
	}
	return ids
}

// queueIDs projects queues to their ids, for readable assertions.
func queueIDs(qs []protocol.MessageQueue) []int {
	out := make([]int, len(qs))
	for i, q := range qs {
		out[i] = q.QueueID
	}
	return out
}

// allocateAll runs s for every member of req's group and returns each member's share.
func allocateAll(t testing.TB, s Strategy, req Request) map[string][]protocol.MessageQueue {
	t.Helper()
	out := make(map[string][]protocol.MessageQueue, len(req.ClientIDs))
	for _, id := range req.ClientIDs {
		req.ClientID = id
		got, err := s.Allocate(context.Background(), req)
		require.NoError(t, err, "%s for %s", s.Name(), id)
		out[id] = got
	}
	return out
}

func TestValidate(t *testing.T) {
	good := Request{Group: "g", ClientID: "b", Queues: queueList(3), ClientIDs: []string{"a", "b", "c"}}
	tests := []struct {
		name    string
		mutate  func(*Request)
		index   int
		errPart string // "" for no error
	}{
		{name: "member", mutate: func(*Request) {}, index: 1},
		{name: "first member", mutate: func(r *Request) { r.ClientID = "a" }, index: 0},
		{name: "last member", mutate: func(r *Request) { r.ClientID = "c" }, index: 2},
		{name: "not a member", mutate: func(r *Request) { r.ClientID = "zz" }, index: -1},
		{name: "empty client id", mutate: func(r *Request) { r.ClientID = "" }, errPart: "empty ClientID"},
		{name: "nil queues", mutate: func(r *Request) { r.Queues = nil }, errPart: "no queues"},
		{name: "empty queues", mutate: func(r *Request) { r.Queues = []protocol.MessageQueue{} }, errPart: "no queues"},
		{name: "nil client ids", mutate: func(r *Request) { r.ClientIDs = nil }, errPart: "no client ids"},
		{name: "empty id in list", mutate: func(r *Request) { r.ClientIDs = []string{"", "b"} }, errPart: "empty id in ClientIDs"},
		{name: "unsorted queues", mutate: func(r *Request) {
			r.Queues = []protocol.MessageQueue{{Topic: "T", BrokerName: "b", QueueID: 1}, {Topic: "T", BrokerName: "a", QueueID: 2}}
		}, errPart: "Queues not sorted or duplicated at 1"},
		{name: "duplicate queue", mutate: func(r *Request) { r.Queues = []protocol.MessageQueue{r.Queues[0], r.Queues[0]} }, errPart: "Queues not sorted or duplicated"},
		{name: "unsorted client ids", mutate: func(r *Request) { r.ClientIDs = []string{"b", "a"} }, errPart: `ClientIDs not sorted or duplicated at 1: "b" then "a"`},
		{name: "duplicate client id", mutate: func(r *Request) { r.ClientIDs = []string{"a", "b", "b"} }, errPart: "ClientIDs not sorted or duplicated at 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := good
			tt.mutate(&req)
			index, err := Validate(req)
			if tt.errPart != "" {
				require.ErrorIs(t, err, ErrInvalidRequest)
				assert.Contains(t, err.Error(), tt.errPart)
				assert.Contains(t, err.Error(), `group "g"`)
				assert.Equal(t, -1, index)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.index, index)
		})
	}
}

// everyStrategy is one of each strategy, configured to cover the queues of
// propertyQueues. Used by the tests that hold for all of them.
func everyStrategy() []Strategy {
	return []Strategy{
		Averagely(),
		ByCircle(),
		ByConfig(queueList(2)),
		ByMachineRoom([]string{"r0", "r1", "r2"}),
		MachineRoomNearby(Averagely(), prefixResolver{}),
		MachineRoomNearby(ByCircle(), prefixResolver{}),
		MachineRoomNearby(Sticky(Averagely()), prefixResolver{}),
		ConsistentHash(0),
		ConsistentHash(3),
		ByWeight(map[string]int{"r1-c001": 0, "r0-c002": 3}),
		Sticky(Averagely()),
		Sticky(ConsistentHash(0)),
	}
}

// Every strategy shares the request validation: errors wrap ErrInvalidRequest and name
// what was wrong, and a non-member gets an empty, non-nil result.
func TestSharedValidation(t *testing.T) {
	good := Request{Group: "g", ClientID: "r0-c000", Queues: propertyQueues(4), ClientIDs: []string{"r0-c000", "r1-c001"}}
	bad := []struct {
		name    string
		mutate  func(*Request)
		errPart string
	}{
		{"empty client id", func(r *Request) { r.ClientID = "" }, "empty ClientID"},
		{"no queues", func(r *Request) { r.Queues = nil }, "no queues"},
		{"no client ids", func(r *Request) { r.ClientIDs = nil }, "no client ids"},
		{"unsorted client ids", func(r *Request) { r.ClientIDs = []string{"r1-c001", "r0-c000"} }, "ClientIDs not sorted"},
	}
	for _, s := range everyStrategy() {
		t.Run(s.Name(), func(t *testing.T) {
			for _, tt := range bad {
				req := good
				tt.mutate(&req)
				got, err := s.Allocate(context.Background(), req)
				require.ErrorIs(t, err, ErrInvalidRequest, tt.name)
				assert.Contains(t, err.Error(), tt.errPart, tt.name)
				assert.Nil(t, got, tt.name)
			}

			req := good
			req.ClientID = "zz-stranger"
			got, err := s.Allocate(context.Background(), req)
			require.NoError(t, err)
			assert.NotNil(t, got)
			assert.Empty(t, got)

			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_, err = s.Allocate(ctx, good)
			assert.ErrorIs(t, err, context.Canceled)
		})
	}
}

// RocketMQ's documented allocation vectors, exactly.
func TestSpecVectors(t *testing.T) {
	tests := []struct {
		name     string
		strategy Strategy
		nq, nc   int
		want     [][]int // per member, in member order; nil to check only member `member`
		member   int     // 0-based, with wantOne
		wantOne  []int
	}{
		{name: "avg 10/4", strategy: Averagely(), nq: 10, nc: 4, want: [][]int{{0, 1, 2}, {3, 4, 5}, {6, 7}, {8, 9}}},
		{name: "avg 6q client 1 of 2", strategy: Averagely(), nq: 6, nc: 2, member: 0, wantOne: []int{0, 1, 2}},
		{name: "avg 6q client 2 of 3", strategy: Averagely(), nq: 6, nc: 3, member: 1, wantOne: []int{2, 3}},
		{name: "avg 6q client 2 of 4", strategy: Averagely(), nq: 6, nc: 4, member: 1, wantOne: []int{2, 3}},
		{name: "avg 6q client 4 of 4", strategy: Averagely(), nq: 6, nc: 4, member: 3, wantOne: []int{5}},
		{name: "avg 6q client 7 of 7", strategy: Averagely(), nq: 6, nc: 7, member: 6, wantOne: []int{}},
		{name: "avg 3/5", strategy: Averagely(), nq: 3, nc: 5, want: [][]int{{0}, {1}, {2}, {}, {}}},
		{name: "circle 10/4", strategy: ByCircle(), nq: 10, nc: 4, want: [][]int{{0, 4, 8}, {1, 5, 9}, {2, 6}, {3, 7}}},
		{name: "circle 6q client 1 of 2", strategy: ByCircle(), nq: 6, nc: 2, member: 0, wantOne: []int{0, 2, 4}},
		{name: "circle 6q client 2 of 3", strategy: ByCircle(), nq: 6, nc: 3, member: 1, wantOne: []int{1, 4}},
		{name: "circle 2/4", strategy: ByCircle(), nq: 2, nc: 4, want: [][]int{{0}, {1}, {}, {}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := Request{Group: "g", Queues: queueList(tt.nq), ClientIDs: clientList(tt.nc)}
			if tt.want == nil {
				req.ClientID = req.ClientIDs[tt.member]
				got, err := tt.strategy.Allocate(context.Background(), req)
				require.NoError(t, err)
				assert.Equal(t, tt.wantOne, queueIDs(got))
				return
			}
			all := allocateAll(t, tt.strategy, req)
			for i, id := range req.ClientIDs {
				assert.Equal(t, tt.want[i], queueIDs(all[id]), "member %d", i)
			}
		})
	}

	t.Run("machine room", func(t *testing.T) {
		var qs []protocol.MessageQueue
		for i := range 10 {
			broker := "room1@broker-a"
			if i >= 5 {
				broker = "room2@broker-b"
			}
			qs = append(qs, protocol.MessageQueue{Topic: "T", BrokerName: broker, QueueID: i})
		}
		all := allocateAll(t, ByMachineRoom([]string{"room1"}), Request{Group: "g", Queues: qs, ClientIDs: clientList(2)})
		assert.Equal(t, []int{0, 1, 4}, queueIDs(all["c000"]))
		assert.Equal(t, []int{2, 3}, queueIDs(all["c001"]))
	})
}

func TestByConfig(t *testing.T) {
	conf := []protocol.MessageQueue{
		{Topic: "T", BrokerName: "broker-b", QueueID: 7},
		{Topic: "T", BrokerName: "broker-a", QueueID: 1},
	}
	s := ByConfig(conf)
	conf[0].QueueID = 99 // the strategy kept a copy

	req := Request{Group: "g", Queues: queueList(4), ClientIDs: clientList(3)}
	all := allocateAll(t, s, req)
	for _, id := range req.ClientIDs {
		// Configured order, not queue order; not intersected with req.Queues.
		assert.Equal(t, []int{7, 1}, queueIDs(all[id]), id)
	}
	all["c000"][0].QueueID = -1 // results are fresh
	assert.Equal(t, []int{7, 1}, queueIDs(all["c001"]))

	got, err := ByConfig(nil).Allocate(context.Background(), Request{ClientID: "c000", Queues: queueList(1), ClientIDs: clientList(1)})
	require.NoError(t, err)
	assert.NotNil(t, got)
	assert.Empty(t, got)
}

func TestNames(t *testing.T) {
	tests := []struct {
		s    Strategy
		want string
	}{
		{Averagely(), "AVG"},
		{ByCircle(), "AVG_BY_CIRCLE"},
		{ByConfig(nil), "CONFIG"},
		{ByMachineRoom(nil), "MACHINE_ROOM"},
		{MachineRoomNearby(Averagely(), prefixResolver{}), "MACHINE_ROOM_NEARBY-AVG"},
		{MachineRoomNearby(ConsistentHash(5), prefixResolver{}), "MACHINE_ROOM_NEARBY-CONSISTENT_HASH"},
		{ConsistentHash(0), "CONSISTENT_HASH"},
		{ByWeight(nil), "WEIGHT"},
		{Sticky(Averagely()), "STICKY-AVG"},
		{Sticky(MachineRoomNearby(ByCircle(), prefixResolver{})), "STICKY-MACHINE_ROOM_NEARBY-AVG_BY_CIRCLE"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, tt.s.Name())
	}
}

func TestByName(t *testing.T) {
	for _, name := range []string{"AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH", "STICKY-AVG", "STICKY-CONSISTENT_HASH", "STICKY-STICKY-AVG_BY_CIRCLE"} {
		s, err := ByName(name)
		require.NoError(t, err, name)
		assert.Equal(t, name, s.Name())
	}
	ch, err := ByName("CONSISTENT_HASH")
	require.NoError(t, err)
	assert.Equal(t, DefaultVirtualNodes, ch.(consistentHash).vnodes)

	for _, name := range []string{"", "avg", "CONFIG", "MACHINE_ROOM", "WEIGHT", "STICKY-", "STICKY-avg", "MACHINE_ROOM_NEARBY-AVG", "NOPE"} {
		s, err := ByName(name)
		require.ErrorIs(t, err, ErrUnknownStrategy, name)
		assert.Contains(t, err.Error(), fmt.Sprintf("%q", name))
		assert.Nil(t, s)
	}
}

func TestNilInnerPanics(t *testing.T) {
	assert.PanicsWithValue(t, "allocate: Sticky with nil inner strategy", func() { Sticky(nil) })
	assert.PanicsWithValue(t, "allocate: MachineRoomNearby with nil inner strategy", func() { MachineRoomNearby(nil, prefixResolver{}) })
	assert.PanicsWithValue(t, "allocate: MachineRoomNearby with nil RoomResolver", func() { MachineRoomNearby(Averagely(), nil) })
}

// Strategies are values with no mutable state: one may serve many goroutines (run with -race).
func TestConcurrentUse(t *testing.T) {
	req := Request{Group: "g", Queues: propertyQueues(64), ClientIDs: propertyClients(7)}
	req.Previous = allocateAll(t, Averagely(), Request{Group: "g", Queues: req.Queues, ClientIDs: propertyClients(6)})
	for _, s := range everyStrategy() {
		want := allocateAll(t, s, req)
		t.Run(s.Name(), func(t *testing.T) {
			t.Parallel()
			done := make(chan map[string][]protocol.MessageQueue)
			for range 8 {
				go func() {
					out := make(map[string][]protocol.MessageQueue)
					for _, id := range req.ClientIDs {
						r := req
						r.ClientID = id
						got, err := s.Allocate(context.Background(), r)
						if err != nil {
							panic(err)
						}
						out[id] = got
					}
					done <- out
				}()
			}
			for range 8 {
				assert.Equal(t, want, <-done)
			}
		})
	}
}

// prefixResolver puts "room@broker" brokers in "room" and "room-rest" clients in "room".
type prefixResolver struct{}

func (prefixResolver) BrokerRoom(q protocol.MessageQueue) string {
	room, _, _ := strings.Cut(q.BrokerName, "@")
	return room
}

func (prefixResolver) ClientRoom(id string) string {
	room, _, _ := strings.Cut(id, "-")
	return room
}

// compareQueues and queueBefore are protocol.MessageQueue.Compare, only faster.
func TestCompareQueuesMatchesProtocol(t *testing.T) {
	parts := []string{"", "a", "b", "ab", "ba", "主题", "room1@broker-a"}
	var qs []protocol.MessageQueue
	for _, topic := range parts {
		for _, broker := range parts {
			for _, id := range []int{-1, 0, 1, 7} {
				qs = append(qs, protocol.MessageQueue{Topic: topic, BrokerName: broker, QueueID: id})
			}
		}
	}
	for _, a := range qs {
		for _, b := range qs {
			want := a.Compare(b)
			require.Equal(t, want, compareQueues(a, b), "%v vs %v", a, b)
			require.Equal(t, want < 0, queueBefore(&a, &b), "%v vs %v", a, b)
		}
	}
}
