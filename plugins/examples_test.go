package plugins

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/consumer/allocate"
	"github.com/flowd-io/flowd/protocol"
)

func TestJSONFilterExample(t *testing.T) {
	wasm := goGuest(t, jsonFilterPkg)
	rt := newRuntime(t)
	m := manifest("big-orders", KindFilter, wasm, map[string]string{"threshold": "100"})
	m.WantsBody = true
	f := NewFilter(load(t, rt, m, wasm))

	bodies := map[string]bool{
		`{"amount": 150}`:                      true,
		`{"amount":100}`:                       false,
		`{"id": "x", "amount" : 100.5, "q":1}`: true,
		`{"amount": -500}`:                     false,
		`{"total": 500}`:                       false,
		`not json`:                             false,
		``:                                     false,
		`{"amount": "lots"}`:                   false,
	}
	var msgs []Message
	var want []bool
	// More than MaxBatch messages: the batch is split, and verdicts must line up.
	for i := 0; len(msgs) < 2*MaxBatch+37; i++ {
		for body, keep := range bodies {
			msgs = append(msgs, Message{Topic: "orders", QueueID: int32(i % 4), QueueOffset: int64(i), Tags: "t", Body: []byte(body)})
			want = append(want, keep)
		}
	}
	keep := make([]bool, len(msgs))
	require.NoError(t, f.Match(context.Background(), msgs, keep))
	require.Equal(t, want, keep)
}

func TestJSONFilterExampleWithoutBodiesKeepsNothing(t *testing.T) {
	wasm := goGuest(t, jsonFilterPkg)
	rt := newRuntime(t)
	m := manifest("big-orders", KindFilter, wasm, map[string]string{"threshold": "100"})
	f := NewFilter(load(t, rt, m, wasm)) // wants_body false: the guest sees empty bodies
	keep := []bool{true}
	require.NoError(t, f.Match(context.Background(), []Message{{Topic: "orders", Body: []byte(`{"amount": 150}`)}}, keep))
	require.False(t, keep[0])
}

func TestJSONFilterExampleRefusesMissingThreshold(t *testing.T) {
	wasm := goGuest(t, jsonFilterPkg)
	rt := newRuntime(t)
	m := manifest("big-orders", KindFilter, wasm, nil)
	_, err := rt.Load(context.Background(), m.Spec(wasm))
	require.ErrorIs(t, err, ErrGuest)
	require.ErrorContains(t, err, "code -4")
}

func TestRedactExample(t *testing.T) {
	wasm := goGuest(t, redactPkg)
	rt := newRuntime(t)
	tr := NewTransform(load(t, rt, manifest("redact", KindTransform, wasm, map[string]string{"field": "card"}), wasm))
	msgs := []Message{
		{Topic: "pay", Tags: "a", Keys: "k1 k2", Properties: []byte("p\x01v\x02"), Body: []byte(`{"card": "4111 1111", "amount": 3}`)},
		{Topic: "pay", Body: []byte(`{"amount": 3}`)},
		{Topic: "pay", Body: []byte(`{"card":12345,"x":{"card" : "a\"b"}}`)},
	}
	out, err := tr.Apply(context.Background(), msgs)
	require.NoError(t, err)
	require.Equal(t, [][]Output{
		{{Tags: "a", Keys: "k1 k2", Properties: []byte("p\x01v\x02"), Body: []byte(`{"card": "***", "amount": 3}`)}},
		{{Body: []byte(`{"amount": 3}`)}},
		{{Body: []byte(`{"card":"***","x":{"card" : "***"}}`)}},
	}, out)
}

// randomRequest returns a sorted, valid allocation request.
func randomRequest(r *rand.Rand) allocate.Request {
	nb, nt := 1+r.IntN(3), 1+r.IntN(2)
	var qs []protocol.MessageQueue
	for t := range nt {
		for b := range nb {
			for q := range 1 + r.IntN(8) {
				qs = append(qs, protocol.MessageQueue{Topic: fmt.Sprintf("topic-%d", t), BrokerName: fmt.Sprintf("broker-%c", 'a'+b), QueueID: q})
			}
		}
	}
	nm := 1 + r.IntN(12)
	ids := make([]string, 0, nm)
	for len(ids) < nm {
		id := fmt.Sprintf("10.0.%d.%d@%d", r.IntN(4), r.IntN(250), r.IntN(1000))
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return allocate.Request{Group: "g", Queues: qs, ClientIDs: ids}
}

func TestAveragelyExampleEqualsNative(t *testing.T) {
	wasm := goGuest(t, averagelyPkg)
	rt := newRuntime(t)
	a := NewAllocator(load(t, rt, manifest("avg", KindAllocator, wasm, nil), wasm))
	strat := &AllocatorStrategy{Allocator: a}
	native := allocate.Averagely()
	ctx := context.Background()
	r := rand.New(rand.NewPCG(1, 2))
	var owners []int32
	for i := range 3000 {
		req := randomRequest(r)
		in := AllocInput{Group: req.Group, Queues: req.Queues}
		for _, id := range req.ClientIDs {
			in.Members = append(in.Members, Member{ID: id, Weight: 1})
		}
		var err error
		owners, err = a.Allocate(ctx, &in, owners)
		require.NoError(t, err)
		for mi, id := range req.ClientIDs {
			req.ClientID = id
			want, err := native.Allocate(ctx, req)
			require.NoError(t, err)
			var got []protocol.MessageQueue
			for k, o := range owners {
				if int(o) == mi {
					got = append(got, req.Queues[k])
				}
			}
			require.Equal(t, len(want), len(got), "input %d member %d", i, mi)
			if len(want) > 0 {
				require.Equal(t, want, got, "input %d member %d", i, mi)
			}
			if i%100 == 0 { // and through the allocate.Strategy adapter, one member and all
				viaStrategy, err := strat.Allocate(ctx, req)
				require.NoError(t, err)
				require.Equal(t, len(want), len(viaStrategy))
				if len(want) > 0 {
					require.Equal(t, want, viaStrategy)
				}
				group, err := allocate.Group(ctx, strat, req)
				require.NoError(t, err)
				require.Equal(t, len(want), len(group[id]))
				if len(want) > 0 {
					require.Equal(t, want, group[id])
				}
			}
		}
	}
	require.Equal(t, "WASM-avg@1.0.0", strat.Name())
	sum := sha256.Sum256(wasm)
	require.Equal(t, "WASM-avg@1.0.0#"+hex.EncodeToString(sum[:]), allocate.Identity(strat),
		"members tell two builds of one version apart")
}

func TestStickyExampleKeepsPreviousOwners(t *testing.T) {
	wasm := goGuest(t, stickyPkg)
	rt := newRuntime(t)
	strat := &AllocatorStrategy{Allocator: NewAllocator(load(t, rt, manifest("sticky", KindAllocator, wasm, nil), wasm))}
	native := allocate.Averagely()
	ctx := context.Background()
	r := rand.New(rand.NewPCG(3, 4))
	assign := func(s allocate.Strategy, req allocate.Request) map[string][]protocol.MessageQueue {
		out := map[string][]protocol.MessageQueue{}
		for _, id := range req.ClientIDs {
			req.ClientID = id
			qs, err := s.Allocate(ctx, req)
			require.NoError(t, err)
			out[id] = qs
		}
		return out
	}
	owner := func(a map[string][]protocol.MessageQueue) map[protocol.MessageQueue]string {
		o := map[protocol.MessageQueue]string{}
		for id, qs := range a {
			for _, q := range qs {
				_, dup := o[q]
				require.False(t, dup, "queue %v assigned twice", q)
				o[q] = id
			}
		}
		return o
	}
	for i := range 300 {
		req := randomRequest(r)
		prev := assign(native, req)

		// Same members: nothing moves.
		req.Previous = prev
		require.Equal(t, owner(prev), owner(assign(strat, req)), "input %d", i)

		// A member joins: only the queues it takes move, and shares stay balanced.
		joiner := fmt.Sprintf("zz-new-%d", i)
		grown := req
		grown.ClientIDs = append(slices.Clone(req.ClientIDs), joiner)
		slices.Sort(grown.ClientIDs)
		after := owner(assign(strat, grown))
		require.Len(t, after, len(req.Queues), "every queue has an owner")
		before := owner(prev)
		for q, o := range after {
			if o != before[q] {
				require.Equal(t, joiner, o, "input %d: queue %v moved from %s to %s", i, q, before[q], o)
			}
		}
		counts := map[string]int{}
		for _, o := range after {
			counts[o]++
		}
		nq, nm := len(req.Queues), len(grown.ClientIDs)
		for _, id := range grown.ClientIDs {
			require.Contains(t, []int{nq / nm, nq/nm + 1}, counts[id], "input %d: member %s", i, id)
		}

		// A member leaves: the others keep every queue they had.
		if len(req.ClientIDs) > 1 {
			gone := req.ClientIDs[r.IntN(len(req.ClientIDs))]
			shrunk := req
			shrunk.ClientIDs = slices.DeleteFunc(slices.Clone(req.ClientIDs), func(s string) bool { return s == gone })
			after := owner(assign(strat, shrunk))
			require.Len(t, after, len(req.Queues))
			kept, moved := 0, 0
			for q, o := range after {
				switch {
				case before[q] == gone:
				case o == before[q]:
					kept++
				default:
					moved++
				}
			}
			// Shares grow when a member leaves, so a previous owner keeps its queues unless
			// it held more than the new larger share, which a balanced start rules out.
			require.Zero(t, moved, "input %d: %d queues of remaining members moved (%d kept)", i, moved, kept)
		}
	}
}
