package allocate

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// lockSim is a consumer group that allocates the way flowd's consumers do with hand-over
// locks: a queue belongs to whoever holds its lock, the lock table is the previous assignment
// every member reads, and a member acts on the share it computed when it last read the table,
// which may be stale by the time it acts.
type lockSim struct {
	t       *testing.T
	s       Strategy
	queues  []protocol.MessageQueue
	members []string // sorted
	owner   map[protocol.MessageQueue]string
	share   map[string][]protocol.MessageQueue // computed at each member's last read
}

// table is the lock table as the broker answers it: client id → queues held, sorted.
func (s *lockSim) table() map[string][]protocol.MessageQueue {
	out := map[string][]protocol.MessageQueue{}
	for mq, id := range s.owner {
		out[id] = append(out[id], mq)
	}
	for _, qs := range out {
		slices.SortFunc(qs, protocol.MessageQueue.Compare)
	}
	return out
}

func (s *lockSim) allocate(id string) []protocol.MessageQueue {
	req := Request{Group: "g", ClientID: id, Queues: s.queues, ClientIDs: s.members, Previous: s.table()}
	got, err := s.s.Allocate(context.Background(), req)
	require.NoError(s.t, err)
	return got
}

// read is a member's rebalance reading the member list and the lock table.
func (s *lockSim) read(id string) { s.share[id] = s.allocate(id) }

// act is the member acting on its last read: it releases the queues it holds that are not in
// its share and locks the free ones that are (a held lock cannot be taken). It reports
// whether the table changed.
func (s *lockSim) act(id string) bool {
	changed := false
	want := map[protocol.MessageQueue]bool{}
	for _, mq := range s.share[id] {
		want[mq] = true
	}
	for mq, holder := range s.owner {
		if holder == id && !want[mq] {
			delete(s.owner, mq)
			changed = true
		}
	}
	for _, mq := range s.share[id] {
		if _, held := s.owner[mq]; !held {
			s.owner[mq] = id
			changed = true
		}
	}
	return changed
}

func (s *lockSim) join(id string) {
	if !slices.Contains(s.members, id) {
		s.members = append(s.members, id)
		slices.Sort(s.members)
	}
}

// leave is a member's connection closing: the broker releases its locks.
func (s *lockSim) leave(id string) {
	s.members = slices.DeleteFunc(s.members, func(m string) bool { return m == id })
	delete(s.share, id)
	maps.DeleteFunc(s.owner, func(_ protocol.MessageQueue, holder string) bool { return holder == id })
}

// TestSharedLockTableConverges: members see arbitrary subsets of the intermediate states of
// random join and leave sequences (each reads the table and acts at its own moments, possibly
// on a stale read), but all read their previous assignment from the one lock table. Once the
// membership stops changing and every member keeps rebalancing, the table reaches a fixed
// point of the strategy in which every queue has exactly one owner, for every built-in
// strategy that shares queues (ByConfig gives every member the same list on purpose).
func TestSharedLockTableConverges(t *testing.T) {
	pool := propertyClients(7)
	for _, strategy := range everyStrategy() {
		if _, isConfig := strategy.(byConfig); isConfig {
			continue
		}
		t.Run(strategy.Name(), func(t *testing.T) {
			for seed := range uint64(150) {
				rng := rand.New(rand.NewPCG(seed, 0x5eed))
				nq := 1 + rng.IntN(24)
				sim := &lockSim{t: t, s: strategy, queues: propertyQueues(nq), owner: map[protocol.MessageQueue]string{}, share: map[string][]protocol.MessageQueue{}}
				// pool[2] never leaves: ByWeight gives it the only non-zero weight.
				sim.join(pool[2])
				for _, id := range pool[:1+rng.IntN(len(pool))] {
					sim.join(id)
				}
				var trace []string
				for range 60 {
					switch r := rng.IntN(10); {
					case r == 0:
						id := pool[rng.IntN(len(pool))]
						sim.join(id)
						trace = append(trace, "join "+id)
					case r == 1 && len(sim.members) > 1:
						id := sim.members[rng.IntN(len(sim.members))]
						if id == pool[2] {
							continue
						}
						sim.leave(id)
						trace = append(trace, "leave "+id)
					case r < 6:
						id := sim.members[rng.IntN(len(sim.members))]
						sim.read(id)
						trace = append(trace, "read "+id)
					default:
						id := sim.members[rng.IntN(len(sim.members))]
						sim.act(id)
						trace = append(trace, "act "+id)
					}
				}
				name := fmt.Sprintf("seed %d, %d queues, members %v, trace %v", seed, nq, sim.members, trace)

				// Membership is stable now; every member rebalances (reads, then acts) in turn
				// until a whole round changes nothing.
				converged := false
				for round := 0; round < 4*nq+10 && !converged; round++ {
					converged = true
					for _, i := range rng.Perm(len(sim.members)) {
						id := sim.members[i]
						sim.read(id)
						if sim.act(id) {
							converged = false
						}
					}
				}
				require.True(t, converged, "%s: no fixed point", name)

				require.Len(t, sim.owner, nq, "%s: a queue is owned by nobody: %v", name, sim.table())
				final := sim.table()
				for holder := range final {
					require.Contains(t, sim.members, holder, "%s", name)
				}
				for _, id := range sim.members {
					require.Equal(t, nonNil(final[id]), nonNil(sim.allocate(id)), "%s: %s holds other queues than its share", name, id)
				}
			}
		})
	}
}

func nonNil(qs []protocol.MessageQueue) []protocol.MessageQueue {
	if qs == nil {
		return []protocol.MessageQueue{}
	}
	return qs
}

// TestStickyFromTable: from a lock table, holders keep their queues up to their quota (the
// queues lowest in queue order first), the quota's extra queue goes to the members holding
// the most, and free queues go in queue order to the members below quota in member order; a
// balanced complete table is a fixed point.
func TestStickyFromTable(t *testing.T) {
	qs := queueList(7)
	s := Sticky(Averagely())
	ids := []string{"a", "b", "c"}
	table := map[string][]protocol.MessageQueue{
		"a": {qs[0], qs[1], qs[2], qs[3]}, // over quota: keeps 3 (most held, so the extra)
		"c": {qs[6]},
		"x": {qs[4]}, // departed: ignored, its queue is free
	}
	all := allocateAll(t, s, Request{Group: "g", Queues: qs, ClientIDs: ids, Previous: table})
	require.Equal(t, map[string][]int{"a": {0, 1, 2}, "b": {3, 4}, "c": {5, 6}}, map[string][]int{
		"a": queueIDs(all["a"]), "b": queueIDs(all["b"]), "c": queueIDs(all["c"]),
	})
	again := allocateAll(t, s, Request{Group: "g", Queues: qs, ClientIDs: ids, Previous: all})
	require.Equal(t, all, again, "a balanced, complete table is a fixed point")
}
