package control_test

import (
	"context"
	"encoding/json"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
)

// fakeMembership is a registry as a cluster member would report it.
type fakeMembership struct{ m control.ClusterMembership }

func (f fakeMembership) ClusterMembership() control.ClusterMembership { return f.m }

// A node without a cluster member answers cluster.status with its own broker alone.
func TestClusterStatusAlone(t *testing.T) {
	e := start(t, nil)
	var st control.ClusterStatusReply
	e.ok("cluster.status", ``, &st)
	assert.False(t, st.Clustered)
	assert.False(t, st.Joined)
	require.Len(t, st.Brokers, 1)
	b := st.Brokers[0]
	assert.Equal(t, "broker-a", b.Name)
	assert.Equal(t, "broker-a", b.Node)
	assert.Equal(t, e.b.Addr(), b.Addr)
	assert.Equal(t, e.b.NamesrvAddr(), b.Namesrv)
	assert.True(t, b.Self)
	assert.Nil(t, b.Heartbeat, "outside any registry")
	assert.False(t, b.Started.IsZero())
	assert.Equal(t, len(e.b.Topics()), b.Load.Topics)
	assert.Nil(t, st.NATS, "no NATS server given")

	assert.Contains(t, e.fail("cluster.status", `{"all":true}`, control.CodeBadRequest), `field "all": unknown field`)
}

// A clustered node answers with the registry its member reports, its own broker marked, in
// name order; one not joined yet still lists its own broker.
func TestClusterStatusReportsTheRegistry(t *testing.T) {
	hb := time.Date(2026, 12, 1, 2, 20, 31, 0, time.UTC)
	other := control.ClusterBroker{
		Name: "broker-0", Cluster: "local", Node: "node-0", Addr: "10.0.0.2:10911", Version: "1.2.3",
		Started: hb.Add(-time.Hour), Heartbeat: &hb, Load: control.ClusterLoad{Topics: 7, WaitingPulls: 3},
	}
	var self control.ClusterBroker
	fake := &fakeMembership{}
	e := start(t, func(c *control.ServiceConfig) { c.Membership = fake })
	self = control.ClusterBroker{Name: "broker-a", Node: "node-a", Addr: e.b.Addr(), Heartbeat: &hb}
	fake.m = control.ClusterMembership{Joined: true, Brokers: []control.ClusterBroker{self, other}}

	var st control.ClusterStatusReply
	e.ok("cluster.status", `{}`, &st)
	assert.True(t, st.Clustered)
	assert.True(t, st.Joined)
	require.Len(t, st.Brokers, 2)
	assert.Equal(t, other, st.Brokers[0], "the other broker as the registry has it")
	assert.Equal(t, "broker-a", st.Brokers[1].Name)
	assert.Equal(t, "node-a", st.Brokers[1].Node, "the registry's entry, not the broker's own")
	assert.True(t, st.Brokers[1].Self)

	fake.m = control.ClusterMembership{Joined: false}
	e.ok("cluster.status", ``, &st)
	assert.True(t, st.Clustered)
	assert.False(t, st.Joined)
	require.Len(t, st.Brokers, 1)
	assert.Equal(t, "broker-a", st.Brokers[0].Name)
	assert.True(t, st.Brokers[0].Self)
}

// With the embedded server, the reply carries its NATS cluster: a seed server names its
// cluster, itself, its route listener and its JetStream meta group.
func TestClusterStatusReportsTheNATSCluster(t *testing.T) {
	b := startBroker(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a seed's route port cannot be 0
	require.NoError(t, err)
	route := ln.Addr().String()
	require.NoError(t, ln.Close())
	n, err := control.Open(context.Background(), control.NATSConfig{
		Listen: "127.0.0.1:0", StoreDir: t.TempDir(), ServerName: "seed-1", Logger: quiet(),
		Cluster: control.NATSClusterConfig{Name: "flowd-test", Listen: route},
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		assert.NoError(t, n.Close(ctx))
	})
	svc, err := control.StartService(context.Background(), n.Conn(), b, control.ServiceConfig{Logger: quiet(), NATS: n, Membership: fakeMembership{}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, svc.Stop()) })

	msg, err := n.Conn().Request(svc.Subject("cluster.status"), nil, wait)
	require.NoError(t, err)
	require.Empty(t, msg.Header.Get(micro.ErrorCodeHeader), msg.Header.Get(micro.ErrorHeader))
	var st control.ClusterStatusReply
	require.NoError(t, json.Unmarshal(msg.Data, &st))
	require.NotNil(t, st.NATS, string(msg.Data))
	v := st.NATS
	assert.True(t, v.Clustered)
	assert.Equal(t, "flowd-test", v.Name)
	assert.Equal(t, "seed-1", v.ServerName)
	assert.Equal(t, "nats-route://"+route, v.RouteURL)
	assert.Contains(t, v.Peers, control.NATSClusterPeer{Name: "seed-1", Current: true})
	assert.Empty(t, v.Error)
	assert.True(t, st.Clustered)
	assert.False(t, st.Joined)
}
