package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/cluster"
	"github.com/flowd-io/flowd/protocol"
)

// peerNames is TopicPeers as broker name → gRPC address.
func peerNames(tps []cluster.TopicPeer) map[string]string {
	out := map[string]string{}
	for _, tp := range tps {
		out[tp.Broker.Name] = tp.Broker.GRPCAddr
	}
	return out
}

// Each registry entry carries its broker's gRPC address, and TopicPeers names every other
// live broker with it and the cluster's configuration of the topic; an entry written by a
// flowd before the address was kept (no grpcAddr) is read as a broker without gRPC.
func TestTopicPeersCarryEveryBrokersGRPCAddress(t *testing.T) {
	s := startNATS(t, false)
	a := startNode(t, s, "broker-a", func(o *cluster.Options) { o.GRPCAddr = "127.0.0.1:9001" })
	b := startNode(t, s, "broker-b", nil) // gRPC off
	c := startNode(t, s, "broker-c", func(o *cluster.Options) { o.GRPCAddr = "mq.example:9003" })
	for _, n := range []*node{a, b, c} {
		require.Eventually(t, func() bool { return len(n.m.Registry()) == 3 }, wait, 10*time.Millisecond)
	}
	reg := b.m.Registry()
	assert.Equal(t, []string{"127.0.0.1:9001", "", "mq.example:9003"}, []string{reg[0].GRPCAddr, reg[1].GRPCAddr, reg[2].GRPCAddr})

	assert.Empty(t, c.m.TopicPeers("orders"), "a topic the cluster's table does not hold has no peers")
	require.NoError(t, a.b.CreateTopic(broker.TopicConfig{Name: "orders", ReadQueueNums: 3, WriteQueueNums: 2, Perm: protocol.PermRead | protocol.PermWrite}))
	var tps []cluster.TopicPeer
	require.Eventually(t, func() bool { tps = c.m.TopicPeers("orders"); return len(tps) == 2 }, wait, 10*time.Millisecond)
	assert.Equal(t, map[string]string{"broker-a": "127.0.0.1:9001", "broker-b": ""}, peerNames(tps), "every other broker, not C itself")
	assert.Equal(t, []string{"broker-a", "broker-b"}, []string{tps[0].Broker.Name, tps[1].Broker.Name}, "by broker name")
	for _, tp := range tps {
		assert.Equal(t, 3, tp.Topic.ReadQueueNums, tp.Broker.Name)
		assert.Equal(t, 2, tp.Topic.WriteQueueNums, tp.Broker.Name)
	}

	// An entry of an older flowd, as it wrote it.
	js, err := jetstream.New(connect(t, s))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	kv, err := js.KeyValue(ctx, "flowd_brokers")
	require.NoError(t, err)
	old := `{"name":"broker-old","cluster":"local","addr":"127.0.0.1:1","node":"broker-old","version":"0.9","started":"2026-01-02T03:04:05Z","heartbeat":"` +
		time.Now().UTC().Format(time.RFC3339Nano) + `","load":{"topics":1,"clients":0,"members":0,"waitingPulls":0}}`
	_, err = kv.Create(ctx, "broker-old", []byte(old))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(peerNames(a.m.TopicPeers("orders"))) == 3 }, wait, 10*time.Millisecond)
	got := peerNames(a.m.TopicPeers("orders"))
	assert.Equal(t, map[string]string{"broker-b": "", "broker-c": "mq.example:9003", "broker-old": ""}, got)
}
