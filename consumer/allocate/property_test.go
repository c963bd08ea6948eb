package allocate

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// propertyQueues returns n sorted queues spread round robin over brokers r0@broker-0,
// r1@broker-1 and r2@broker-2 (rooms r0..r2).
func propertyQueues(n int) []protocol.MessageQueue {
	qs := make([]protocol.MessageQueue, n)
	for k := range qs {
		qs[k] = protocol.MessageQueue{Topic: "T", BrokerName: fmt.Sprintf("r%d@broker-%d", k%3, k%3), QueueID: k / 3}
	}
	slices.SortFunc(qs, protocol.MessageQueue.Compare)
	return qs
}

// propertyClients returns n sorted client ids "r<c%2>-c<c>": members live in rooms r0 and r1
// only, so room r2's queues are orphans for MachineRoomNearby.
func propertyClients(n int) []string {
	ids := make([]string, n)
	for c := range ids {
		ids[c] = fmt.Sprintf("r%d-c%03d", c%2, c)
	}
	slices.Sort(ids)
	return ids
}

// messyPrevious is a plausible but untidy history for req: the averagely assignment of a
// group that had one more member (now gone), one member also claiming another's queue, and
// an entry for an unknown client naming an unknown queue.
func messyPrevious(t testing.TB, req Request) map[string][]protocol.MessageQueue {
	t.Helper()
	prev := allocateAll(t, Averagely(), Request{Group: req.Group, Queues: req.Queues, ClientIDs: propertyClients(len(req.ClientIDs) + 1)})
	if len(req.ClientIDs) > 1 {
		a, b := req.ClientIDs[0], req.ClientIDs[1]
		if len(prev[b]) > 0 {
			prev[a] = append(slices.Clone(prev[a]), prev[b][0])
		}
	}
	prev["zz-gone"] = []protocol.MessageQueue{{Topic: "gone", BrokerName: "gone", QueueID: 1}}
	return prev
}

func cloneRequest(r Request) Request {
	c := r
	c.Queues = slices.Clone(r.Queues)
	c.ClientIDs = slices.Clone(r.ClientIDs)
	if r.Previous != nil {
		c.Previous = make(map[string][]protocol.MessageQueue, len(r.Previous))
		for k, v := range r.Previous {
			c.Previous[k] = slices.Clone(v)
		}
	}
	return c
}

// balanced reports whether every member has nq/nc or nq/nc+1 queues, exactly nq%nc of them
// the larger number.
func balanced(all map[string][]protocol.MessageQueue, nq, nc int) bool {
	bigger := 0
	for _, qs := range all {
		switch len(qs) {
		case nq / nc:
		case nq/nc + 1:
			bigger++
		default:
			return false
		}
	}
	return bigger == nq%nc
}

// The properties every strategy must have, over many group shapes, with and without history.
func TestProperties(t *testing.T) {
	type shape struct{ nq, nc int }
	var shapes []shape
	for nq := 1; nq <= 30; nq++ {
		for nc := 1; nc <= 12; nc++ {
			shapes = append(shapes, shape{nq, nc})
		}
	}
	shapes = append(shapes, shape{100, 7}, shape{257, 16}, shape{8, 40})

	for _, s := range everyStrategy() {
		t.Run(s.Name(), func(t *testing.T) {
			for _, sh := range shapes {
				for _, history := range []bool{false, true} {
					name := fmt.Sprintf("nq=%d/nc=%d/history=%v", sh.nq, sh.nc, history)
					checkProperties(t, s, sh.nq, sh.nc, history, name)
				}
			}
		})
	}
}

func checkProperties(t *testing.T, s Strategy, nq, nc int, history bool, name string) {
	t.Helper()
	req := Request{Group: "g", Queues: propertyQueues(nq), ClientIDs: propertyClients(nc)}
	if history {
		req.Previous = messyPrevious(t, req)
	}
	before := cloneRequest(req)
	_, isConfig := s.(byConfig)

	all := make(map[string][]protocol.MessageQueue, nc)
	for _, id := range req.ClientIDs {
		r := req
		r.ClientID = id
		got, err := s.Allocate(context.Background(), r)
		require.NoError(t, err, name)
		require.NotNil(t, got, name)
		again, err := s.Allocate(context.Background(), r)
		require.NoError(t, err, name)
		require.Equal(t, got, again, "%s: not deterministic for %s", name, id)
		if !isConfig {
			require.True(t, slices.IsSortedFunc(got, protocol.MessageQueue.Compare), "%s: %s not in queue order: %v", name, id, got)
		}
		all[id] = got
	}

	r := req
	r.ClientID = "zz-stranger"
	got, err := s.Allocate(context.Background(), r)
	require.NoError(t, err, name)
	require.NotNil(t, got, name)
	require.Empty(t, got, "%s: a non-member got queues", name)

	if isConfig {
		for id, qs := range all {
			require.Equal(t, queueList(2), qs, "%s: %s", name, id)
		}
	} else {
		owner := make(map[protocol.MessageQueue]string, nq)
		for id, qs := range all {
			for _, q := range qs {
				_, known := slices.BinarySearchFunc(req.Queues, q, protocol.MessageQueue.Compare)
				require.True(t, known, "%s: %s got unknown queue %v", name, id, q)
				prev, dup := owner[q]
				require.False(t, dup, "%s: %v given to both %s and %s", name, q, prev, id)
				owner[q] = id
			}
		}
		require.Len(t, owner, nq, "%s: not every queue assigned", name)
	}

	switch {
	case s.Name() == NameAveragely, s.Name() == NameByCircle,
		s.Name() == PrefixSticky+NameAveragely,
		history && s.Name() == PrefixSticky+NameConsistentHash:
		require.True(t, balanced(all, nq, nc), "%s: not balanced: %v", name, all)
	}

	// Results are fresh: scribbling on them must not reach the inputs, and the strategy must
	// not have touched the inputs either.
	for _, qs := range all {
		for i := range qs {
			qs[i] = protocol.MessageQueue{Topic: "scribble"}
		}
	}
	require.Equal(t, before, req, "%s: inputs modified", name)
}
