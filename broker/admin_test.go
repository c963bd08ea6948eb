package broker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

func TestAdminCreateUpdateDeleteTopic(t *testing.T) {
	b := startBroker(t, nil)
	var events []broker.Event
	got := make(chan broker.Event, 16)
	cancel := b.Subscribe(func(e broker.Event) { got <- e })
	defer cancel()

	tc := broker.TopicConfig{Name: "orders", ReadQueueNums: 4, WriteQueueNums: 4, Perm: protocol.PermRead | protocol.PermWrite}
	require.NoError(t, b.CreateTopic(tc))
	events = append(events, <-got)
	assert.Equal(t, broker.TopicCreated, events[0].Type)
	cur, ok := b.Topic("orders")
	require.True(t, ok)
	assert.Equal(t, tc, cur)

	err := b.CreateTopic(tc)
	require.ErrorIs(t, err, broker.ErrExists)

	err = b.CreateTopic(broker.TopicConfig{Name: "bad topic", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6})
	require.ErrorIs(t, err, broker.ErrBadTopic)
	err = b.CreateTopic(broker.TopicConfig{Name: "many", ReadQueueNums: 5000, WriteQueueNums: 1, Perm: 6})
	require.ErrorIs(t, err, broker.ErrBadTopic)
	err = b.CreateTopic(broker.TopicConfig{Name: broker.ScheduleTopic, ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6})
	require.ErrorIs(t, err, broker.ErrReserved)

	tc.ReadQueueNums, tc.WriteQueueNums, tc.Perm = 8, 8, protocol.PermRead
	require.NoError(t, b.UpdateTopic(tc))
	cur, _ = b.Topic("orders")
	assert.Equal(t, tc, cur)
	upd := <-got
	assert.Equal(t, broker.TopicUpdated, upd.Type)
	assert.Equal(t, 8, upd.Queues)
	err = b.UpdateTopic(broker.TopicConfig{Name: "nope", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6})
	require.ErrorIs(t, err, broker.ErrNotFound)
	_, ok = b.Topic("nope")
	assert.False(t, ok, "a failed update created the topic")

	require.NoError(t, b.DeleteTopic("orders"))
	e := <-got
	assert.Equal(t, broker.TopicDeleted, e.Type)
	_, ok = b.Topic("orders")
	assert.False(t, ok)
	require.ErrorIs(t, b.DeleteTopic("orders"), broker.ErrNotFound)
	require.ErrorIs(t, b.DeleteTopic(protocol.AutoCreateTopicKey), broker.ErrReserved)
	reply := protocol.ReplyTopic("local") // the default cluster
	require.ErrorIs(t, b.DeleteTopic(reply), broker.ErrReserved)
	_, ok = b.Topic(reply)
	assert.True(t, ok, "the reply topic is kept")
}

func TestAdminTopicChangesPersist(t *testing.T) {
	dir := t.TempDir()
	b := startBroker(t, func(c *broker.Config) { c.DataDir = dir })
	require.NoError(t, b.CreateTopic(broker.TopicConfig{Name: "kept", ReadQueueNums: 2, WriteQueueNums: 2, Perm: 6}))
	require.NoError(t, b.CreateTopic(broker.TopicConfig{Name: "gone", ReadQueueNums: 2, WriteQueueNums: 2, Perm: 6}))
	require.NoError(t, b.DeleteTopic("gone"))
	b.stop(t)
	b2 := startBroker(t, func(c *broker.Config) { c.DataDir = dir })
	_, ok := b2.Topic("kept")
	assert.True(t, ok)
	_, ok = b2.Topic("gone")
	assert.False(t, ok)
}

func TestAdminDescribeGroupShowsMembersOffsetsLagAndOwners(t *testing.T) {
	const group, topic = "describers", "described"
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	for range 5 {
		c.send(topic, "m", "")
	}
	require.Eventually(t, func() bool { return b.StoreMax(topic, 0) == 5 }, 5*time.Second, time.Millisecond)

	_, err := b.DescribeGroup(group)
	require.ErrorIs(t, err, broker.ErrNotFound)

	require.Equal(t, protocol.Success, c.heartbeat(group, "client-a", topic).ResponseCode())
	mq := protocol.MessageQueue{Topic: topic, BrokerName: "broker-a", QueueID: 0}
	require.Equal(t, protocol.Success, c.lock(protocol.LockBatchMQ, group, "client-a", mq).ResponseCode())
	require.Equal(t, protocol.Success, c.commit(group, topic, 0, 2).ResponseCode())

	info, err := b.DescribeGroup(group)
	require.NoError(t, err)
	require.Len(t, info.Members, 1)
	assert.Equal(t, "client-a", info.Members[0].ClientID)
	assert.NotEmpty(t, info.Members[0].RemoteAddr)
	require.Len(t, info.Subscriptions, 1)
	assert.Equal(t, topic, info.Subscriptions[0].Topic)
	require.NotNil(t, info.Config)
	require.Len(t, info.Topics, 1)
	gt := info.Topics[0]
	assert.Equal(t, topic, gt.Topic)
	require.Len(t, gt.Queues, 4, "every read queue of the topic")
	q0 := gt.Queues[0]
	assert.Equal(t, int64(2), q0.Committed)
	assert.Equal(t, int64(5), q0.MaxOffset)
	assert.Equal(t, int64(3), q0.Lag)
	assert.Equal(t, "client-a", q0.Owner)
	assert.Equal(t, int64(-1), gt.Queues[1].Committed)
	assert.Equal(t, "", gt.Queues[1].Owner)
	assert.Equal(t, int64(3), info.Lag)

	groups := b.Groups()
	require.Len(t, groups, 1)
	assert.Equal(t, broker.GroupSummary{Name: group, Configured: true, Members: 1, Topics: []string{topic}}, groups[0])
}

func TestAdminResetOffsetsTo(t *testing.T) {
	const group, topic = "resetters", "reset"
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	for range 5 {
		c.send(topic, "m", "")
	}
	require.Eventually(t, func() bool { return b.StoreMax(topic, 0) == 5 }, 5*time.Second, time.Millisecond)
	ctx := context.Background()

	table, err := b.ResetOffsetsTo(ctx, group, topic, map[int32]int64{0: 3, 1: 0})
	require.NoError(t, err)
	assert.Len(t, table, 2)
	off, ok := b.CommittedOffset(group, topic, 0)
	require.True(t, ok)
	assert.Equal(t, int64(3), off)

	_, err = b.ResetOffsetsTo(ctx, group, topic, map[int32]int64{0: 6})
	require.ErrorIs(t, err, broker.ErrBadOffset)
	_, err = b.ResetOffsetsTo(ctx, group, topic, map[int32]int64{9: 0})
	require.ErrorIs(t, err, broker.ErrBadOffset)
	_, err = b.ResetOffsetsTo(ctx, group, topic, map[int32]int64{0: 1, 1: 1})
	require.ErrorIs(t, err, broker.ErrBadOffset, "queue 1 is empty")
	off, _ = b.CommittedOffset(group, topic, 0)
	assert.Equal(t, int64(3), off, "a refused reset changed an offset")
	_, err = b.ResetOffsetsTo(ctx, group, "missing", map[int32]int64{0: 0})
	require.ErrorIs(t, err, broker.ErrNotFound)
	// The delay service keeps its progress as a group; an operator must not move it.
	_, err = b.ResetOffsetsTo(ctx, "%SCHEDULE%", broker.ScheduleTopic, map[int32]int64{0: 0})
	require.ErrorIs(t, err, broker.ErrReserved)
	_, err = b.ResetOffsets(ctx, "%SCHEDULE%", broker.ScheduleTopic, 0)
	require.ErrorIs(t, err, broker.ErrReserved)
}

func TestAdminMessageByID(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.send("viewed", "first", "")
	rh := c.send("viewed", "second", "tagB")

	m, err := b.MessageByID(rh.MsgID)
	require.NoError(t, err)
	assert.Equal(t, "viewed", m.Topic)
	assert.Equal(t, "second", string(m.Body))
	assert.Equal(t, "tagB", m.Properties[protocol.PropertyTags])
	assert.Equal(t, int64(1), m.QueueOffset)

	_, err = b.MessageByID("zz")
	require.ErrorIs(t, err, protocol.ErrBadMsgID)
	host, off, err := protocol.ParseOffsetMsgID(rh.MsgID)
	require.NoError(t, err)
	_, err = b.MessageByID(protocol.OffsetMsgID(host, off+1))
	require.ErrorIs(t, err, broker.ErrNotFound, "no message starts there")
	_, err = b.MessageByID(protocol.OffsetMsgID(host, off+1<<20))
	require.ErrorIs(t, err, broker.ErrNotFound, "past the end")
}

func TestAdminStatus(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) { c.Cluster = "east"; c.BrokerName = "node-1" })
	c := newRawClient(t, b, nil)
	c.send("counted", "m", "")
	require.Equal(t, protocol.Success, c.heartbeat("g1", "client-a", "counted").ResponseCode())
	require.Equal(t, protocol.Success, c.heartbeat("g2", "client-a", "counted").ResponseCode())

	st := b.Status()
	assert.Equal(t, "east", st.Cluster)
	assert.Equal(t, "node-1", st.BrokerName)
	assert.Equal(t, b.Addr(), st.Addr)
	assert.Equal(t, b.NamesrvAddr(), st.NamesrvAddr)
	assert.False(t, st.Started.IsZero())
	assert.Equal(t, 2, st.Groups)
	assert.Equal(t, 1, st.Clients)
	assert.Equal(t, 2, st.Members)
	assert.Positive(t, st.Store.CommitLogMaxOffset)
	_, ok := b.Topic("counted")
	require.True(t, ok)
	assert.Equal(t, len(b.Topics()), st.Topics)
}
