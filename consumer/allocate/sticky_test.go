package allocate

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// qset builds a queue list from ids of queueList's queues.
func qset(ids ...int) []protocol.MessageQueue {
	out := make([]protocol.MessageQueue, len(ids))
	for i, id := range ids {
		out[i] = protocol.MessageQueue{Topic: "T", BrokerName: "broker-a", QueueID: id}
	}
	return out
}

func TestStickyVectors(t *testing.T) {
	tests := []struct {
		name    string
		nq      int
		members []string
		prev    map[string][]protocol.MessageQueue
		want    map[string][]int
	}{
		{
			// Averagely would give c001 [0..4] and c002 [5..8], moving 5 as well.
			name:    "leave: only the leaver's queues move",
			nq:      9,
			members: []string{"c001", "c002"},
			prev:    map[string][]protocol.MessageQueue{"c000": qset(0, 1, 2), "c001": qset(3, 4, 5), "c002": qset(6, 7, 8)},
			want:    map[string][]int{"c001": {0, 1, 3, 4, 5}, "c002": {2, 6, 7, 8}},
		},
		{
			// Averagely would give [0 1 2] [3 4] [5 6] [7 8], moving 5, 7 and 8.
			name:    "join: the joiner takes one surplus queue from each",
			nq:      9,
			members: []string{"c000", "c001", "c002", "c003"},
			prev:    map[string][]protocol.MessageQueue{"c000": qset(0, 1, 2), "c001": qset(3, 4, 5), "c002": qset(6, 7, 8)},
			want:    map[string][]int{"c000": {0, 1, 2}, "c001": {3, 4}, "c002": {6, 7}, "c003": {5, 8}},
		},
		{
			name:    "the extra queue goes to the member holding most, not the first",
			nq:      5,
			members: []string{"c000", "c001"},
			prev:    map[string][]protocol.MessageQueue{"c000": qset(0), "c001": qset(1, 2, 3, 4)},
			want:    map[string][]int{"c000": {0, 4}, "c001": {1, 2, 3}},
		},
		{
			name:    "new queues fill members below their count, in member order",
			nq:      6,
			members: []string{"c000", "c001", "c002"},
			prev:    map[string][]protocol.MessageQueue{"c000": qset(0), "c001": qset(1), "c002": qset(2)},
			want:    map[string][]int{"c000": {0, 3}, "c001": {1, 4}, "c002": {2, 5}},
		},
		{
			name:    "queues that vanished and unknown members are ignored",
			nq:      4,
			members: []string{"c000", "c001"},
			prev:    map[string][]protocol.MessageQueue{"c000": qset(3, 9, 10), "c001": qset(11), "zz": qset(0, 1)},
			want:    map[string][]int{"c000": {0, 3}, "c001": {1, 2}},
		},
		{
			name:    "a queue claimed twice goes to the earlier member",
			nq:      4,
			members: []string{"c000", "c001"},
			prev:    map[string][]protocol.MessageQueue{"c000": qset(2), "c001": qset(2, 3)},
			want:    map[string][]int{"c000": {0, 2}, "c001": {1, 3}},
		},
		{
			name:    "previous lists need not be sorted",
			nq:      4,
			members: []string{"c000", "c001"},
			prev:    map[string][]protocol.MessageQueue{"c000": qset(3, 1, 2)},
			want:    map[string][]int{"c000": {1, 2}, "c001": {0, 3}},
		},
		{
			name:    "more members than queues",
			nq:      2,
			members: []string{"c000", "c001", "c002"},
			prev:    map[string][]protocol.MessageQueue{"c002": qset(0, 1)},
			want:    map[string][]int{"c000": {1}, "c001": {}, "c002": {0}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			all := allocateAll(t, Sticky(Averagely()), Request{Group: "g", Queues: queueList(tt.nq), ClientIDs: tt.members, Previous: tt.prev})
			got := make(map[string][]int, len(all))
			for id, qs := range all {
				got[id] = queueIDs(qs)
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

// Without usable history the inner strategy decides.
func TestStickyFallsBackToInner(t *testing.T) {
	req := Request{Group: "g", Queues: propertyQueues(20), ClientIDs: propertyClients(3)}
	for _, inner := range []Strategy{Averagely(), ByCircle(), ConsistentHash(0)} {
		want := allocateAll(t, inner, req)
		for _, prev := range []map[string][]protocol.MessageQueue{
			nil,
			{},
			{"zz-gone": req.Queues},              // only departed members
			{req.ClientIDs[0]: qset(1000, 1001)}, // only vanished queues
			{req.ClientIDs[0]: nil, req.ClientIDs[1]: {}}, // empty lists
		} {
			r := req
			r.Previous = prev
			assert.Equal(t, want, allocateAll(t, Sticky(inner), r), "%s with %v", inner.Name(), prev)
		}
	}
}

// An inner error on the fallback path is returned as is.
func TestStickyInnerError(t *testing.T) {
	_, err := Sticky(ByWeight(map[string]int{"a": -1})).Allocate(context.Background(),
		Request{Group: "g", ClientID: "a", Queues: queueList(2), ClientIDs: []string{"a"}})
	assert.ErrorIs(t, err, ErrInvalidConfig)
}

// moved counts queues that had an owner in prev and have a different one (or none) in next.
func moved(prev, next map[string][]protocol.MessageQueue) int {
	before, after := ownerOf(prev), ownerOf(next)
	n := 0
	for q, was := range before {
		if after[q] != was {
			n++
		}
	}
	return n
}

// fewestMoves is the lower bound on moves for a balanced assignment of queues among members,
// given who held what: the queues held by anyone, minus the most that can stay, which is
// Σ min(held, nq/nc) plus one for each of the nq%nc extra slots given to a member holding
// more than nq/nc. Computed independently of the strategy's code.
func fewestMoves(prev map[string][]protocol.MessageQueue, queues []protocol.MessageQueue, members []string) int {
	nq, nc := len(queues), len(members)
	base := nq / nc
	held := 0
	for _, qs := range prev {
		held += len(qs)
	}
	stay, over := 0, 0
	for _, m := range members {
		h := len(prev[m])
		stay += min(h, base)
		if h > base {
			over++
		}
	}
	return held - stay - min(nq%nc, over)
}

// Across membership changes (one leaves, one joins, several at once), starting from either
// an averagely assignment or a sticky history, Sticky moves exactly the fewest queues a
// balanced assignment can, never more than Averagely, and stays balanced.
func TestStickyMovesFewest(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	sticky, avg := Sticky(Averagely()), Averagely()
	for nq := 1; nq <= 40; nq++ {
		for nc := 1; nc <= 10; nc++ {
			queues := queueList(nq)
			members := clientList(nc)
			// Two starting points: a fresh averagely assignment, and one that already went
			// through sticky rebalances (not contiguous any more).
			starts := []map[string][]protocol.MessageQueue{
				allocateAll(t, avg, Request{Group: "g", Queues: queues, ClientIDs: members}),
			}
			churned := starts[0]
			for range 3 {
				next := slices.Clone(members)
				next = append(next, fmt.Sprintf("c%03d", 100+rng.IntN(100)))
				slices.Sort(next)
				next = slices.Compact(next)
				churned = allocateAll(t, sticky, Request{Group: "g", Queues: queues, ClientIDs: next, Previous: churned})
				churned = allocateAll(t, sticky, Request{Group: "g", Queues: queues, ClientIDs: members, Previous: churned})
			}
			starts = append(starts, churned)

			var changes [][]string
			for i := range members { // each member leaving
				if nc > 1 {
					changes = append(changes, slices.Delete(slices.Clone(members), i, i+1))
				}
			}
			for _, joiner := range []string{"a", "c000a", "zz"} { // a member joining at each end and inside
				grown := append(slices.Clone(members), joiner)
				slices.Sort(grown)
				changes = append(changes, grown)
			}
			if nc > 2 { // two leave, two join
				mixed := append(slices.Clone(members[1:nc-1]), "b", "zz")
				slices.Sort(mixed)
				changes = append(changes, mixed)
			}

			for si, prev := range starts {
				for _, next := range changes {
					name := fmt.Sprintf("nq=%d nc=%d start=%d next=%v", nq, nc, si, next)
					req := Request{Group: "g", Queues: queues, ClientIDs: next, Previous: prev}
					got := allocateAll(t, sticky, req)
					require.True(t, balanced(got, nq, len(next)), "%s: unbalanced %v", name, got)
					m := moved(prev, got)
					require.Equal(t, fewestMoves(prev, queues, next), m, "%s", name)
					require.LessOrEqual(t, m, moved(prev, allocateAll(t, avg, req)), "%s", name)
				}
			}
		}
	}
}

// With an unchanged group and unchanged queues, a sticky assignment is a fixed point.
func TestStickyIsStable(t *testing.T) {
	req := Request{Group: "g", Queues: propertyQueues(37), ClientIDs: propertyClients(5)}
	req.Previous = allocateAll(t, ConsistentHash(0), req)
	first := allocateAll(t, Sticky(ConsistentHash(0)), req)
	req.Previous = first
	assert.Equal(t, first, allocateAll(t, Sticky(ConsistentHash(0)), req))
}
