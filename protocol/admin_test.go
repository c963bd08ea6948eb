package protocol

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConsumeStatsAreWrittenAsFastjsonAndReadBackInEitherForm(t *testing.T) {
	q0 := MessageQueue{Topic: "t", BrokerName: "b", QueueID: 0}
	q1 := MessageQueue{Topic: "t", BrokerName: "b", QueueID: 1}
	st := ConsumeStats{ConsumeTPS: 2.5, OffsetTable: map[MessageQueue]OffsetWrapper{
		q1: {BrokerOffset: 9, ConsumerOffset: 4, LastTimestamp: 7},
		q0: {BrokerOffset: 3, ConsumerOffset: 3},
	}}
	b, err := st.Encode()
	require.NoError(t, err)
	assert.Equal(t, `{"consumeTps":2.5,"offsetTable":{{"brokerName":"b","queueId":0,"topic":"t"}:{"brokerOffset":3,"consumerOffset":3,"lastTimestamp":0},{"brokerName":"b","queueId":1,"topic":"t"}:{"brokerOffset":9,"consumerOffset":4,"lastTimestamp":7}}}`, string(b))
	got, err := DecodeConsumeStats(b)
	require.NoError(t, err)
	assert.Equal(t, &st, got)
	assert.Equal(t, int64(5), got.Lag())

	gson := `{"offsetTable":[[{"topic":"t","brokerName":"b","queueId":1},{"brokerOffset":9,"consumerOffset":4,"lastTimestamp":7}]],"consumeTps":1}`
	got, err = DecodeConsumeStats([]byte(gson))
	require.NoError(t, err)
	assert.Equal(t, OffsetWrapper{BrokerOffset: 9, ConsumerOffset: 4, LastTimestamp: 7}, got.OffsetTable[q1])

	_, err = (&ConsumeStats{OffsetTable: map[MessageQueue]OffsetWrapper{{Topic: "a:b"}: {}}}).Encode()
	require.Error(t, err)
	_, err = DecodeConsumeStats([]byte(`{"offsetTable":{"not a queue":{}}}`))
	require.ErrorIs(t, err, ErrMalformedJSON)
}

func TestTopicStatsRoundTrip(t *testing.T) {
	q := MessageQueue{Topic: "t", BrokerName: "b", QueueID: 2}
	st := TopicStatsTable{OffsetTable: map[MessageQueue]TopicOffset{q: {MinOffset: 1, MaxOffset: 5, LastUpdateTimestamp: 99}}}
	b, err := st.Encode()
	require.NoError(t, err)
	assert.Equal(t, `{"offsetTable":{{"brokerName":"b","queueId":2,"topic":"t"}:{"minOffset":1,"maxOffset":5,"lastUpdateTimestamp":99}}}`, string(b))
	got, err := DecodeTopicStatsTable(b)
	require.NoError(t, err)
	assert.Equal(t, &st, got)
	_, err = DecodeTopicStatsTable([]byte(`{"offsetTable":`))
	require.Error(t, err)
}

func TestAdminBodiesUseJavasFieldNames(t *testing.T) {
	b, err := json.Marshal(&SubscriptionGroupWrapper{SubscriptionGroupTable: map[string]SubscriptionGroupConfig{"g": {GroupName: "g", RetryMaxTimes: 16}}})
	require.NoError(t, err)
	assert.Contains(t, string(b), `"subscriptionGroupTable":{"g":{"groupName":"g"`)
	assert.Contains(t, string(b), `"retryMaxTimes":16`)
	assert.Contains(t, string(b), `"dataVersion":{"timestamp":0,"counter":0}`)
	b, err = json.Marshal(&ClusterInfo{BrokerAddrTable: map[string]BrokerData{"b": {Cluster: "c", BrokerName: "b", BrokerAddrs: map[int64]string{0: "h:1"}}}, ClusterAddrTable: map[string][]string{"c": {"b"}}})
	require.NoError(t, err)
	assert.JSONEq(t, `{"brokerAddrTable":{"b":{"cluster":"c","brokerName":"b","brokerAddrs":{"0":"h:1"}}},"clusterAddrTable":{"c":["b"]}}`, string(b))
}

func TestReplyHeaderRoundTripAndRequiredFields(t *testing.T) {
	h := ReplyMessageRequestHeader{ProducerGroup: "g", Topic: "c_REPLY_TOPIC", DefaultTopic: "TBW102", DefaultTopicQueueNums: 4, QueueID: 0,
		SysFlag: 1, BornTimestamp: 5, Flag: 2, Properties: "a\x01b\x02", ReconsumeTimes: 1, UnitMode: true, BornHost: "1.2.3.4:5", StoreHost: "6.7.8.9:10", StoreTimestamp: 11}
	var got ReplyMessageRequestHeader
	require.NoError(t, got.Decode(h.Encode()))
	assert.Equal(t, h, got)
	ext := h.Encode()
	delete(ext, "producerGroup")
	require.ErrorIs(t, new(ReplyMessageRequestHeader).Decode(ext), ErrMissingField)
	ext = h.Encode()
	ext["queueId"] = "x"
	require.ErrorIs(t, new(ReplyMessageRequestHeader).Decode(ext), ErrBadField)
	assert.Equal(t, "c_REPLY_TOPIC", ReplyTopic("c"))
	assert.True(t, IsReplyTopic("c_REPLY_TOPIC"))
	assert.False(t, IsReplyTopic("_REPLY_TOPIC"))
}

func TestAdminHeadersDecode(t *testing.T) {
	var cs GetConsumeStatsRequestHeader
	require.NoError(t, cs.Decode((&GetConsumeStatsRequestHeader{ConsumerGroup: "g"}).Encode()))
	assert.Equal(t, GetConsumeStatsRequestHeader{ConsumerGroup: "g"}, cs)
	require.ErrorIs(t, new(GetConsumeStatsRequestHeader).Decode(map[string]string{}), ErrMissingField)
	var dg DeleteSubscriptionGroupRequestHeader
	require.NoError(t, dg.Decode((&DeleteSubscriptionGroupRequestHeader{GroupName: "g", CleanOffset: true}).Encode()))
	assert.True(t, dg.CleanOffset)
	require.ErrorIs(t, new(DeleteSubscriptionGroupRequestHeader).Decode(map[string]string{"groupName": "g", "cleanOffset": "maybe"}), ErrBadField)
	require.ErrorIs(t, new(TopicRequestHeader).Decode(map[string]string{}), ErrMissingField)
	require.ErrorIs(t, new(ConsumerGroupRequestHeader).Decode(map[string]string{}), ErrMissingField)
	require.ErrorIs(t, new(GetTopicsByClusterRequestHeader).Decode(map[string]string{}), ErrMissingField)
	assert.Equal(t, "GET_CONSUME_STATS", GetConsumeStats.String())
	assert.Equal(t, "PUSH_REPLY_MESSAGE_TO_CLIENT", PushReplyMessageToClient.String())
}
