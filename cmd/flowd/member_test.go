package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/config"
	"github.com/flowd-io/flowd/control"
)

// The buckets of a cluster joined by routes get one replica per server the routes name, up
// to three: a two-node cluster cannot place three.
func TestRoutedReplicas(t *testing.T) {
	for _, tc := range []struct {
		name   string
		listen string
		routes []string
		want   int
	}{
		{"no route listener", "", nil, 0},
		{"a seed", "127.0.0.1:6222", nil, 1},
		{"two nodes, own route listed", "127.0.0.1:6222", []string{"nats-route://127.0.0.1:6222", "nats-route://127.0.0.1:6223"}, 2},
		{"two nodes, own route left out", "127.0.0.1:6222", []string{"nats-route://127.0.0.1:6223"}, 2},
		{"one server named two ways", "127.0.0.1:6222", []string{"nats-route://localhost:6222", "nats-route://u:p@127.0.0.1:6223"}, 2},
		{"five nodes", "127.0.0.1:6222", []string{"nats-route://127.0.0.1:6223", "nats-route://127.0.0.1:6224", "nats-route://127.0.0.1:6225", "nats-route://127.0.0.1:6226"}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := config.Default()
			c.NATS.Cluster.Listen = tc.listen
			c.NATS.Cluster.Routes = tc.routes
			require.Equal(t, tc.want, routedReplicas(c))
		})
	}
}

// Before the member exists the broker's peers are nobody: no routes, brokers or topics
// beyond its own, and cluster.status reads an empty registry.
func TestPeersBeforeTheMember(t *testing.T) {
	var p peers
	qs, bds := p.TopicRoute("orders")
	require.Nil(t, qs)
	require.Nil(t, bds)
	require.Nil(t, p.Brokers())
	require.Nil(t, p.Topics())
	require.Equal(t, control.ClusterMembership{}, p.ClusterMembership())
}
