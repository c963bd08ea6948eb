package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/cluster"
	"github.com/flowd-io/flowd/protocol"
)

func TestRegistryListsEveryBroker(t *testing.T) {
	s := startNATS(t, false)
	a := startNode(t, s, "broker-a", nil)
	b := startNode(t, s, "broker-b", nil)
	c := startNode(t, s, "broker-c", func(o *cluster.Options) { o.Node = "node-3"; o.Version = "1.2.3" })

	for _, n := range []*node{a, b, c} {
		require.Eventually(t, func() bool { return len(n.m.Registry()) == 3 }, wait, 10*time.Millisecond)
	}
	reg := a.m.Registry()
	assert.Equal(t, "broker-c", reg[2].Name)
	assert.Equal(t, c.b.Addr(), reg[2].Addr)
	assert.Equal(t, c.b.NamesrvAddr(), reg[2].NamesrvAddr)
	assert.Equal(t, "node-3", reg[2].Node)
	assert.Equal(t, "1.2.3", reg[2].Version)
	assert.Equal(t, "local", reg[2].Cluster)
	assert.False(t, reg[2].Started.IsZero())

	resp := a.call(t, protocol.GetBrokerClusterInfo, nil)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	info, err := protocol.DecodeClusterInfo(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, []string{"broker-a", "broker-b", "broker-c"}, info.ClusterAddrTable["local"])
	assert.Equal(t, b.b.Addr(), info.BrokerAddrTable["broker-b"].BrokerAddrs[protocol.MasterID])
}

func TestTopicCreatedOnOneBrokerIsRoutedByAnother(t *testing.T) {
	s := startNATS(t, false)
	a := startNode(t, s, "broker-a", nil)
	b := startNode(t, s, "broker-b", nil)
	require.Eventually(t, func() bool { return len(b.m.Registry()) == 2 && len(a.m.Registry()) == 2 }, wait, 10*time.Millisecond)

	require.NoError(t, a.b.CreateTopic(broker.TopicConfig{Name: "orders", ReadQueueNums: 3, WriteQueueNums: 3, Perm: protocol.PermRead | protocol.PermWrite}))

	var r *protocol.TopicRouteData
	require.Eventually(t, func() bool {
		r = b.route(t, "orders")
		return len(brokersOf(r)) == 2
	}, wait, 10*time.Millisecond, "B routes the topic to both brokers")
	assert.Equal(t, []string{"broker-b", "broker-a"}, brokersOf(r), "B's own queues first")
	for _, q := range r.QueueDatas {
		assert.EqualValues(t, 3, q.WriteQueueNums, q.BrokerName)
		assert.EqualValues(t, 3, q.ReadQueueNums, q.BrokerName)
	}
	require.Len(t, r.BrokerDatas, 2)
	assert.Equal(t, b.b.Addr(), r.BrokerDatas[0].BrokerAddrs[0])
	assert.Equal(t, "broker-a", r.BrokerDatas[1].BrokerName)
	assert.Equal(t, a.b.Addr(), r.BrokerDatas[1].BrokerAddrs[0])

	tc, ok := b.b.Topic("orders")
	require.True(t, ok, "B materialised the topic")
	assert.Equal(t, 3, tc.WriteQueueNums)
	require.Eventually(t, func() bool { return len(brokersOf(a.route(t, "orders"))) == 2 }, wait, 10*time.Millisecond)
	assert.Equal(t, []string{"orders"}, b.m.Topics(), "the shared topics, for the name service's topic lists; no broker's own")

	// A deletion anywhere deletes it everywhere.
	require.NoError(t, b.b.DeleteTopic("orders"))
	require.Eventually(t, func() bool {
		_, onA := a.b.Topic("orders")
		return !onA && a.route(t, "orders") == nil
	}, wait, 10*time.Millisecond)
	assert.Empty(t, a.m.Topics())
}

func TestSendCreatesTheTopicOnEveryBroker(t *testing.T) {
	s := startNATS(t, false)
	a := startNode(t, s, "broker-a", nil)
	b := startNode(t, s, "broker-b", nil)
	require.Eventually(t, func() bool { return len(b.m.Registry()) == 2 }, wait, 10*time.Millisecond)
	sendRaw(t, a.b.Addr(), "auto", "one") // auto-created from TBW102 by the send
	require.Eventually(t, func() bool { return len(brokersOf(b.route(t, "auto"))) == 2 }, wait, 10*time.Millisecond)
	_, ok := b.b.Topic(broker.RetryTopicPrefix + "g")
	assert.False(t, ok)
}

func TestBrokerThatStopsHeartbeatingLeavesWithinTheTTL(t *testing.T) {
	s := startNATS(t, false)
	a := startNode(t, s, "broker-a", nil)
	b := startNode(t, s, "broker-b", nil)
	require.NoError(t, a.b.CreateTopic(broker.TopicConfig{Name: "t", ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermRead | protocol.PermWrite}))
	require.Eventually(t, func() bool { return len(brokersOf(a.route(t, "t"))) == 2 }, wait, 10*time.Millisecond)

	// B's process is gone as far as NATS knows: no deregistration, no more heartbeats.
	b.nc.Close()
	e := a.waitEvent(t, cluster.BrokerLeft, "broker-b")
	assert.Equal(t, "expired", e.Reason)
	assert.Equal(t, []string{"broker-a"}, brokersOf(a.route(t, "t")), "B's queues left the route")
	assert.Len(t, a.m.Registry(), 1)
}

func TestBrokerThatClosesLeavesAtOnce(t *testing.T) {
	s := startNATS(t, false)
	a := startNode(t, s, "broker-a", func(o *cluster.Options) { o.TTL = time.Hour; o.HeartbeatInterval = time.Minute })
	b := startNode(t, s, "broker-b", nil)
	a.waitEvent(t, cluster.BrokerJoined, "broker-b")
	require.NoError(t, b.m.Close(context.Background()))
	e := a.waitEvent(t, cluster.BrokerLeft, "broker-b")
	assert.Equal(t, "left", e.Reason, "deregistered, not expired: the bucket's TTL is an hour")
}

func TestDuplicateBrokerNameIsRefused(t *testing.T) {
	s := startNATS(t, false)
	startNode(t, s, "broker-a", nil)
	_, err := newNode(t, s, "broker-a", nil)
	require.Error(t, err)
	assert.True(t, errors.Is(err, cluster.ErrNameTaken), "%v", err)
	assert.Contains(t, err.Error(), `"broker-a"`)
}

func TestServesAloneUntilJetStreamComesUp(t *testing.T) {
	s := startNATS(t, true)
	a := startNode(t, s, "broker-a", nil) // no error: it serves alone and retries
	assert.False(t, a.m.Joined())
	require.NoError(t, a.b.CreateTopic(broker.TopicConfig{Name: "early", ReadQueueNums: 2, WriteQueueNums: 2, Perm: protocol.PermRead | protocol.PermWrite}))
	assert.Equal(t, []string{"broker-a"}, brokersOf(a.route(t, "early")), "routes answered from the broker alone")

	require.NoError(t, s.EnableJetStream(&natsserver.JetStreamConfig{StoreDir: t.TempDir()}))
	require.Eventually(t, a.m.Joined, wait, 10*time.Millisecond)
	b := startNode(t, s, "broker-b", nil)
	require.Eventually(t, func() bool { return len(brokersOf(b.route(t, "early"))) == 2 }, wait, 10*time.Millisecond,
		"the topic A created while alone was published when it joined")
}

func TestConcurrentCreatesOfOneTopicSettleOnOneConfiguration(t *testing.T) {
	s := startNATS(t, false)
	a := startNode(t, s, "broker-a", nil)
	b := startNode(t, s, "broker-b", nil)
	require.Eventually(t, func() bool { return len(a.m.Registry()) == 2 && len(b.m.Registry()) == 2 }, wait, 10*time.Millisecond)
	perm := protocol.PermRead | protocol.PermWrite
	done := make(chan error, 2)
	go func() {
		done <- a.b.CreateTopic(broker.TopicConfig{Name: "race", ReadQueueNums: 2, WriteQueueNums: 2, Perm: perm})
	}()
	go func() {
		done <- b.b.CreateTopic(broker.TopicConfig{Name: "race", ReadQueueNums: 5, WriteQueueNums: 5, Perm: perm})
	}()
	for range 2 {
		require.NoError(t, <-done)
	}
	require.Eventually(t, func() bool {
		ta, okA := a.b.Topic("race")
		tb, okB := b.b.Topic("race")
		ra, rb := a.route(t, "race"), b.route(t, "race")
		if !okA || !okB || ta != tb || len(brokersOf(ra)) != 2 || len(brokersOf(rb)) != 2 {
			return false
		}
		for _, q := range append(ra.QueueDatas, rb.QueueDatas...) {
			if int(q.WriteQueueNums) != ta.WriteQueueNums {
				return false
			}
		}
		return true
	}, wait, 10*time.Millisecond, "both brokers and both routes agree on the first creation")
}

// An entry older than the TTL belongs to a broker that stopped heartbeating, though the
// bucket has not expired it yet (a restarted JetStream ages entries out only once its
// stream has recovered): a broker of that name takes it over instead of being refused.
func TestLapsedEntryOfTheSameNameIsTakenOver(t *testing.T) {
	s := startNATS(t, false)
	nc := connect(t, s)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	// The bucket without a max age, so the old entry stays as a recovering stream keeps it.
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "flowd_brokers"})
	require.NoError(t, err)
	old, err := json.Marshal(cluster.BrokerInfo{Name: "broker-a", Cluster: "local", Addr: "127.0.0.1:1", Node: "broker-a", Heartbeat: time.Now()})
	require.NoError(t, err)
	_, err = kv.Create(ctx, "broker-a", old)
	require.NoError(t, err)

	_, err = newNode(t, s, "broker-a", func(o *cluster.Options) { o.TTL = time.Second; o.HeartbeatInterval = 300 * time.Millisecond })
	require.ErrorIs(t, err, cluster.ErrNameTaken, "within the TTL the entry may be a live broker's")

	time.Sleep(1200 * time.Millisecond) // the entry's age passes the TTL
	a := startNode(t, s, "broker-a", func(o *cluster.Options) { o.TTL = time.Second; o.HeartbeatInterval = 300 * time.Millisecond })
	assert.True(t, a.m.Joined())
	e, err := kv.Get(ctx, "broker-a")
	require.NoError(t, err)
	var now cluster.BrokerInfo
	require.NoError(t, json.Unmarshal(e.Value(), &now))
	assert.NotEqual(t, "127.0.0.1:1", now.Addr, "the entry is the new broker's")
}

// A broker whose entry the bucket still holds past the TTL (its stream's new leader has not
// aged it out, or a recreated watch delivered it again) leaves the routes all the same.
func TestBrokerWhoseEntryLapsedLeavesTheRoutes(t *testing.T) {
	s := startNATS(t, false)
	nc := connect(t, s)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	// The bucket without a max age: nothing expires the silent broker's entry.
	_, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "flowd_brokers"})
	require.NoError(t, err)
	short := func(o *cluster.Options) { o.TTL = time.Second; o.HeartbeatInterval = 200 * time.Millisecond }
	a := startNode(t, s, "broker-a", short)
	b := startNode(t, s, "broker-b", short)
	a.waitEvent(t, cluster.BrokerJoined, "broker-b")
	b.nc.Close() // no deregistration, no more heartbeats; its entry stays in the bucket
	e := a.waitEvent(t, cluster.BrokerLeft, "broker-b")
	assert.Equal(t, "expired", e.Reason)
	assert.Len(t, a.m.Registry(), 1)
}
