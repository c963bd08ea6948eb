package broker_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

func (c *rawClient) heartbeat(group, clientID string, topics ...string) *protocol.Command {
	c.t.Helper()
	subs := make([]protocol.SubscriptionData, len(topics))
	for i, topic := range topics {
		subs[i] = protocol.SubscriptionData{Topic: topic, SubString: "*", ExpressionType: "TAG"}
	}
	hb := protocol.HeartbeatData{ClientID: clientID, ConsumerDataSet: []protocol.ConsumerData{{
		GroupName: group, ConsumeType: protocol.ConsumeActively, MessageModel: protocol.Clustering,
		ConsumeFromWhere: protocol.ConsumeFromFirstOffset, SubscriptionDataSet: subs,
	}}}
	body, err := hb.Encode()
	require.NoError(c.t, err)
	return c.invoke(context.Background(), protocol.HeartBeat, nil, body)
}

func (c *rawClient) lock(code protocol.RequestCode, group, clientID string, mqs ...protocol.MessageQueue) *protocol.Command {
	c.t.Helper()
	body, err := protocol.MarshalBody(protocol.LockBatchRequestBody{ConsumerGroup: group, ClientID: clientID, MQSet: mqs})
	require.NoError(c.t, err)
	return c.invoke(context.Background(), code, nil, body)
}

// TestCommitDoesNotOverwriteTheLockHoldersOffset: while client A of a group holds a
// queue's lock, client B of the same group can move the queue's offset neither with
// UPDATE_CONSUMER_OFFSET (refused with NO_PERMISSION) nor with a pull's commit flag
// (ignored). Once A unlocks, B's commits apply.
func TestCommitDoesNotOverwriteTheLockHoldersOffset(t *testing.T) {
	const group, topic = "owners", "owned"
	b := startBroker(t, nil)
	a, other := newRawClient(t, b, nil), newRawClient(t, b, nil)
	for range 6 {
		a.send(topic, "m", "")
	}
	require.Eventually(t, func() bool { return b.StoreMax(topic, 0) == 6 }, 5*time.Second, time.Millisecond)
	require.Equal(t, protocol.Success, a.heartbeat(group, "client-a", topic).ResponseCode())
	require.Equal(t, protocol.Success, other.heartbeat(group, "client-b", topic).ResponseCode())
	mq := protocol.MessageQueue{Topic: topic, BrokerName: "broker-a", QueueID: 0}
	require.Equal(t, protocol.Success, a.lock(protocol.LockBatchMQ, group, "client-a", mq).ResponseCode())

	require.Equal(t, protocol.Success, a.commit(group, topic, 0, 5).ResponseCode())
	resp := other.commit(group, topic, 0, 2)
	assert.Equal(t, protocol.NoPermission, resp.ResponseCode())
	assert.Contains(t, resp.Remark, "client-a")
	off, _ := b.CommittedOffset(group, topic, 0)
	assert.Equal(t, int64(5), off, "B moved A's offset back")

	h := pullHeader(topic, 0, 0, "*")
	h.ConsumerGroup = group
	h.SysFlag |= protocol.PullFlagCommitOffset
	h.CommitOffset = 1
	resp = other.invoke(context.Background(), protocol.PullMessage, h, nil)
	require.Equal(t, protocol.Success, resp.ResponseCode(), "the pull itself is served")
	off, _ = b.CommittedOffset(group, topic, 0)
	assert.Equal(t, int64(5), off, "B's pull commit moved A's offset back")

	stranger := newRawClient(t, b, nil) // no member of the group at all
	assert.Equal(t, protocol.NoPermission, stranger.commit(group, topic, 0, 3).ResponseCode())

	require.Equal(t, protocol.Success, a.lock(protocol.UnlockBatchMQ, group, "client-a", mq).ResponseCode())
	require.Equal(t, protocol.Success, other.commit(group, topic, 0, 2).ResponseCode())
	off, _ = b.CommittedOffset(group, topic, 0)
	assert.Equal(t, int64(2), off)
}

// A client that locked a queue can commit it over the same connection before its first
// heartbeat registered it in the group.
func TestLockHolderCommitsBeforeItsHeartbeat(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.send("early", "m", "")
	mq := protocol.MessageQueue{Topic: "early", BrokerName: "broker-a", QueueID: 0}
	require.Equal(t, protocol.Success, c.lock(protocol.LockBatchMQ, "early-group", "client-e", mq).ResponseCode())
	resp := c.commit("early-group", "early", 0, 1)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	off, _ := b.CommittedOffset("early-group", "early", 0)
	assert.Equal(t, int64(1), off)
}

// TestAnyRequestKeepsAMemberAlive: a member that stops heartbeating but keeps committing
// stays in its group; one that goes silent expires.
func TestAnyRequestKeepsAMemberAlive(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) { c.ClientExpiry = time.Second })
	busy, silent := newRawClient(t, b, nil), newRawClient(t, b, nil)
	busy.send("alive", "m", "")
	// busy heartbeats first, so it would expire no later than silent if heartbeats counted alone.
	require.Equal(t, protocol.Success, busy.heartbeat("alive-group", "busy", "alive").ResponseCode())
	require.Equal(t, protocol.Success, silent.heartbeat("alive-group", "silent", "alive").ResponseCode())

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := int64(0); ; i++ {
			h := &protocol.UpdateConsumerOffsetRequestHeader{ConsumerGroup: "alive-group", Topic: "alive", QueueID: 0, CommitOffset: i % 2}
			if _, err := busy.cl.Invoke(ctx, b.Addr(), protocol.NewRequestWith(protocol.UpdateConsumerOffset, h, nil)); err != nil {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	defer func() { cancel(); <-done }()

	require.Eventually(t, func() bool {
		for _, id := range b.GroupMembers("alive-group") {
			if id == "silent" {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "the silent member never expired")
	assert.Equal(t, []string{"busy"}, b.GroupMembers("alive-group"), "the committing member expired")
}

// TestGroupCapRefusesNewGroupsWithAClearError: at MaxGroups, heartbeats, commits and retry
// routes that would create a group are refused, naming the cap; known groups keep working.
func TestGroupCapRefusesNewGroupsWithAClearError(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) { c.MaxGroups = 2 })
	c := newRawClient(t, b, nil)
	c.send("capped", "m", "")
	require.Equal(t, protocol.Success, c.heartbeat("g1", "c", "capped").ResponseCode())
	require.Equal(t, protocol.Success, c.heartbeat("g2", "c", "capped").ResponseCode())

	resp := c.heartbeat("g3", "c", "capped")
	assert.Equal(t, protocol.SubscriptionGroupNotExist, resp.ResponseCode())
	assert.Contains(t, resp.Remark, "MaxGroups=2")
	resp = c.commit("g4", "capped", 0, 1)
	assert.Equal(t, protocol.SubscriptionGroupNotExist, resp.ResponseCode())
	assert.Contains(t, resp.Remark, "MaxGroups=2")
	resp = c.invoke(context.Background(), protocol.GetRouteInfoByTopic, &protocol.GetRouteInfoRequestHeader{Topic: "%RETRY%g5"}, nil)
	assert.Equal(t, protocol.TopicNotExist, resp.ResponseCode())
	assert.Contains(t, resp.Remark, "MaxGroups=2")
	for _, g := range []string{"g3", "g4", "g5"} {
		_, ok := b.Group(g)
		assert.False(t, ok, g)
		_, ok = b.CommittedOffset(g, "capped", 0)
		assert.False(t, ok, g)
	}
	_, ok := b.Topic("%RETRY%g5")
	assert.False(t, ok)

	// Retry and dead-letter topics a producer names directly are capped at twice MaxGroups
	// (%RETRY%g1 and %RETRY%g2 exist already).
	h := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: "%DLQ%x1", DefaultTopic: protocol.AutoCreateTopicKey, DefaultTopicQueueNums: 1, BornTimestamp: time.Now().UnixMilli()}
	require.Equal(t, protocol.Success, c.invoke(context.Background(), protocol.SendMessage, h, []byte("m")).ResponseCode())
	h.Topic = "%DLQ%x2"
	require.Equal(t, protocol.Success, c.invoke(context.Background(), protocol.SendMessage, h, []byte("m")).ResponseCode())
	h.Topic = "%DLQ%x3"
	resp = c.invoke(context.Background(), protocol.SendMessage, h, []byte("m"))
	assert.NotEqual(t, protocol.Success, resp.ResponseCode())
	assert.Contains(t, resp.Remark, "twice MaxGroups")

	assert.Equal(t, protocol.Success, c.heartbeat("g1", "c", "capped").ResponseCode(), "a known group still works")
	assert.Equal(t, protocol.Success, c.commit("g1", "capped", 0, 1).ResponseCode())
}

// TestIdleGroupsAreForgotten: a group with no live member and no commit for GroupRetention
// loses its entry, offsets and retry topic; a group with a live member is kept.
func TestIdleGroupsAreForgotten(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) { c.GroupRetention = 300 * time.Millisecond })
	idle, live := newRawClient(t, b, nil), newRawClient(t, b, nil)
	idle.send("sweep", "m", "")
	require.Equal(t, protocol.Success, idle.heartbeat("idle", "i", "sweep").ResponseCode())
	require.Equal(t, protocol.Success, idle.commit("idle", "sweep", 0, 1).ResponseCode())
	require.Equal(t, protocol.Success, live.heartbeat("live", "l", "sweep").ResponseCode())
	require.Equal(t, protocol.Success, live.commit("live", "sweep", 0, 1).ResponseCode())
	_, ok := b.Topic("%RETRY%idle")
	require.True(t, ok)
	idle.cl.Close() // the member leaves with its connection

	require.Eventually(t, func() bool {
		_, ok := b.Group("idle") // forgotten last
		return !ok
	}, 10*time.Second, 10*time.Millisecond, "the idle group was never forgotten")
	_, ok = b.CommittedOffset("idle", "sweep", 0)
	assert.False(t, ok, "its offsets are forgotten")
	_, ok = b.Topic("%RETRY%idle")
	assert.False(t, ok, "its retry topic is deleted")

	_, ok = b.Group("live")
	assert.True(t, ok, "a group with a live member is kept")
	off, ok := b.CommittedOffset("live", "sweep", 0)
	assert.True(t, ok)
	assert.Equal(t, int64(1), off)
}

func TestHeartbeatRefusesBadSubscriptionTopics(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	for _, topic := range []string{"", "bad topic", "a/b", string(make([]byte, 200))} {
		resp := c.heartbeat("subs", "c", topic)
		assert.Equal(t, protocol.InvalidParameter, resp.ResponseCode(), "%q", topic)
		assert.Contains(t, resp.Remark, "bad topic")
	}
	assert.Empty(t, b.GroupMembers("subs"))
	_, ok := b.Group("subs")
	assert.False(t, ok, "a refused heartbeat created its group")
}

// TestNewGroupsAreWrittenTogether: groups created by heartbeats do not rewrite the group
// file each; the file gets them on the flush timer, and at shutdown at the latest.
func TestNewGroupsAreWrittenTogether(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) { c.TableFlushInterval = time.Hour })
	c := newRawClient(t, b, nil)
	path := filepath.Join(b.cfg.DataDir, "config", "subscriptionGroups.json")
	for i := range 20 {
		require.Equal(t, protocol.Success, c.heartbeat(fmt.Sprintf("burst-%d", i), "c").ResponseCode())
	}
	_, err := os.Stat(path)
	assert.ErrorIs(t, err, os.ErrNotExist, "the group file was written before the flush timer")

	b.stop(t)
	again := startBroker(t, func(c *broker.Config) { c.DataDir = b.cfg.DataDir })
	for i := range 20 {
		_, ok := again.Group(fmt.Sprintf("burst-%d", i))
		assert.True(t, ok, "burst-%d was not written at shutdown", i)
	}
}
