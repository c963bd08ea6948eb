package broker_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

// invokeRaw sends a request with exactly the given extFields, so that a test can send what
// no typed header would encode (garbage numbers, missing fields).
func (c *rawClient) invokeRaw(code protocol.RequestCode, ext map[string]string, body []byte) *protocol.Command {
	c.t.Helper()
	resp, err := c.cl.Invoke(context.Background(), c.b.Addr(), protocol.NewRequest(code, ext, body))
	require.NoError(c.t, err)
	return resp
}

// TestOffsetRequestsRefuseBadInput sends every offset request a bad topic name, a bad group
// name and queue ids that cannot exist, and wants INVALID_PARAMETER naming the culprit, never
// a silent success (an UPDATE_CONSUMER_OFFSET for queue 7 of a 4-queue topic used to be
// stored and persisted).
func TestOffsetRequestsRefuseBadInput(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.send("vt", "m", "") // creates vt with 4 queues

	codes := []protocol.RequestCode{
		protocol.QueryConsumerOffset, protocol.UpdateConsumerOffset,
		protocol.GetMaxOffset, protocol.GetMinOffset, protocol.SearchOffsetByTimestamp,
	}
	hasGroup := map[protocol.RequestCode]bool{protocol.QueryConsumerOffset: true, protocol.UpdateConsumerOffset: true}
	cases := []struct {
		name, group, topic, queue string
		want                      protocol.ResponseCode
		remark                    string
		groupOnly                 bool
	}{
		{name: "valid", group: "g", topic: "vt", queue: "1", want: protocol.Success},
		{name: "topic with a slash", group: "g", topic: "../vt", queue: "0", want: protocol.InvalidParameter, remark: "bad topic"},
		{name: "topic too long", group: "g", topic: strings.Repeat("t", 128), queue: "0", want: protocol.InvalidParameter, remark: "bad topic"},
		{name: "negative queue", group: "g", topic: "vt", queue: "-1", want: protocol.InvalidParameter, remark: "queueId -1"},
		{name: "queue past the topic's queues", group: "g", topic: "vt", queue: "4", want: protocol.InvalidParameter, remark: "4 read queues"},
		{name: "huge queue", group: "g", topic: "vt", queue: "2147483647", want: protocol.InvalidParameter, remark: "queueId 2147483647"},
		{name: "queue beyond int32", group: "g", topic: "vt", queue: "99999999999", want: protocol.InvalidParameter, remark: "queueId"},
		{name: "queue not a number", group: "g", topic: "vt", queue: "abc", want: protocol.InvalidParameter, remark: "queueId"},
		{name: "group with a slash", group: "g/../x", topic: "vt", queue: "0", want: protocol.InvalidParameter, remark: "bad consumer group", groupOnly: true},
		{name: "group too long", group: strings.Repeat("g", 121), topic: "vt", queue: "0", want: protocol.InvalidParameter, remark: "bad consumer group", groupOnly: true},
	}
	for _, code := range codes {
		for _, tc := range cases {
			if tc.groupOnly && !hasGroup[code] {
				continue
			}
			t.Run(code.String()+"/"+tc.name, func(t *testing.T) {
				ext := map[string]string{"topic": tc.topic, "queueId": tc.queue, "consumerGroup": tc.group,
					"commitOffset": "1", "timestamp": "0", "setZeroIfNotFound": "true"}
				resp := c.invokeRaw(code, ext, nil)
				require.Equal(t, tc.want, resp.ResponseCode(), resp.Remark)
				assert.Contains(t, resp.Remark, tc.remark)
			})
		}
	}
	_, ok := b.CommittedOffset("g", "vt", 4)
	assert.False(t, ok, "an offset of a queue the topic does not have was stored")
}

// TestHeartbeatRefusesBadGroupName: a group name is persisted and becomes part of the retry
// topic's name, so a name RocketMQ would refuse must be refused before anything is created.
func TestHeartbeatRefusesBadGroupName(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	for _, g := range []string{"a b", "x/../../y", strings.Repeat("g", 121), "g\x00"} {
		hb := protocol.HeartbeatData{ClientID: "c1", ConsumerDataSet: []protocol.ConsumerData{{
			GroupName: g, ConsumeType: protocol.ConsumeActively, MessageModel: protocol.Clustering,
		}}}
		body, err := hb.Encode()
		require.NoError(t, err)
		resp := c.invoke(context.Background(), protocol.HeartBeat, nil, body)
		require.Equal(t, protocol.InvalidParameter, resp.ResponseCode(), "group %q: %s", g, resp.Remark)
		assert.Contains(t, resp.Remark, "bad consumer group")
		assert.Empty(t, b.GroupMembers(g))
	}
	// A pull names its group too.
	h := pullHeader("vt", 0, 0, "*")
	h.ConsumerGroup = "bad group"
	c.send("vt", "m", "")
	resp := c.invoke(context.Background(), protocol.PullMessage, h, nil)
	require.Equal(t, protocol.InvalidParameter, resp.ResponseCode(), resp.Remark)
	assert.Contains(t, resp.Remark, "bad consumer group")
}

// TestPullHugeSuspendTimeoutIsCapped: suspendTimeoutMillis = MaxInt64 used to overflow the
// Duration to a negative wait, so the pull answered at once instead of parking; a client that
// long-polls in a loop then spins.
func TestPullHugeSuspendTimeoutIsCapped(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) { c.MaxLongPoll = 400 * time.Millisecond })
	c := newRawClient(t, b, nil)
	c.send("hs", "m", "")
	require.Eventually(t, func() bool { return b.StoreMax("hs", 0) == 1 }, 5*time.Second, 5*time.Millisecond)
	h := pullHeader("hs", 1, time.Second, "*")
	h.SuspendTimeoutMillis = math.MaxInt64
	start := time.Now()
	resp := c.invoke(context.Background(), protocol.PullMessage, h, nil)
	require.Equal(t, protocol.PullNotFound, resp.ResponseCode(), resp.Remark)
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "the pull did not park")
}

// TestDelayedMessageToARecreatedTopicLandsInAnExistingQueue: a topic deleted while a message
// for its queue 3 waits in the delay queue comes back with one queue; the message must land in
// a queue the topic's route has, not in queue 3 where no consumer looks.
func TestDelayedMessageToARecreatedTopicLandsInAnExistingQueue(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) { c.DelayLevels = "1s" })
	c := newRawClient(t, b, nil)
	resp := c.invoke(context.Background(), protocol.UpdateAndCreateTopic, &protocol.CreateTopicRequestHeader{
		Topic: "dq", ReadQueueNums: 4, WriteQueueNums: 4, Perm: protocol.PermRead | protocol.PermWrite,
	}, nil)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	h := &protocol.SendMessageRequestHeader{
		ProducerGroup: "raw", Topic: "dq", DefaultTopic: protocol.AutoCreateTopicKey, DefaultTopicQueueNums: 4,
		QueueID: 3, BornTimestamp: time.Now().UnixMilli(),
		Properties: protocol.EncodeProperties(map[string]string{protocol.PropertyDelayLevel: "1"}),
	}
	resp = c.invoke(context.Background(), protocol.SendMessage, h, []byte("later"))
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	resp = c.invoke(context.Background(), protocol.DeleteTopicInBroker, &protocol.DeleteTopicRequestHeader{Topic: "dq"}, nil)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	resp = c.invoke(context.Background(), protocol.UpdateAndCreateTopic, &protocol.CreateTopicRequestHeader{
		Topic: "dq", ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermRead | protocol.PermWrite,
	}, nil)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)

	require.Eventually(t, func() bool { return b.StoreMax("dq", 0) == 1 }, 5*time.Second, 20*time.Millisecond,
		"the delayed message did not arrive in queue 0 of the re-created topic")
	assert.Zero(t, b.StoreMax("dq", 3))
}

// TestDelayedAndRetriedMessagesDoNotReviveADeletedTopic: a delayed message, and a retry,
// that fall due after their topic was deleted are dropped; the topic stays deleted.
func TestDelayedAndRetriedMessagesDoNotReviveADeletedTopic(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) { c.DelayLevels = "100ms" })
	c := newRawClient(t, b, nil)
	ctx := context.Background()
	del := func(topic string) {
		t.Helper()
		resp := c.invoke(ctx, protocol.DeleteTopicInBroker, &protocol.DeleteTopicRequestHeader{Topic: topic}, nil)
		require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	}
	h := &protocol.SendMessageRequestHeader{
		ProducerGroup: "raw", Topic: "gone", DefaultTopic: protocol.AutoCreateTopicKey, DefaultTopicQueueNums: 4,
		BornTimestamp: time.Now().UnixMilli(),
		Properties:    protocol.EncodeProperties(map[string]string{protocol.PropertyDelayLevel: "1"}),
	}
	resp := c.invoke(ctx, protocol.SendMessage, h, []byte("later"))
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	del("gone")

	sent := c.send("work", "payload", "")
	_, phys, err := protocol.ParseOffsetMsgID(sent.MsgID)
	require.NoError(t, err)
	resp = c.invoke(ctx, protocol.ConsumerSendMsgBack, &protocol.ConsumerSendMsgBackRequestHeader{Offset: phys, Group: "workers", DelayLevel: 1}, nil)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	del("%RETRY%workers")

	// The delay service moves past both messages once it has handled them.
	require.Eventually(t, func() bool {
		off, _ := b.CommittedOffset("%SCHEDULE%", broker.ScheduleTopic, 0)
		return off == 2
	}, 10*time.Second, 10*time.Millisecond)
	for _, topic := range []string{"gone", "%RETRY%workers"} {
		_, ok := b.Topic(topic)
		assert.False(t, ok, "%s was re-created", topic)
		assert.Zero(t, b.StoreMax(topic, 0), "%s holds a message", topic)
	}
}

// TestLockAndResetRefuseBadGroupName: the lock table and the offset table are keyed by
// group; a name no heartbeat could register must not create entries there either.
func TestLockAndResetRefuseBadGroupName(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.send("lk", "m", "")
	body, err := protocol.MarshalBody(protocol.LockBatchRequestBody{ConsumerGroup: "bad group", ClientID: "c1",
		MQSet: []protocol.MessageQueue{{Topic: "lk", BrokerName: "broker-a", QueueID: 0}}})
	require.NoError(t, err)
	resp := c.invoke(context.Background(), protocol.LockBatchMQ, nil, body)
	require.Equal(t, protocol.InvalidParameter, resp.ResponseCode(), resp.Remark)
	assert.Contains(t, resp.Remark, "bad consumer group")
	assert.Empty(t, b.LockedQueues("bad group"))

	_, err = b.ResetOffsets(context.Background(), "bad/group", "lk", 0)
	require.Error(t, err)
	_, ok := b.CommittedOffset("bad/group", "lk", 0)
	assert.False(t, ok)
}

// TestPullHostileHeaders sends pulls no client would and wants a clear answer to each (and
// no panic): the broker checks the queue, the group and the offsets before the store reads.
func TestPullHostileHeaders(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.send("ph", "m", "")
	require.Eventually(t, func() bool { return b.StoreMax("ph", 0) == 1 }, 5*time.Second, 5*time.Millisecond)
	base := func() map[string]string {
		return map[string]string{"consumerGroup": "g", "topic": "ph", "queueId": "0", "queueOffset": "0",
			"maxMsgNums": "32", "sysFlag": "0", "commitOffset": "0", "suspendTimeoutMillis": "0", "subVersion": "0"}
	}
	cases := []struct {
		name   string
		set    map[string]string
		want   protocol.ResponseCode
		remark string
	}{
		{"ok", nil, protocol.Success, "FOUND"},
		{"negative offset", map[string]string{"queueOffset": "-5"}, protocol.PullOffsetMoved, ""},
		{"offset past the end", map[string]string{"queueOffset": "9223372036854775807"}, protocol.PullOffsetMoved, ""},
		{"negative maxMsgNums", map[string]string{"maxMsgNums": "-1"}, protocol.Success, ""},
		{"huge maxMsgNums", map[string]string{"maxMsgNums": "2147483647"}, protocol.Success, ""},
		{"negative queue", map[string]string{"queueId": "-1"}, protocol.InvalidParameter, "queueId -1"},
		{"queue out of range", map[string]string{"queueId": "4"}, protocol.InvalidParameter, "4 read queues"},
		{"unknown topic", map[string]string{"topic": "nope"}, protocol.TopicNotExist, "nope"},
		{"bad topic name", map[string]string{"topic": "a b"}, protocol.TopicNotExist, "a b"},
		{"empty group", map[string]string{"consumerGroup": ""}, protocol.InvalidParameter, "bad consumer group"},
		{"bad group", map[string]string{"consumerGroup": "a\nb"}, protocol.InvalidParameter, "bad consumer group"},
		{"unknown expression type", map[string]string{"sysFlag": "4", "subscription": "*", "expressionType": "XPATH"}, protocol.SubscriptionParseFailed, "XPATH"},
		{"SQL92 that does not parse", map[string]string{"sysFlag": "4", "subscription": "a > AND", "expressionType": "SQL92"}, protocol.SubscriptionParseFailed, `"AND" at 4`},
		{"WASM without a compiler", map[string]string{"sysFlag": "4", "subscription": "f@1", "expressionType": "wasm"}, protocol.SubscriptionParseFailed, "WASM filtering is not enabled"},
		{"negative commit offset with the commit flag", map[string]string{"sysFlag": "1", "commitOffset": "-7"}, protocol.Success, ""},
		{"garbage number", map[string]string{"queueOffset": "0x10"}, protocol.InvalidParameter, "queueOffset"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ext := base()
			for k, v := range tc.set {
				ext[k] = v
			}
			resp := c.invokeRaw(protocol.PullMessage, ext, nil)
			require.Equal(t, tc.want, resp.ResponseCode(), resp.Remark)
			assert.Contains(t, resp.Remark, tc.remark)
		})
	}
	_, ok := b.CommittedOffset("g", "ph", 0)
	assert.False(t, ok, "a negative commit offset was stored")
}

// TestSendBackHostileHeaders: CONSUMER_SEND_MSG_BACK names a commit-log offset and a group;
// nonsense in either gets an error naming it, and an absurd delay level is capped, not a panic.
func TestSendBackHostileHeaders(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.send("sb", "m", "")
	require.Eventually(t, func() bool { return b.StoreMax("sb", 0) == 1 }, 5*time.Second, 5*time.Millisecond)
	cases := []struct {
		name, offset, group, level string
		want                       protocol.ResponseCode
		remark                     string
	}{
		{"negative offset", "-1", "g", "0", protocol.SystemError, "commit-log offset -1"},
		{"offset past the log", "9223372036854775807", "g", "0", protocol.SystemError, "commit-log offset 9223372036854775807"},
		{"bad group", "0", "a b", "0", protocol.InvalidParameter, "bad consumer group"},
		{"huge delay level", "0", "g", "2147483647", protocol.Success, ""},
		{"negative delay level goes to the DLQ", "0", "g", "-1", protocol.Success, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := c.invokeRaw(protocol.ConsumerSendMsgBack, map[string]string{"offset": tc.offset, "group": tc.group, "delayLevel": tc.level}, nil)
			require.Equal(t, tc.want, resp.ResponseCode(), resp.Remark)
			assert.Contains(t, resp.Remark, tc.remark)
		})
	}
	require.Eventually(t, func() bool { return b.StoreMax(broker.DLQTopicPrefix+"g", 0) == 1 }, 5*time.Second, 5*time.Millisecond)
}
