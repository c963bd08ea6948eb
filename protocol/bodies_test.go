package protocol

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func sampleRoute() *TopicRouteData {
	return &TopicRouteData{
		QueueDatas: []QueueData{
			{BrokerName: "broker-a", ReadQueueNums: 4, WriteQueueNums: 4, Perm: PermRead | PermWrite},
			{BrokerName: "broker-b", ReadQueueNums: 8, WriteQueueNums: 2, Perm: PermRead, TopicSysFlag: 1},
		},
		BrokerDatas: []BrokerData{
			{Cluster: "DefaultCluster", BrokerName: "broker-a", BrokerAddrs: map[int64]string{0: "127.0.0.1:10911", 1: "127.0.0.1:10921"}},
			{Cluster: "DefaultCluster", BrokerName: "broker-b", BrokerAddrs: map[int64]string{0: "[::1]:10911"}},
		},
		FilterServerTable: map[string][]string{},
	}
}

func TestTopicRouteDataEncode(t *testing.T) {
	b, err := sampleRoute().Encode()
	require.NoError(t, err)
	require.JSONEq(t, `{
		"queueDatas":[
			{"brokerName":"broker-a","readQueueNums":4,"writeQueueNums":4,"perm":6,"topicSysFlag":0},
			{"brokerName":"broker-b","readQueueNums":8,"writeQueueNums":2,"perm":4,"topicSysFlag":1}],
		"brokerDatas":[
			{"cluster":"DefaultCluster","brokerName":"broker-a","brokerAddrs":{"0":"127.0.0.1:10911","1":"127.0.0.1:10921"}},
			{"cluster":"DefaultCluster","brokerName":"broker-b","brokerAddrs":{"0":"[::1]:10911"}}],
		"filterServerTable":{}}`, string(b))
	require.NotContains(t, string(b), " ", "no spaces: the Go client splits brokerAddrs textually")

	got, err := DecodeTopicRouteData(b)
	require.NoError(t, err)
	require.Equal(t, sampleRoute(), got)

	t.Run("empty route never writes null", func(t *testing.T) {
		b, err := (&TopicRouteData{BrokerDatas: []BrokerData{{BrokerName: "x"}}}).Encode()
		require.NoError(t, err)
		require.JSONEq(t, `{"queueDatas":[],"brokerDatas":[{"cluster":"","brokerName":"x","brokerAddrs":{}}],"filterServerTable":{}}`, string(b))
	})
	t.Run("address the Go client would misparse", func(t *testing.T) {
		r := sampleRoute()
		r.BrokerDatas[0].BrokerAddrs[2] = `a,b:1`
		_, err := r.Encode()
		require.ErrorContains(t, err, `address "a,b:1" must be printable ASCII`)
		r.BrokerDatas[0].BrokerAddrs[2] = `host\name:1`
		_, err = r.Encode()
		require.Error(t, err)
		r.BrokerDatas[0].BrokerAddrs[2] = `a&b<c>:1`
		b, err := r.Encode()
		require.NoError(t, err)
		require.Contains(t, string(b), `"2":"a&b<c>:1"`, "no HTML escaping")
	})
}

// TestTopicRouteDataFastjson decodes what a Java name server writes: fastjson puts bare integer
// keys in brokerAddrs, and RocketMQ before 4.9.0 spells topicSysFlag "topicSynFlag".
func TestTopicRouteDataFastjson(t *testing.T) {
	body := `{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.1:10921"},"brokerName":"broker-a","cluster":"DefaultCluster"},` +
		`{"brokerAddrs":{0:"[::1]:10911"},"brokerName":"broker-b","cluster":"DefaultCluster"}],` +
		`"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSynFlag":0,"writeQueueNums":4},` +
		`{"brokerName":"broker-b","perm":4,"readQueueNums":8,"topicSynFlag":1,"writeQueueNums":2}]}`
	got, err := DecodeTopicRouteData([]byte(body))
	require.NoError(t, err)
	require.Equal(t, sampleRoute(), got)

	spaced := "{ \"brokerDatas\" : [ { \"brokerAddrs\" : { 0 : \"a:1\" , -1 : \"b:2\" } } ] , \"queueDatas\" : [ ] }"
	got, err = DecodeTopicRouteData([]byte(spaced))
	require.NoError(t, err)
	require.Equal(t, map[int64]string{0: "a:1", -1: "b:2"}, got.BrokerDatas[0].BrokerAddrs)
}

func TestTopicRouteDataBadInput(t *testing.T) {
	for _, body := range []string{
		``, `{`, `{"queueDatas":[}`, `{"brokerDatas":[{"brokerAddrs":{0:}}]}`, `{"brokerDatas":[{"brokerAddrs":{x:"a"}}]}`,
		`{"brokerDatas":[{"brokerAddrs":{"x":"a"}}]}`, `{"queueDatas":[{"perm":"6"}]}`, `{"a":"unterminated}`, `[] []`,
		`{"brokerDatas":[{"brokerAddrs":{0:"a"}}]} x`, `{:1}`,
	} {
		_, err := DecodeTopicRouteData([]byte(body))
		require.ErrorIs(t, err, ErrMalformedJSON, body)
	}
}

func TestQuoteObjectKeys(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{0:"a"}`, `{"0":"a"}`},
		{`{"s":1}`, `{"s":1}`},
		{`{{"brokerName":"b","queueId":0,"topic":"t"}:42}`, `{"{\"brokerName\":\"b\",\"queueId\":0,\"topic\":\"t\"}":42}`},
		{`{{1:2}:3}`, `{"{\"1\":2}":3}`},
		{`[{0:{1:[]}}]`, `[{"0":{"1":[]}}]`},
		{`{"a\"}":1}`, `{"a\"}":1}`},
		{` { 0 : 1 } `, ` { "0" : 1 } `},
	}
	for _, tt := range tests {
		got, err := quoteObjectKeys([]byte(tt.in))
		require.NoError(t, err, tt.in)
		require.Equal(t, tt.want, string(got))
		require.True(t, json.Valid(got), tt.in)
	}
	deep := make([]byte, 0, 2*maxJSONDepth+10)
	for range maxJSONDepth + 2 {
		deep = append(deep, '[')
	}
	_, err := quoteObjectKeys(deep)
	require.ErrorContains(t, err, "nested deeper than 128")
}

// TestHeartbeatData decodes heartbeats as the Go client and a Java client write them.
func TestHeartbeatData(t *testing.T) {
	// rocketmq-client-go: tagsSet and codeSet are its utils.Set, written as sorted arrays of
	// strings; codes are strings.
	goClient := `{"clientID":"10.0.0.7@12345#1712345678","producerDataSet":[],"consumerDataSet":[{"groupName":"cg",` +
		`"consumeType":"CONSUME_ACTIVELY","messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",` +
		`"subscriptionDataSet":[{"classFilterMode":false,"topic":"TopicTest","subString":"TagA || TagB","tagsSet":["TagA","TagB"],` +
		`"codeSet":["2598919","2598920"],"subVersion":1712345678901234567,"expressionType":"TAG"}],"unitMode":false}]}`
	// Java (fastjson): codes are numbers, fields in alphabetical order, extra fields.
	java := `{"clientID":"10.0.0.7@12345#1712345678","consumerDataSet":[{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",` +
		`"consumeType":"CONSUME_ACTIVELY","groupName":"cg","messageModel":"CLUSTERING","subscriptionDataSet":[{"classFilterMode":false,` +
		`"codeSet":[2598919,2598920],"expressionType":"TAG","subString":"TagA || TagB","subVersion":1712345678901234567,` +
		`"tagsSet":["TagA","TagB"],"topic":"TopicTest"}],"unitMode":false}],"heartbeatFingerprint":0,"producerDataSet":[]}`
	want := &HeartbeatData{
		ClientID:        "10.0.0.7@12345#1712345678",
		ProducerDataSet: []ProducerData{},
		ConsumerDataSet: []ConsumerData{{
			GroupName: "cg", ConsumeType: ConsumeActively, MessageModel: Clustering, ConsumeFromWhere: ConsumeFromLastOffset,
			SubscriptionDataSet: []SubscriptionData{{
				Topic: "TopicTest", SubString: "TagA || TagB", TagsSet: []string{"TagA", "TagB"},
				CodeSet: CodeSet{TagsCode("TagA"), TagsCode("TagB")}, SubVersion: 1712345678901234567, ExpressionType: ExpressionTag,
			}},
		}},
	}
	for name, body := range map[string]string{"go": goClient, "java": java} {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeHeartbeatData([]byte(body))
			require.NoError(t, err)
			require.Equal(t, want, got)
		})
	}
	t.Run("round trip", func(t *testing.T) {
		b, err := want.Encode()
		require.NoError(t, err)
		got, err := DecodeHeartbeatData(b)
		require.NoError(t, err)
		require.Equal(t, want, got)
		b, err = (&HeartbeatData{ClientID: "x"}).Encode()
		require.NoError(t, err)
		require.JSONEq(t, `{"clientID":"x","producerDataSet":[],"consumerDataSet":[]}`, string(b))
	})
	t.Run("bad code", func(t *testing.T) {
		_, err := DecodeHeartbeatData([]byte(`{"consumerDataSet":[{"subscriptionDataSet":[{"codeSet":["x"]}]}]}`))
		require.ErrorIs(t, err, ErrMalformedJSON)
		require.ErrorContains(t, err, `codeSet: "x" is not a tag code`)
	})
}

func TestSmallBodies(t *testing.T) {
	mqs := []MessageQueue{{Topic: "t", BrokerName: "b", QueueID: 0}, {Topic: "t", BrokerName: "b", QueueID: 1}}
	tests := []struct {
		name string
		v    any
		json string
		into any
	}{
		{"consumer list", &ConsumerListBody{ConsumerIDList: []string{"c1", "c2"}}, `{"consumerIdList":["c1","c2"]}`, new(ConsumerListBody)},
		{"empty consumer list", &ConsumerListBody{}, `{"consumerIdList":[]}`, new(ConsumerListBody)},
		{"lock request", &LockBatchRequestBody{ConsumerGroup: "cg", ClientID: "c1", MQSet: mqs},
			`{"consumerGroup":"cg","clientId":"c1","mqSet":[{"topic":"t","brokerName":"b","queueId":0},{"topic":"t","brokerName":"b","queueId":1}]}`, new(LockBatchRequestBody)},
		{"lock response", &LockBatchResponseBody{LockOKMQSet: mqs[:1]}, `{"lockOKMQSet":[{"topic":"t","brokerName":"b","queueId":0}]}`, new(LockBatchResponseBody)},
		{"empty lock response", &LockBatchResponseBody{}, `{"lockOKMQSet":[]}`, new(LockBatchResponseBody)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := MarshalBody(tt.v)
			require.NoError(t, err)
			require.JSONEq(t, tt.json, string(b))
			require.NoError(t, UnmarshalBody(b, tt.into))
		})
	}
	var got LockBatchResponseBody
	err := UnmarshalBody([]byte(`{"lockOKMQSet":[{"topic":1}]}`), &got)
	require.ErrorIs(t, err, ErrMalformedJSON)
	require.ErrorContains(t, err, "decode *protocol.LockBatchResponseBody")
}

func TestResetOffsetBody(t *testing.T) {
	table := map[MessageQueue]int64{
		{Topic: "TopicTest", BrokerName: "broker-b", QueueID: 0}: 7,
		{Topic: "TopicTest", BrokerName: "broker-a", QueueID: 1}: 1 << 40,
		{Topic: "TopicTest", BrokerName: "broker-a", QueueID: 0}: -1,
	}
	b, err := (&ResetOffsetBody{OffsetTable: table}).Encode()
	require.NoError(t, err)
	require.Equal(t, `{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"TopicTest"}:-1,`+
		`{"brokerName":"broker-a","queueId":1,"topic":"TopicTest"}:1099511627776,`+
		`{"brokerName":"broker-b","queueId":0,"topic":"TopicTest"}:7}}`, string(b))

	forms := map[string]string{
		"ours":     string(b),
		"gson":     `{"offsetTable":[[{"topic":"TopicTest","brokerName":"broker-a","queueId":0},-1],[{"topic":"TopicTest","brokerName":"broker-a","queueId":1},1099511627776],[{"topic":"TopicTest","brokerName":"broker-b","queueId":0},7]]}`,
		"standard": `{"offsetTable":{"{\"topic\":\"TopicTest\",\"brokerName\":\"broker-a\",\"queueId\":0}":-1,"{\"topic\":\"TopicTest\",\"brokerName\":\"broker-a\",\"queueId\":1}":1099511627776,"{\"topic\":\"TopicTest\",\"brokerName\":\"broker-b\",\"queueId\":0}":7}}`,
		"spaced":   "{ \"offsetTable\" : { {\"brokerName\":\"broker-a\",\"queueId\":0,\"topic\":\"TopicTest\"} : -1 , {\"brokerName\":\"broker-a\",\"queueId\":1,\"topic\":\"TopicTest\"}:1099511627776,{\"topic\":\"TopicTest\",\"brokerName\":\"broker-b\",\"queueId\":0}:7 } }",
	}
	for name, body := range forms {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeResetOffsetBody([]byte(body))
			require.NoError(t, err)
			require.Equal(t, table, got.OffsetTable)
		})
	}

	empty, err := (&ResetOffsetBody{}).Encode()
	require.NoError(t, err)
	require.Equal(t, `{"offsetTable":{}}`, string(empty))
	got, err := DecodeResetOffsetBody(empty)
	require.NoError(t, err)
	require.Empty(t, got.OffsetTable)

	_, err = (&ResetOffsetBody{OffsetTable: map[MessageQueue]int64{{Topic: "a,{b"}: 1}}).Encode()
	require.ErrorContains(t, err, "must not contain")

	for _, bad := range []string{`{"offsetTable":{{"topic":1}:2}}`, `{"offsetTable":{"x":1}}`, `{"offsetTable":[[{},"x"]]}`, `{"offsetTable":{{}:}}`} {
		_, err := DecodeResetOffsetBody([]byte(bad))
		require.ErrorIs(t, err, ErrMalformedJSON, bad)
	}
}

func TestConsumerRunningInfo(t *testing.T) {
	info := &ConsumerRunningInfo{
		Properties:      map[string]string{"PROP_CONSUME_TYPE": "CONSUME_ACTIVELY", "PROP_CLIENT_VERSION": "flowd"},
		SubscriptionSet: []SubscriptionData{{Topic: "t", SubString: "*", ExpressionType: ExpressionTag, SubVersion: 1}},
		MQTable: map[MessageQueue]ProcessQueueInfo{
			{Topic: "t", BrokerName: "b", QueueID: 1}: {CommitOffset: 10, CachedMsgCount: 2, LastPullTimestamp: 1712345678901},
			{Topic: "t", BrokerName: "b", QueueID: 0}: {CommitOffset: 5, Dropped: true},
		},
		StatusTable: map[string]ConsumeStatus{"t": {PullRT: 1.5, PullTPS: 100}},
		JStack:      "goroutine 1 [running]:\n\tmain.main()",
	}
	b, err := info.Encode()
	require.NoError(t, err)
	got, err := DecodeConsumerRunningInfo(b)
	require.NoError(t, err)
	require.Equal(t, info, got)

	// As rocketmq-client-go's ConsumerRunningInfo.Encode writes it: mqTable with object keys,
	// and a space before "jstack".
	goClient := `{"properties":{"PROP_CLIENT_VERSION":"v2.1.2"},"statusTable":{},"subscriptionSet":[{"classFilterMode":false,` +
		`"topic":"t","subString":"*","tagsSet":[],"codeSet":[],"subVersion":1,"expressionType":"TAG"}],` +
		`"mqTable":{{"topic":"t","brokerName":"b","queueId":0}:{"commitOffset":5,"cachedMsgMinOffset":0,"cachedMsgMaxOffset":0,` +
		`"cachedMsgCount":0,"cachedMsgSizeInMiB":0,"transactionMsgMinOffset":0,"transactionMsgMaxOffset":0,"transactionMsgCount":0,` +
		`"locked":false,"tryUnlockTimes":0,"lastLockTimestamp":0,"dropped":true,"lastPullTimestamp":0,"lastConsumeTimestamp":0}}, "jstack":"" }`
	got, err = DecodeConsumerRunningInfo([]byte(goClient))
	require.NoError(t, err)
	require.Equal(t, ProcessQueueInfo{CommitOffset: 5, Dropped: true}, got.MQTable[MessageQueue{Topic: "t", BrokerName: "b", QueueID: 0}])
	require.Equal(t, "v2.1.2", got.Properties["PROP_CLIENT_VERSION"])

	b, err = (&ConsumerRunningInfo{}).Encode()
	require.NoError(t, err)
	require.JSONEq(t, `{"properties":{},"subscriptionSet":[],"mqTable":{},"statusTable":{},"jstack":""}`, string(b))
}

// TestHeartbeatAllocatorExtension: flowd consumers report their allocator in an extra
// consumer-data field, which is left out when empty (so a heartbeat without it is byte for
// byte what it was), and heartbeats of clients that do not know it decode with it empty.
func TestHeartbeatAllocatorExtension(t *testing.T) {
	hb := &HeartbeatData{ClientID: "c", ConsumerDataSet: []ConsumerData{{GroupName: "g", Allocator: "WASM-sticky@1.0.0+sha256:ab"}}}
	b, err := hb.Encode()
	require.NoError(t, err)
	var raw struct {
		ConsumerDataSet []map[string]any `json:"consumerDataSet"`
	}
	require.NoError(t, json.Unmarshal(b, &raw))
	require.Equal(t, "WASM-sticky@1.0.0+sha256:ab", raw.ConsumerDataSet[0]["flowdAllocator"])
	got, err := DecodeHeartbeatData(b)
	require.NoError(t, err)
	require.Equal(t, hb.ConsumerDataSet[0].Allocator, got.ConsumerDataSet[0].Allocator)

	hb.ConsumerDataSet[0].Allocator = ""
	b, err = hb.Encode()
	require.NoError(t, err)
	require.NotContains(t, string(b), "flowdAllocator", "left out when empty")

	// A rocketmq-client-go heartbeat (no such field) decodes as "not reported".
	goClient := `{"clientID":"10.0.0.7@1#1","producerDataSet":[],"consumerDataSet":[{"groupName":"cg","consumeType":"CONSUME_ACTIVELY",` +
		`"messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","subscriptionDataSet":[],"unitMode":false}]}`
	got, err = DecodeHeartbeatData([]byte(goClient))
	require.NoError(t, err)
	require.Len(t, got.ConsumerDataSet, 1)
	require.Empty(t, got.ConsumerDataSet[0].Allocator)
}

// TestLockOwnersAllocators: the lock-owners answer carries each member's allocator, and an
// answer without them (an older flowd broker) decodes with none.
func TestLockOwnersAllocators(t *testing.T) {
	b, err := MarshalBody(&LockOwnersResponseBody{Owners: map[string][]MessageQueue{}, Allocators: map[string]string{"a": "AVG", "b": ""}})
	require.NoError(t, err)
	var got LockOwnersResponseBody
	require.NoError(t, UnmarshalBody(b, &got))
	require.Equal(t, map[string]string{"a": "AVG", "b": ""}, got.Allocators)
	var old LockOwnersResponseBody
	require.NoError(t, UnmarshalBody([]byte(`{"owners":{}}`), &old))
	require.Nil(t, old.Allocators)
}
