package cluster_test

import (
	"context"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/cluster"
)

// TestReplicaSetsReadBackMembersAndTheMastersLag: the members' entries of two replica sets
// and a master's lease, with the lag it publishes at each renewal, read back per set, by
// broker id.
func TestReplicaSetsReadBackMembersAndTheMastersLag(t *testing.T) {
	s := startNATS(t, false)
	js, err := jetstream.New(connect(t, s))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	kv, err := cluster.OpenReplicaSets(ctx, js, 1)
	require.NoError(t, err)

	sets, err := cluster.ReadReplicaSets(ctx, kv)
	require.NoError(t, err)
	require.Empty(t, sets)
	for _, m := range []cluster.ReplicaMember{
		{BrokerName: "b", Node: "b-2", BrokerID: 2, Addr: "b2:10911"},
		{BrokerName: "b", Node: "b-1", BrokerID: 1, Addr: "b1:10911"},
		{BrokerName: "a", Node: "a-1", BrokerID: 1, Addr: "a1:10911"},
	} {
		require.NoError(t, cluster.PutReplicaMember(ctx, kv, m))
	}
	var mu sync.Mutex
	lag := int64(100)
	l := cluster.NewLease(cluster.LeaseOptions{
		KV: kv, BrokerName: "b", Node: "b-1", Addr: "b1:10911", MayBootstrap: true, TTL: leaseTTL, Logger: quiet,
		Replicas: func() []cluster.ReplicaLag {
			mu.Lock()
			defer mu.Unlock()
			return []cluster.ReplicaLag{{Node: "b-2", LagBytes: lag, LagMillis: 7}}
		},
	})
	rctx, rcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { l.Run(rctx) })
	defer func() { rcancel(); wg.Wait() }()
	eventuallyTrue(t, "b-1 holds the lease", l.Held)
	mu.Lock()
	lag = 42
	mu.Unlock()

	var b cluster.ReplicaSetState
	eventuallyTrue(t, "a renewal published the new lag", func() bool {
		sets, err = cluster.ReadReplicaSets(ctx, kv)
		if err != nil || len(sets) != 2 {
			return false
		}
		b = sets[1]
		return b.Leader != nil && len(b.Leader.Replicas) == 1 && b.Leader.Replicas[0].LagBytes == 42
	})
	require.Equal(t, "a", sets[0].BrokerName)
	require.Nil(t, sets[0].Leader, "a set nobody leads")
	require.Len(t, sets[0].Members, 1)
	require.Equal(t, "b", b.BrokerName)
	require.Equal(t, "b-1", b.Leader.Node)
	require.Equal(t, int64(1), b.Leader.Epoch)
	require.Equal(t, []int64{1, 2}, []int64{b.Members[0].BrokerID, b.Members[1].BrokerID})
	require.Equal(t, "b2:10911", b.Members[1].Addr)
	require.Equal(t, int64(7), b.Leader.Replicas[0].LagMillis)
}
