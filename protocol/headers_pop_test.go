package protocol

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestExtraInfoRoundTrip(t *testing.T) {
	e := ExtraInfo{CkQueueOffset: 10, PopTime: 1700000000123, InvisibleTime: 60000, ReviveQid: 0, Retry: "0", BrokerName: "broker-a", QueueID: 3, QueueOffset: 12}
	require.Equal(t, "10 1700000000123 60000 0 0 broker-a 3 12", e.String())
	got, err := ParseExtraInfo(e.String())
	require.NoError(t, err)
	require.Equal(t, e, got)

	seven, err := ParseExtraInfo("10 1700000000123 60000 0 0 broker-a 3")
	require.NoError(t, err)
	require.Equal(t, int64(-1), seven.QueueOffset)

	for _, bad := range []string{"", "1 2 3", "x 1 2 0 0 b 3 4", "1 2 3 0 9 b 3 4", "1 2 3 0 0 b q 4", "1 2 3 0 0 b 3 4 5"} {
		_, err := ParseExtraInfo(bad)
		require.ErrorIs(t, err, ErrBadExtraInfo, bad)
	}
}

func TestOffsetInfos(t *testing.T) {
	s := AppendStartOffsetInfo(nil, 0, 5)
	s = AppendStartOffsetInfo(s, 2, 7)
	require.Equal(t, "0 0 5;0 2 7", string(s))
	m := AppendMsgOffsetInfo(nil, 0, []int64{5, 6})
	m = AppendMsgOffsetInfo(m, 2, []int64{7})
	require.Equal(t, "0 0 5,6;0 2 7", string(m))
}

// The body of BATCH_ACK_MESSAGE as RocketMQ's client writes it: short names, the bit set as
// base64 of java.util.BitSet.toByteArray (little-endian bits).
func TestBatchAckBody(t *testing.T) {
	raw := `{"acks":[{"b":"BQE=","c":"g","it":60000,"pt":1700000000123,"q":1,"r":"0","rq":0,"so":100,"t":"T"}],"brokerName":"broker-a"}`
	var body BatchAckMessageRequestBody
	require.NoError(t, json.Unmarshal([]byte(raw), &body))
	require.Equal(t, "broker-a", body.BrokerName)
	require.Len(t, body.Acks, 1)
	a := body.Acks[0]
	require.Equal(t, "g", a.ConsumerGroup)
	require.Equal(t, int32(1), a.QueueID)
	require.Equal(t, []int64{100, 102, 108}, a.Offsets())

	long := `{"acks":[{"bitSet":"Ag==","consumerGroup":"g","topic":"T","retry":"0","startOffset":4,"queueId":2,"popTime":9,"invisibleTime":8}]}`
	require.NoError(t, json.Unmarshal([]byte(long), &body))
	require.Equal(t, []int64{5}, body.Acks[0].Offsets())
	require.Equal(t, int32(2), body.Acks[0].QueueID)

	var b BatchAck
	b.StartOffset = 100
	for _, o := range []int64{100, 102, 108} {
		b.Set(o)
	}
	out, err := json.Marshal(BatchAckMessageRequestBody{BrokerName: "broker-a", Acks: []BatchAck{b}})
	require.NoError(t, err)
	require.Contains(t, string(out), `"b":"BQE="`)
	require.Contains(t, string(out), `"so":100`)
	require.True(t, json.Valid(out), string(out))
	var back BatchAckMessageRequestBody
	require.NoError(t, json.Unmarshal(out, &back))
	require.Equal(t, []int64{100, 102, 108}, back.Acks[0].Offsets())
	require.Equal(t, "broker-a", back.BrokerName)
}

func TestPopHeadersRoundTrip(t *testing.T) {
	req := PopMessageRequestHeader{ConsumerGroup: "g", Topic: "T", QueueID: -1, MaxMsgNums: 32, InvisibleTime: 60000, PollTime: 1000, BornTime: 5, InitMode: 1, ExpType: "TAG", Exp: "*", Order: true}
	var got PopMessageRequestHeader
	require.NoError(t, got.Decode(req.Encode()))
	require.Equal(t, req, got)
	ack := AckMessageRequestHeader{ConsumerGroup: "g", Topic: "T", QueueID: 1, ExtraInfo: "1 2 3 0 0 b 1 4", Offset: 4}
	var gotAck AckMessageRequestHeader
	require.NoError(t, gotAck.Decode(ack.Encode()))
	require.Equal(t, ack, gotAck)
	var bad PopMessageRequestHeader
	require.Error(t, bad.Decode(map[string]string{"topic": "T"}))
}

func TestBatchAckCount(t *testing.T) {
	var a BatchAck
	a.StartOffset = 10
	for _, o := range []int64{10, 12, 17, 40} {
		a.Set(o)
	}
	require.Equal(t, 4, a.Count())
	require.Equal(t, []int64{10, 12, 17, 40}, a.Offsets())
}
