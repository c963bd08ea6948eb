package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/cluster"
)

// candidacyTTL is the lease TTL of these tests: longer than leaseTTL, so that a member
// slowed down by a loaded machine still stands within the TTL its peers wait for it.
const candidacyTTL = 1500 * time.Millisecond

// runLeaseAt is runLease for a member whose log stands at pos.
func runLeaseAt(t *testing.T, s *natsserver.Server, node string, pos cluster.LogPosition) *cluster.Lease {
	t.Helper()
	l, _ := runLeaseWith(t, s, cluster.LeaseOptions{Node: node, TTL: candidacyTTL, Position: func() cluster.LogPosition { return pos }})
	return l
}

// runMaster is the set's first master, with the tests' TTL.
func runMaster(t *testing.T, s *natsserver.Server) (*cluster.Lease, func()) {
	t.Helper()
	return runLeaseWith(t, s, cluster.LeaseOptions{Node: "a", MayBootstrap: true, TTL: candidacyTTL})
}

// Of two in-sync replicas, the one whose log goes further takes a lapsed lease, whichever
// saw it lapse first: the other may lack a send acknowledged by min_in_sync members. Each
// round starts a new set with the longer log on the other member; a race alone would pass
// all rounds one time in eight.
func TestLeaseGoesToTheInSyncMemberWithTheLongestLog(t *testing.T) {
	for round, ahead := range []string{"c", "b", "c"} {
		t.Run(fmt.Sprintf("round %d, %s ahead", round, ahead), func(t *testing.T) {
			s := startNATS(t, false)
			a, stopA := runMaster(t, s)
			eventuallyTrue(t, "a is master", a.Held)
			end := map[string]int64{"b": 100, "c": 100}
			end[ahead] = 200
			b := runLeaseAt(t, s, "b", cluster.LogPosition{Epoch: 1, End: end["b"]})
			c := runLeaseAt(t, s, "c", cluster.LogPosition{Epoch: 1, End: end["c"]})
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
	a, stopA := runMaster(t, s)
	eventuallyTrue(t, "a is master", a.Held)
	b := runLeaseAt(t, s, "b", cluster.LogPosition{Epoch: 1, End: 100})
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
