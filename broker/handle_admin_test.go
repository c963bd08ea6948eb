package broker_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// invokeAt sends a request to addr (the broker or the name service listener).
func (c *rawClient) invokeAt(addr string, code protocol.RequestCode, h protocol.Header, body []byte) *protocol.Command {
	c.t.Helper()
	resp, err := c.cl.Invoke(context.Background(), addr, protocol.NewRequestWith(code, h, body))
	require.NoError(c.t, err)
	return resp
}

// waitQueued waits until queue q of topic holds n messages: the consume queues are built
// after a send is answered.
func waitQueued(t *testing.T, b *testBroker, topic string, q int32, n int64) {
	t.Helper()
	require.Eventually(t, func() bool {
		queues, err := b.TopicQueues(topic)
		return err == nil && int(q) < len(queues) && queues[q].MaxOffset == n
	}, 5*time.Second, time.Millisecond)
}

func requireCode(t *testing.T, want protocol.ResponseCode, resp *protocol.Command) {
	t.Helper()
	require.Equal(t, want, resp.ResponseCode(), resp.Remark)
}

func (c *rawClient) commitAt(group, topic string, queueID int32, offset int64) {
	c.t.Helper()
	resp := c.invoke(context.Background(), protocol.UpdateConsumerOffset, &protocol.UpdateConsumerOffsetRequestHeader{ConsumerGroup: group, Topic: topic, QueueID: queueID, CommitOffset: offset}, nil)
	requireCode(c.t, protocol.Success, resp)
}

func (c *rawClient) consumerHeartbeat(clientID, group, topic string) {
	c.t.Helper()
	hb := protocol.HeartbeatData{ClientID: clientID, ConsumerDataSet: []protocol.ConsumerData{{
		GroupName: group, ConsumeType: protocol.ConsumeActively, MessageModel: protocol.Clustering,
		ConsumeFromWhere:    protocol.ConsumeFromFirstOffset,
		SubscriptionDataSet: []protocol.SubscriptionData{{Topic: topic, SubString: "a || b", TagsSet: []string{"a", "b"}, ExpressionType: "TAG"}},
	}}}
	body, err := hb.Encode()
	require.NoError(c.t, err)
	requireCode(c.t, protocol.Success, c.invoke(context.Background(), protocol.HeartBeat, nil, body))
}

func TestAdminNameServerRequestsAnswerOnBothListeners(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) { c.Cluster = "c1"; c.BrokerName = "b1" })
	c := newRawClient(t, b, nil)
	c.send("listed", "x", "")
	for _, addr := range []string{b.Addr(), b.NamesrvAddr()} {
		resp := c.invokeAt(addr, protocol.GetBrokerClusterInfo, nil, nil)
		requireCode(t, protocol.Success, resp)
		var ci protocol.ClusterInfo
		require.NoError(t, json.Unmarshal(resp.Body, &ci))
		assert.Equal(t, map[string][]string{"c1": {"b1"}}, ci.ClusterAddrTable, addr)
		assert.Equal(t, protocol.BrokerData{Cluster: "c1", BrokerName: "b1", BrokerAddrs: map[int64]string{0: b.Addr()}}, ci.BrokerAddrTable["b1"], addr)

		resp = c.invokeAt(addr, protocol.GetAllTopicListFromNamesrv, nil, nil)
		requireCode(t, protocol.Success, resp)
		var tl protocol.TopicList
		require.NoError(t, json.Unmarshal(resp.Body, &tl))
		assert.Contains(t, tl.TopicList, "listed")
		assert.Contains(t, tl.TopicList, protocol.ReplyTopic("c1"), "the reply topic exists from the start")

		resp = c.invokeAt(addr, protocol.GetTopicsByCluster, &protocol.GetTopicsByClusterRequestHeader{Cluster: "c1"}, nil)
		requireCode(t, protocol.Success, resp)
		tl = protocol.TopicList{}
		require.NoError(t, json.Unmarshal(resp.Body, &tl))
		assert.Contains(t, tl.TopicList, "listed")

		resp = c.invokeAt(addr, protocol.GetTopicsByCluster, &protocol.GetTopicsByClusterRequestHeader{Cluster: "other"}, nil)
		requireCode(t, protocol.Success, resp)
		assert.JSONEq(t, `{"topicList":[]}`, string(resp.Body), "another cluster has no topics here")

		requireCode(t, protocol.InvalidParameter, c.invokeAt(addr, protocol.GetTopicsByCluster, nil, nil))
	}
}

func TestAdminTopicStatsGiveEachQueuesRangeAndLastStoreTime(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	before := time.Now().UnixMilli()
	for range 3 {
		c.send("stats", "x", "")
	}
	waitQueued(t, b, "stats", 0, 3)
	resp := c.invoke(context.Background(), protocol.GetTopicStatsInfo, &protocol.TopicRequestHeader{Topic: "stats"}, nil)
	requireCode(t, protocol.Success, resp)
	st, err := protocol.DecodeTopicStatsTable(resp.Body)
	require.NoError(t, err)
	require.Len(t, st.OffsetTable, 4)
	q0 := st.OffsetTable[protocol.MessageQueue{Topic: "stats", BrokerName: b.Status().BrokerName, QueueID: 0}]
	assert.Equal(t, int64(0), q0.MinOffset)
	assert.Equal(t, int64(3), q0.MaxOffset)
	assert.GreaterOrEqual(t, q0.LastUpdateTimestamp, before)
	q1 := st.OffsetTable[protocol.MessageQueue{Topic: "stats", BrokerName: b.Status().BrokerName, QueueID: 1}]
	assert.Equal(t, protocol.TopicOffset{}, q1, "an empty queue")

	resp = c.invoke(context.Background(), protocol.GetTopicStatsInfo, &protocol.TopicRequestHeader{Topic: "nope"}, nil)
	requireCode(t, protocol.TopicNotExist, resp)
	assert.Contains(t, resp.Remark, "nope")
	requireCode(t, protocol.InvalidParameter, c.invoke(context.Background(), protocol.GetTopicStatsInfo, nil, nil))
}

func TestAdminConsumeStatsGiveEachQueuesOffsetsAndLag(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	before := time.Now().UnixMilli()
	for range 3 {
		c.send("cs", "x", "")
	}
	waitQueued(t, b, "cs", 0, 3)
	c.commitAt("cs-group", "cs", 0, 2)
	bn := b.Status().BrokerName
	for _, topic := range []string{"cs", ""} {
		resp := c.invoke(context.Background(), protocol.GetConsumeStats, &protocol.GetConsumeStatsRequestHeader{ConsumerGroup: "cs-group", Topic: topic}, nil)
		requireCode(t, protocol.Success, resp)
		st, err := protocol.DecodeConsumeStats(resp.Body)
		require.NoError(t, err)
		require.Len(t, st.OffsetTable, 4, "topic %q", topic)
		q0 := st.OffsetTable[protocol.MessageQueue{Topic: "cs", BrokerName: bn, QueueID: 0}]
		assert.Equal(t, int64(3), q0.BrokerOffset)
		assert.Equal(t, int64(2), q0.ConsumerOffset)
		assert.GreaterOrEqual(t, q0.LastTimestamp, before, "the store time of the last consumed message")
		assert.Equal(t, int64(1), st.Lag())
	}
	// A topic the group never touched: every queue at 0.
	c.send("other", "x", "")
	waitQueued(t, b, "other", 0, 1)
	resp := c.invoke(context.Background(), protocol.GetConsumeStats, &protocol.GetConsumeStatsRequestHeader{ConsumerGroup: "cs-group", Topic: "other"}, nil)
	requireCode(t, protocol.Success, resp)
	st, err := protocol.DecodeConsumeStats(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, int64(1), st.Lag())

	resp = c.invoke(context.Background(), protocol.GetConsumeStats, &protocol.GetConsumeStatsRequestHeader{ConsumerGroup: "no-group"}, nil)
	requireCode(t, protocol.SubscriptionGroupNotExist, resp)
	assert.Contains(t, resp.Remark, "no-group")
	resp = c.invoke(context.Background(), protocol.GetConsumeStats, &protocol.GetConsumeStatsRequestHeader{ConsumerGroup: "cs-group", Topic: "nope"}, nil)
	requireCode(t, protocol.TopicNotExist, resp)
	requireCode(t, protocol.InvalidParameter, c.invoke(context.Background(), protocol.GetConsumeStats, nil, nil))
}

func TestAdminConsumerConnectionListNamesLiveMembers(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.consumerHeartbeat("client-a", "conn-group", "conn-topic")
	resp := c.invoke(context.Background(), protocol.GetConsumerConnectionList, &protocol.ConsumerGroupRequestHeader{ConsumerGroup: "conn-group"}, nil)
	requireCode(t, protocol.Success, resp)
	var cc protocol.ConsumerConnection
	require.NoError(t, protocol.UnmarshalBody(resp.Body, &cc))
	require.Len(t, cc.ConnectionSet, 1)
	assert.Equal(t, "client-a", cc.ConnectionSet[0].ClientID)
	assert.NotEmpty(t, cc.ConnectionSet[0].ClientAddr)
	assert.Equal(t, protocol.ConsumeActively, cc.ConsumeType)
	assert.Equal(t, protocol.Clustering, cc.MessageModel)
	require.Contains(t, cc.SubscriptionTable, "conn-topic")
	assert.Equal(t, []string{"a", "b"}, cc.SubscriptionTable["conn-topic"].TagsSet)

	resp = c.invoke(context.Background(), protocol.GetConsumerConnectionList, &protocol.ConsumerGroupRequestHeader{ConsumerGroup: "nobody"}, nil)
	requireCode(t, protocol.ConsumerNotOnline, resp)
	assert.Contains(t, resp.Remark, "nobody")
	requireCode(t, protocol.InvalidParameter, c.invoke(context.Background(), protocol.GetConsumerConnectionList, nil, nil))
}

func TestAdminRuntimeInfoAndTopicConfigs(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.send("cfg-topic", "x", "")
	resp := c.invoke(context.Background(), protocol.GetBrokerRuntimeInfo, nil, nil)
	requireCode(t, protocol.Success, resp)
	var kv protocol.KVTable
	require.NoError(t, json.Unmarshal(resp.Body, &kv))
	st := b.Status()
	assert.Equal(t, strconv.FormatInt(st.Started.UnixMilli(), 10), kv.Table["bootTimestamp"])
	assert.Equal(t, strconv.FormatInt(st.Store.CommitLogMaxOffset, 10), kv.Table["commitLogMaxOffset"])
	assert.Equal(t, strconv.Itoa(st.Topics), kv.Table["topics"])
	assert.Contains(t, kv.Table["runtime"], "days")

	resp = c.invoke(context.Background(), protocol.GetAllTopicConfig, nil, nil)
	requireCode(t, protocol.Success, resp)
	var w protocol.TopicConfigWrapper
	require.NoError(t, json.Unmarshal(resp.Body, &w))
	require.Contains(t, w.TopicConfigTable, "cfg-topic")
	tc := w.TopicConfigTable["cfg-topic"]
	assert.Equal(t, 4, tc.ReadQueueNums)
	assert.Equal(t, protocol.PermRead|protocol.PermWrite, tc.Perm)
	assert.Equal(t, "SINGLE_TAG", tc.TopicFilterType)
}

func TestAdminSubscriptionGroupsCreateUpdateListDelete(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	put := func(sg protocol.SubscriptionGroupConfig) *protocol.Command {
		body, err := json.Marshal(sg)
		require.NoError(t, err)
		return c.invoke(context.Background(), protocol.UpdateAndCreateSubscriptionGroup, nil, body)
	}
	requireCode(t, protocol.Success, put(protocol.SubscriptionGroupConfig{GroupName: "sg", ConsumeEnable: true, RetryQueueNums: 1, RetryMaxTimes: 5}))
	g, ok := b.Group("sg")
	require.True(t, ok)
	assert.Equal(t, broker.GroupConfig{Name: "sg", ConsumeEnable: true, RetryQueueNums: 1, RetryMaxTimes: 5}, g)
	requireCode(t, protocol.Success, put(protocol.SubscriptionGroupConfig{GroupName: "sg", RetryQueueNums: 1, RetryMaxTimes: 7}))
	g, _ = b.Group("sg")
	assert.Equal(t, 7, g.RetryMaxTimes, "an update replaces the settings")
	assert.False(t, g.ConsumeEnable)

	resp := c.invoke(context.Background(), protocol.GetAllSubscriptionGroupConfig, nil, nil)
	requireCode(t, protocol.Success, resp)
	var w protocol.SubscriptionGroupWrapper
	require.NoError(t, json.Unmarshal(resp.Body, &w))
	require.Contains(t, w.SubscriptionGroupTable, "sg")
	assert.Equal(t, 7, w.SubscriptionGroupTable["sg"].RetryMaxTimes)

	requireCode(t, protocol.InvalidParameter, c.invoke(context.Background(), protocol.UpdateAndCreateSubscriptionGroup, nil, []byte("{not json")))
	requireCode(t, protocol.InvalidParameter, put(protocol.SubscriptionGroupConfig{GroupName: "bad name!"}))
	requireCode(t, protocol.InvalidParameter, put(protocol.SubscriptionGroupConfig{GroupName: "neg", RetryMaxTimes: -1}))

	// Delete, with the committed offsets.
	c.send("sg-topic", "x", "")
	c.commitAt("sg", "sg-topic", 0, 1)
	requireCode(t, protocol.Success, c.invoke(context.Background(), protocol.DeleteSubscriptionGroup, &protocol.DeleteSubscriptionGroupRequestHeader{GroupName: "sg", CleanOffset: true}, nil))
	_, ok = b.Group("sg")
	assert.False(t, ok)
	_, err := b.DescribeGroup("sg")
	assert.ErrorIs(t, err, broker.ErrNotFound, "cleanOffset removed the offsets too")
	resp = c.invoke(context.Background(), protocol.DeleteSubscriptionGroup, &protocol.DeleteSubscriptionGroupRequestHeader{GroupName: "sg"}, nil)
	requireCode(t, protocol.SubscriptionGroupNotExist, resp)
	assert.Contains(t, resp.Remark, "sg")
	requireCode(t, protocol.InvalidParameter, c.invoke(context.Background(), protocol.DeleteSubscriptionGroup, nil, nil))
}

func TestAdminInvokeResetOffsetMovesTheGroupAndTellsLiveMembers(t *testing.T) {
	b := startBroker(t, nil)
	told := make(chan *protocol.ResetOffsetBody, 4)
	member := newRawClient(t, b, remoting.HandlerFunc(func(_ context.Context, _ *remoting.Conn, req *protocol.Command) *protocol.Command {
		if req.RequestCode() == protocol.ResetConsumerOffset {
			body, err := protocol.DecodeResetOffsetBody(req.Body)
			if err == nil {
				told <- body
			}
		}
		return nil
	}))
	for range 3 {
		member.send("rs", "x", "")
	}
	waitQueued(t, b, "rs", 0, 3)
	member.consumerHeartbeat("member-1", "rs-group", "rs")
	member.commitAt("rs-group", "rs", 0, 3)

	resp := member.invoke(context.Background(), protocol.InvokeBrokerToResetOffset, &protocol.ResetOffsetRequestHeader{Topic: "rs", Group: "rs-group", Timestamp: 0, IsForce: true}, nil)
	requireCode(t, protocol.Success, resp)
	body, err := protocol.DecodeResetOffsetBody(resp.Body)
	require.NoError(t, err)
	q0 := protocol.MessageQueue{Topic: "rs", BrokerName: b.Status().BrokerName, QueueID: 0}
	assert.Equal(t, int64(0), body.OffsetTable[q0])
	select {
	case got := <-told:
		assert.Equal(t, int64(0), got.OffsetTable[q0])
	case <-time.After(5 * time.Second):
		t.Fatal("the live member was not told")
	}
	qr := member.invoke(context.Background(), protocol.QueryConsumerOffset, &protocol.QueryConsumerOffsetRequestHeader{ConsumerGroup: "rs-group", Topic: "rs", QueueID: 0}, nil)
	requireCode(t, protocol.Success, qr)
	assert.Equal(t, "0", qr.ExtFields["offset"])

	// A timestamp after the last message moves the group to the end.
	resp = member.invoke(context.Background(), protocol.InvokeBrokerToResetOffset, &protocol.ResetOffsetRequestHeader{Topic: "rs", Group: "rs-group", Timestamp: time.Now().Add(time.Hour).UnixMilli()}, nil)
	requireCode(t, protocol.Success, resp)
	body, err = protocol.DecodeResetOffsetBody(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, int64(3), body.OffsetTable[q0])

	resp = member.invoke(context.Background(), protocol.InvokeBrokerToResetOffset, &protocol.ResetOffsetRequestHeader{Topic: "nope", Group: "rs-group"}, nil)
	requireCode(t, protocol.TopicNotExist, resp)
	resp = member.invoke(context.Background(), protocol.InvokeBrokerToResetOffset, &protocol.ResetOffsetRequestHeader{Topic: "rs", Group: "nobody"}, nil)
	requireCode(t, protocol.SubscriptionGroupNotExist, resp)
	assert.Contains(t, resp.Remark, "nobody")
	requireCode(t, protocol.InvalidParameter, member.invoke(context.Background(), protocol.InvokeBrokerToResetOffset, nil, nil))
}
