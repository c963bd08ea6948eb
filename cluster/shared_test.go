package cluster_test

import (
	"context"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// twoNodes starts two joined brokers that know each other.
func twoNodes(t *testing.T) (s *natsserver.Server, a, b *node) {
	t.Helper()
	s = startNATS(t, false)
	a = startNode(t, s, "broker-a", nil)
	b = startNode(t, s, "broker-b", nil)
	require.Eventually(t, func() bool { return len(a.m.Registry()) == 2 && len(b.m.Registry()) == 2 }, wait, 10*time.Millisecond)
	return s, a, b
}

func TestTopicUpdateOnOneBrokerReachesAnother(t *testing.T) {
	_, a, b := twoNodes(t)
	perm := protocol.PermRead | protocol.PermWrite
	require.NoError(t, a.b.CreateTopic(broker.TopicConfig{Name: "orders", ReadQueueNums: 2, WriteQueueNums: 2, Perm: perm}))
	require.Eventually(t, func() bool { _, ok := b.b.Topic("orders"); return ok }, wait, 10*time.Millisecond)

	upd := broker.TopicConfig{Name: "orders", ReadQueueNums: 6, WriteQueueNums: 6, Perm: protocol.PermRead}
	require.NoError(t, a.b.UpdateTopic(upd))
	require.Eventually(t, func() bool { tc, _ := b.b.Topic("orders"); return tc == upd }, wait, 10*time.Millisecond, "B took A's update")
	require.Eventually(t, func() bool {
		r := a.route(t, "orders")
		if len(brokersOf(r)) != 2 {
			return false
		}
		for _, q := range r.QueueDatas {
			if q.WriteQueueNums != 6 || q.Perm != int32(protocol.PermRead) {
				return false
			}
		}
		return true
	}, wait, 10*time.Millisecond, "A routes B's queues with the updated configuration")

	// And back the other way: an update on B, through UPDATE_AND_CREATE_TOPIC's put.
	upd2 := broker.TopicConfig{Name: "orders", ReadQueueNums: 3, WriteQueueNums: 3, Perm: perm}
	_, err := b.b.PutTopic(upd2)
	require.NoError(t, err)
	require.Eventually(t, func() bool { tc, _ := a.b.Topic("orders"); return tc == upd2 }, wait, 10*time.Millisecond, "A took B's update")
}

func TestConcurrentTopicUpdatesSettleOnOneConfiguration(t *testing.T) {
	_, a, b := twoNodes(t)
	perm := protocol.PermRead | protocol.PermWrite
	require.NoError(t, a.b.CreateTopic(broker.TopicConfig{Name: "race", ReadQueueNums: 1, WriteQueueNums: 1, Perm: perm}))
	require.Eventually(t, func() bool { _, ok := b.b.Topic("race"); return ok }, wait, 10*time.Millisecond)
	for round := range 5 {
		done := make(chan error, 2)
		go func() {
			done <- a.b.UpdateTopic(broker.TopicConfig{Name: "race", ReadQueueNums: 2 + round, WriteQueueNums: 2 + round, Perm: perm})
		}()
		go func() {
			done <- b.b.UpdateTopic(broker.TopicConfig{Name: "race", ReadQueueNums: 20 + round, WriteQueueNums: 20 + round, Perm: perm})
		}()
		for range 2 {
			require.NoError(t, <-done)
		}
		require.Eventually(t, func() bool {
			ta, _ := a.b.Topic("race")
			tb, _ := b.b.Topic("race")
			return ta == tb && (ta.WriteQueueNums == 2+round || ta.WriteQueueNums == 20+round)
		}, wait, 10*time.Millisecond, "round %d: both brokers hold one of the two updates", round)
	}
}

func TestGroupCreatedOnOneBrokerExistsOnAnother(t *testing.T) {
	s, a, b := twoNodes(t)
	g := broker.GroupConfig{Name: "billing", ConsumeEnable: true, RetryQueueNums: 2, RetryMaxTimes: 5}
	created, err := a.b.PutGroup(g)
	require.NoError(t, err)
	require.True(t, created)
	require.Eventually(t, func() bool { got, ok := b.b.Group("billing"); return ok && got == g }, wait, 10*time.Millisecond, "B has the group with A's settings")

	// An update on B reaches A.
	g.ConsumeEnable, g.RetryMaxTimes = false, 9
	_, err = b.b.PutGroup(g)
	require.NoError(t, err)
	require.Eventually(t, func() bool { got, _ := a.b.Group("billing"); return got == g }, wait, 10*time.Millisecond, "A took B's update")

	// A broker that joins later materialises the cluster's groups.
	c := startNode(t, s, "broker-c", nil)
	got, ok := c.b.Group("billing")
	assert.True(t, ok, "Join returns once the groups are materialised")
	assert.Equal(t, g, got)
}

func TestGroupDeletedOnOneBrokerDisappearsFromAnother(t *testing.T) {
	_, a, b := twoNodes(t)
	g := broker.GroupConfig{Name: "gone", ConsumeEnable: true, RetryQueueNums: 1, RetryMaxTimes: 16}
	_, err := b.b.PutGroup(g)
	require.NoError(t, err)
	require.Eventually(t, func() bool { _, ok := a.b.Group("gone"); return ok }, wait, 10*time.Millisecond)

	// DELETE_SUBSCRIPTIONGROUP on A, over the wire as mqadmin sends it.
	cl := remoting.NewClient(remoting.ClientOptions{})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	resp, err := cl.Invoke(ctx, a.b.Addr(), protocol.NewRequestWith(protocol.DeleteSubscriptionGroup, &protocol.DeleteSubscriptionGroupRequestHeader{GroupName: "gone"}, nil))
	require.NoError(t, err)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	require.Eventually(t, func() bool { _, ok := b.b.Group("gone"); return !ok }, wait, 10*time.Millisecond, "the group left B")
}

// A consumer's first heartbeat creates its group on the broker it reaches: the group is
// shared, its retry topic is not.
func TestGroupAutoCreatedByAHeartbeatIsShared(t *testing.T) {
	_, a, b := twoNodes(t)
	hb := protocol.HeartbeatData{ClientID: "client-1", ConsumerDataSet: []protocol.ConsumerData{{
		GroupName: "auto", ConsumeType: protocol.ConsumeActively, MessageModel: protocol.Clustering,
		ConsumeFromWhere: protocol.ConsumeFromFirstOffset, SubscriptionDataSet: []protocol.SubscriptionData{{Topic: "t", SubString: "*", ExpressionType: "TAG"}},
	}}}
	body, err := hb.Encode()
	require.NoError(t, err)
	cl := remoting.NewClient(remoting.ClientOptions{})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	resp, err := cl.Invoke(ctx, a.b.Addr(), protocol.NewRequest(protocol.HeartBeat, nil, body))
	require.NoError(t, err)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	want, ok := a.b.Group("auto")
	require.True(t, ok)
	require.Eventually(t, func() bool { got, ok := b.b.Group("auto"); return ok && got == want }, wait, 10*time.Millisecond, "B has the auto-created group")
	_, ok = a.b.Topic(broker.RetryTopicPrefix + "auto")
	require.True(t, ok, "A created the retry topic")
	_, ok = b.b.Topic(broker.RetryTopicPrefix + "auto")
	assert.False(t, ok, "the retry topic stays on A")
}

func TestConcurrentGroupUpdatesSettleOnOneValue(t *testing.T) {
	_, a, b := twoNodes(t)
	_, err := a.b.PutGroup(broker.GroupConfig{Name: "race", ConsumeEnable: true, RetryQueueNums: 1, RetryMaxTimes: 1})
	require.NoError(t, err)
	require.Eventually(t, func() bool { _, ok := b.b.Group("race"); return ok }, wait, 10*time.Millisecond)
	for round := range 5 {
		ga := broker.GroupConfig{Name: "race", ConsumeEnable: true, RetryQueueNums: 1, RetryMaxTimes: 100 + round}
		gb := broker.GroupConfig{Name: "race", ConsumeEnable: false, RetryQueueNums: 3, RetryMaxTimes: 200 + round}
		done := make(chan error, 2)
		go func() { _, err := a.b.PutGroup(ga); done <- err }()
		go func() { _, err := b.b.PutGroup(gb); done <- err }()
		for range 2 {
			require.NoError(t, <-done)
		}
		require.Eventually(t, func() bool {
			x, _ := a.b.Group("race")
			y, _ := b.b.Group("race")
			return x == y && (x == ga || x == gb)
		}, wait, 10*time.Millisecond, "round %d: both brokers hold one of the two updates", round)
	}
}
