package cluster_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/cluster"
)

// freePort is a loopback port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startNATSCluster runs n embedded servers, s-1..s-n, routed to each other on loopback.
func startNATSCluster(t *testing.T, n int) []*natsserver.Server {
	t.Helper()
	ports := make([]int, n)
	var routes string
	for i := range ports {
		ports[i] = freePort(t)
		if i > 0 {
			routes += ","
		}
		routes += fmt.Sprintf("nats-route://127.0.0.1:%d", ports[i])
	}
	servers := make([]*natsserver.Server, n)
	for i := range servers {
		s, err := natsserver.NewServer(&natsserver.Options{
			ServerName: fmt.Sprintf("s-%d", i+1), Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
			NoLog: true, NoSigs: true,
			Cluster: natsserver.ClusterOpts{Name: "health", Host: "127.0.0.1", Port: ports[i]},
			Routes:  natsserver.RoutesFromStr(routes),
		})
		require.NoError(t, err)
		s.Start()
		t.Cleanup(s.Shutdown)
		servers[i] = s
	}
	for _, s := range servers {
		require.True(t, s.ReadyForConnections(wait))
	}
	return servers
}

// The lease stream's health (cluster.status's lease_stream, the
// flowd_replication_lease_stream_whole metric): an R3 bucket on three servers is whole
// once its group has a leader and both followers are current; with a follower's server
// gone it is not, and the report names that follower.
func TestLeaseStreamHealthTellsAFollowerGone(t *testing.T) {
	servers := startNATSCluster(t, 3)
	js, err := jetstream.New(connect(t, servers[0]))
	require.NoError(t, err)
	var kv jetstream.KeyValue
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "health", Replicas: 3})
		return err == nil
	}, wait, 100*time.Millisecond, "R3 bucket created once JetStream's meta group formed: %v", err)
	read := func() cluster.StreamHealth {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, _ = kv.Put(ctx, "k", []byte("v")) // traffic, as renewals are
		h, err := cluster.ReadLeaseStreamHealth(ctx, kv)
		if err != nil {
			return cluster.StreamHealth{}
		}
		return h
	}
	var h cluster.StreamHealth
	require.Eventually(t, func() bool { h = read(); return h.Whole() && h.Leader != "" }, wait, 100*time.Millisecond, "whole: %+v", h)
	assert.True(t, h.Clustered)
	require.Len(t, h.Replicas, 2)
	for _, p := range h.Replicas {
		assert.NotEqual(t, h.Leader, p.Name)
		assert.True(t, p.Current || p.Lag <= cluster.MaxFollowerLag, "%s current, or an entry or two behind: %+v", p.Name, p)
	}

	// Stop a follower whose server is not the one the test is connected to.
	gone := h.Replicas[0].Name
	if gone == "s-1" {
		gone = h.Replicas[1].Name
	}
	for _, s := range servers {
		if s.Name() == gone {
			s.Shutdown()
		}
	}
	require.Eventually(t, func() bool { h = read(); return h.Leader != "" && !h.Whole() }, wait, 100*time.Millisecond, "not whole without %s: %+v", gone, h)
	for _, p := range h.Replicas {
		if p.Name == gone {
			assert.True(t, p.Offline || !p.Current || p.Active > cluster.MaxFollowerSilence, "%s reported gone: %+v", gone, p)
		}
	}
}

// A bucket of one server has no Raft group: it is whole while it answers.
func TestLeaseStreamHealthOfOneServerIsWhole(t *testing.T) {
	js, err := jetstream.New(connect(t, startNATS(t, false)))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "health"})
	require.NoError(t, err)
	h, err := cluster.ReadLeaseStreamHealth(ctx, kv)
	require.NoError(t, err)
	assert.False(t, h.Clustered)
	assert.True(t, h.Whole())
}

func TestStreamHealthWhole(t *testing.T) {
	ok := cluster.StreamPeer{Name: "b", Current: true, Active: 200 * time.Millisecond}
	for _, tc := range []struct {
		name  string
		h     cluster.StreamHealth
		whole bool
	}{
		{"one server", cluster.StreamHealth{}, true},
		{"every follower current", cluster.StreamHealth{Clustered: true, Leader: "a", Replicas: []cluster.StreamPeer{ok, {Name: "c", Current: true}}}, true},
		{"no leader", cluster.StreamHealth{Clustered: true, Replicas: []cluster.StreamPeer{ok, ok}}, false},
		{"a follower an entry or two behind", cluster.StreamHealth{Clustered: true, Leader: "a", Replicas: []cluster.StreamPeer{ok, {Name: "c", Lag: 2}}}, true},
		{"a follower catching up", cluster.StreamHealth{Clustered: true, Leader: "a", Replicas: []cluster.StreamPeer{ok, {Name: "c", Lag: cluster.MaxFollowerLag + 1}}}, false},
		{"a follower offline", cluster.StreamHealth{Clustered: true, Leader: "a", Replicas: []cluster.StreamPeer{ok, {Name: "c", Current: true, Offline: true}}}, false},
		{"a follower silent", cluster.StreamHealth{Clustered: true, Leader: "a", Replicas: []cluster.StreamPeer{ok, {Name: "c", Current: true, Active: 4 * time.Second}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) { assert.Equal(t, tc.whole, tc.h.Whole()) })
	}
}
