package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/cluster"
)

// runLeaseAt is runLease for a member whose log stands at pos.
func runLeaseAt(t *testing.T, s *natsserver.Server, node string, bootstrap bool, pos cluster.LogPosition) *cluster.Lease {
	t.Helper()
	js, err := jetstream.New(connect(t, s))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	kv, err := cluster.OpenReplicaSets(ctx, js, 1)
	cancel()
	require.NoError(t, err)
	l := cluster.NewLease(cluster.LeaseOptions{
		KV: kv, BrokerName: "b", Node: node, HAAddr: node + ":ha", Addr: node + ":broker",
		MayBootstrap: bootstrap, TTL: leaseTTL, Logger: quiet,
		Position: func() cluster.LogPosition { return pos },
	})
	rctx, rcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { l.Run(rctx) })
	t.Cleanup(func() { rcancel(); wg.Wait() })
	return l
}

// Of two in-sync replicas, the one whose log goes further takes a lapsed lease, whichever
// saw it lapse first: the other may lack a send acknowledged by min_in_sync members. Each
// round starts a new set with the longer log on the other member; a race alone would pass
// all rounds one time in eight.
func TestLeaseGoesToTheInSyncMemberWithTheLongestLog(t *testing.T) {
	for round, ahead := range []string{"c", "b", "c"} {
		t.Run(fmt.Sprintf("round %d, %s ahead", round, ahead), func(t *testing.T) {
			s := startNATS(t, false)
			a, stopA := runLease(t, s, "a", true)
			eventuallyTrue(t, "a is master", a.Held)
			end := map[string]int64{"b": 100, "c": 100}
			end[ahead] = 200
			b := runLeaseAt(t, s, "b", false, cluster.LogPosition{Epoch: 1, End: end["b"]})
			c := runLeaseAt(t, s, "c", false, cluster.LogPosition{Epoch: 1, End: end["c"]})
			a.SetInSync([]string{"b", "c"})
			eventuallyTrue(t, "the in-sync set is published", func() bool {
				rb, okb := b.Leader()
				rc, okc := c.Leader()
				return okb && okc && len(rb.InSync) == 2 && len(rc.InSync) == 2
			})
			stopA()
			want, other := b, c
			if ahead == "c" {
				want, other = c, b
			}
			eventuallyTrue(t, ahead+" took over", func() bool {
				require.False(t, other.Held(), "the member with the shorter log took the lease")
				return want.Held()
			})
			rec, _ := want.Leader()
			require.Equal(t, ahead, rec.Node)
			require.Equal(t, int64(2), rec.Epoch)
		})
	}
}

// A candidate ahead that stops standing (its entry no longer changes) is waited for one
// TTL, not for ever: the member behind it then takes the lease.
func TestLeaseCandidateGoneIsWaitedOutForOneTTL(t *testing.T) {
	s := startNATS(t, false)
	a, stopA := runLease(t, s, "a", true)
	eventuallyTrue(t, "a is master", a.Held)
	b := runLeaseAt(t, s, "b", false, cluster.LogPosition{Epoch: 1, End: 100})
	a.SetInSync([]string{"b", "c"}) // c never runs: only its candidacy, written below
	eventuallyTrue(t, "the in-sync set is published", func() bool {
		rec, ok := b.Leader()
		return ok && len(rec.InSync) == 2
	})
	js, err := jetstream.New(connect(t, s))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	kv, err := js.KeyValue(ctx, cluster.ReplicaSetsBucket)
	require.NoError(t, err)
	stopA() // a renews no more: the revision read now is the one that lapses
	e, err := kv.Get(ctx, "leader.b")
	require.NoError(t, err)
	// c stood for the lease a leaves lapsed, with a longer log, and then stopped.
	data, err := json.Marshal(map[string]any{"node": "c", "lapsed": e.Revision(), "position": map[string]int64{"epoch": 1, "end": 500}})
	require.NoError(t, err)
	_, err = kv.Put(ctx, "candidate.b.c", data)
	require.NoError(t, err)
	eventuallyTrue(t, "b took over once c's candidacy went stale", b.Held)
	rec, _ := b.Leader()
	require.Equal(t, "b", rec.Node)
}
