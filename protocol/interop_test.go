package protocol

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	jsoniter "github.com/json-iterator/go"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
)

// Cross-checks against github.com/apache/rocketmq-client-go/v2, the interop test client.
// Where the code to check against is exported it is called; where it sits in the module's
// internal packages, the test reproduces its parsing steps (documented at each helper) with the
// same libraries, gjson and jsoniter.

// goHost is how the Go client prints a host: net.IP's String, a colon, the port; IPv6 hosts
// come without brackets.
func goHost(ap netip.AddrPort) string {
	return fmt.Sprintf("%s:%d", ap.Addr().Unmap(), ap.Port())
}

// TestGoClientDecodesOurMessages: every stored message form flowd writes reads back through
// primitive.DecodeMessage, field by field.
func TestGoClientDecodesOurMessages(t *testing.T) {
	cases := storedCases()
	names := make([]string, 0, len(cases))
	var body []byte
	for name, m := range cases {
		var err error
		body, err = AppendStored(body, m)
		require.NoError(t, err)
		names = append(names, name)
	}
	got := primitive.DecodeMessage(body)
	require.Len(t, got, len(names))
	for i, name := range names {
		t.Run(name, func(t *testing.T) {
			m, g := cases[name], got[i]
			wantBody := m.Body
			if m.SysFlag&MsgFlagCompressed != 0 {
				var err error
				wantBody, err = DecompressBody(m.Body, 0)
				require.NoError(t, err)
			}
			require.Equal(t, m.Topic, g.Topic)
			require.Equal(t, string(wantBody), string(g.Body))
			require.Equal(t, m.Flag, g.Flag)
			require.Equal(t, m.QueueID, int32(g.Queue.QueueId))
			require.Equal(t, m.StoreSize, g.StoreSize)
			require.Equal(t, m.QueueOffset, g.QueueOffset)
			require.Equal(t, m.SysFlag, g.SysFlag)
			require.Equal(t, m.BornTimestamp, g.BornTimestamp)
			require.Equal(t, goHost(m.BornHost), g.BornHost)
			require.Equal(t, m.StoreTimestamp, g.StoreTimestamp)
			require.Equal(t, goHost(m.StoreHost), g.StoreHost)
			require.Equal(t, m.CommitLogOffset, g.CommitLogOffset)
			require.Equal(t, int32(m.BodyCRC), g.BodyCRC)
			require.Equal(t, m.ReconsumeTimes, g.ReconsumeTimes)
			require.Equal(t, m.PreparedTransactionOffset, g.PreparedTransactionOffset)
			wantProps := m.Properties
			if wantProps == nil {
				wantProps = map[string]string{}
			}
			require.Equal(t, wantProps, g.GetProperties())
			require.Equal(t, m.Tags(), g.GetTags())
			require.Equal(t, m.Properties[PropertyKeys], g.GetKeys())
			require.Equal(t, OffsetMsgID(m.StoreHost, m.CommitLogOffset), g.OffsetMsgId)
			if id := m.Properties[PropertyUniqueKey]; id != "" {
				require.Equal(t, id, g.MsgId)
			} else {
				require.Equal(t, g.OffsetMsgId, g.MsgId)
			}
		})
	}
}

// TestOffsetMsgIDMatchesGoClient compares with primitive.CreateMessageId and
// primitive.UnmarshalMsgID.
func TestOffsetMsgIDMatchesGoClient(t *testing.T) {
	for _, host := range []string{"10.0.0.1:10911", "255.255.255.255:0", "[2001:db8::1]:65535", "[::1]:1"} {
		ap := netip.MustParseAddrPort(host)
		for _, off := range []int64{0, 1, 1<<40 + 3, -1} {
			id := OffsetMsgID(ap, off)
			a := ap.Addr().AsSlice()
			require.Equal(t, primitive.CreateMessageId(a, int32(ap.Port()), off), id)
			require.Equal(t, "prefix:"+id, string(AppendOffsetMsgID([]byte("prefix:"), ap, off)), "appended after what dst holds")

			mid, err := primitive.UnmarshalMsgID([]byte(id))
			require.NoError(t, err)
			wantAddr := ap.Addr().String()
			if ap.Addr().Is6() {
				wantAddr = "[" + wantAddr + "]"
			}
			require.Equal(t, wantAddr, mid.Addr)
			require.Equal(t, int(ap.Port()), mid.Port)
			require.Equal(t, off, mid.Offset)
		}
	}
}

// TestWeDecodeGoClientBatches: the batch body rocketmq-client-go sends with SEND_BATCH_MESSAGE
// (producer.MarshalMessageBatch, built on the exported (*primitive.Message).Marshal).
func TestWeDecodeGoClientBatches(t *testing.T) {
	var msgs []*primitive.Message
	for i := range 5 {
		m := primitive.NewMessage("TopicTest", []byte(strings.Repeat("x", i*100)))
		m.Flag = int32(i - 2)
		m.WithTag(fmt.Sprintf("Tag%d", i))
		m.WithKeys([]string{"k1", fmt.Sprint(i)})
		m.WithProperty(PropertyUniqueKey, fmt.Sprintf("7F0000010001%04X", i))
		msgs = append(msgs, m)
	}
	body := producer.MarshalMessageBatch(msgs...)
	got, err := DecodeBatch(body)
	require.NoError(t, err)
	require.Len(t, got, len(msgs))
	for i, m := range msgs {
		require.Equal(t, m.Flag, got[i].Flag)
		require.Equal(t, string(m.Body), string(got[i].Body))
		require.Equal(t, m.GetProperties(), got[i].Properties)
	}

	// With one property the Go client's (map-ordered) encoding is deterministic, and ours
	// is byte for byte the same.
	one := primitive.NewMessage("t", []byte("body"))
	one.Flag = 7
	one.WithTag("TagA")
	ours, err := AppendBatchEntry(nil, &Message{Flag: 7, Body: []byte("body"), Properties: map[string]string{PropertyTags: "TagA"}})
	require.NoError(t, err)
	require.Equal(t, one.Marshal(), ours)
}

// goClientParseRoute reproduces rocketmq-client-go's internal TopicRouteData.decode
// (internal/route.go): queueDatas through jsoniter; for each broker, gjson fields, and
// brokerAddrs taken as text, braces dropped, split on ',' and on the first ':', quotes removed.
func goClientParseRoute(body string) (*TopicRouteData, error) {
	res := gjson.Parse(body)
	var qds []struct {
		BrokerName     string `json:"brokerName"`
		ReadQueueNums  int    `json:"readQueueNums"`
		WriteQueueNums int    `json:"writeQueueNums"`
		Perm           int    `json:"perm"`
		TopicSynFlag   int    `json:"topicSynFlag"`
	}
	if err := jsoniter.Unmarshal([]byte(res.Get("queueDatas").String()), &qds); err != nil {
		return nil, err
	}
	r := &TopicRouteData{QueueDatas: []QueueData{}, FilterServerTable: map[string][]string{}}
	for _, q := range qds {
		r.QueueDatas = append(r.QueueDatas, QueueData{BrokerName: q.BrokerName, ReadQueueNums: int32(q.ReadQueueNums), WriteQueueNums: int32(q.WriteQueueNums), Perm: int32(q.Perm)})
	}
	for _, v := range res.Get("brokerDatas").Array() {
		bd := BrokerData{BrokerName: v.Get("brokerName").String(), Cluster: v.Get("cluster").String(), BrokerAddrs: map[int64]string{}}
		addrs := v.Get("brokerAddrs").String()
		if len(addrs) < 2 {
			return nil, fmt.Errorf("brokerAddrs %q would make the Go client slice out of range", addrs)
		}
		for _, s := range strings.Split(addrs[1:len(addrs)-1], ",") {
			i := strings.Index(s, ":")
			if i < 0 {
				continue
			}
			id, _ := strconv.ParseInt(strings.ReplaceAll(s[:i], `"`, ""), 10, 64)
			bd.BrokerAddrs[id] = strings.ReplaceAll(s[i+1:], `"`, "")
		}
		r.BrokerDatas = append(r.BrokerDatas, bd)
	}
	return r, nil
}

func TestGoClientParsesOurRoute(t *testing.T) {
	routes := map[string]*TopicRouteData{
		"two brokers": sampleRoute(),
		"auto-create key": {
			QueueDatas:  []QueueData{{BrokerName: "flowd", ReadQueueNums: 4, WriteQueueNums: 4, Perm: 7}},
			BrokerDatas: []BrokerData{{Cluster: "flowd", BrokerName: "flowd", BrokerAddrs: map[int64]string{MasterID: "10.1.2.3:10911"}}},
		},
		"broker without addresses": {BrokerDatas: []BrokerData{{Cluster: "c", BrokerName: "gone"}}},
	}
	for name, r := range routes {
		t.Run(name, func(t *testing.T) {
			b, err := r.Encode()
			require.NoError(t, err)
			got, err := goClientParseRoute(string(b))
			require.NoError(t, err)
			want, err := DecodeTopicRouteData(b)
			require.NoError(t, err)
			for i := range want.QueueDatas {
				want.QueueDatas[i].TopicSysFlag = 0 // the Go client reads "topicSynFlag"
			}
			require.Equal(t, want.QueueDatas, got.QueueDatas)
			require.Equal(t, want.BrokerDatas, got.BrokerDatas)
		})
	}
}

// goClientParseResetOffsets reproduces rocketmq-client-go's ResetOffsetBody.Decode
// (internal/model.go) for the fastjson form: it picks that form when the body is not valid
// JSON, takes offsetTable's text with gjson, drops "{{" and the last '}', splits entries on
// ",{" and each entry on "}:".
func goClientParseResetOffsets(t *testing.T, body []byte) map[primitive.MessageQueue]int64 {
	require.False(t, gjson.ValidBytes(body), "the Go client must take its fastjson path")
	out := map[primitive.MessageQueue]int64{}
	s := gjson.Get(string(body), "offsetTable").String()
	if len(s) <= 2 {
		return out
	}
	for _, entry := range strings.Split(s[2:len(s)-1], ",{") {
		tuple := strings.Split(entry, "}:")
		require.Len(t, tuple, 2, entry)
		off, err := strconv.Atoi(tuple[1])
		require.NoError(t, err)
		var q primitive.MessageQueue
		require.NoError(t, json.Unmarshal([]byte("{"+tuple[0]+"}"), &q))
		out[q] = int64(off)
	}
	return out
}

func TestGoClientParsesOurResetOffsets(t *testing.T) {
	table := map[MessageQueue]int64{}
	for i := range 6 {
		table[MessageQueue{Topic: "%RETRY%cg", BrokerName: fmt.Sprintf("broker-%c", 'a'+i%2), QueueID: i}] = int64(i) * 1000
	}
	b, err := (&ResetOffsetBody{OffsetTable: table}).Encode()
	require.NoError(t, err)
	got := goClientParseResetOffsets(t, b)
	require.Len(t, got, len(table))
	for q, off := range table {
		require.Equal(t, off, got[primitive.MessageQueue{Topic: q.Topic, BrokerName: q.BrokerName, QueueId: q.QueueID}], q.String())
	}
}

// goRemotingCommand has the JSON shape of rocketmq-client-go's remote.RemotingCommand, which
// that client decodes JSON headers into with jsoniter.
type goRemotingCommand struct {
	Code      int16             `json:"code"`
	Language  string            `json:"language"`
	Version   int16             `json:"version"`
	Opaque    int32             `json:"opaque"`
	Flag      int32             `json:"flag"`
	Remark    string            `json:"remark"`
	ExtFields map[string]string `json:"extFields"`
}

// TestGoClientReadsOurJSONHeaders: the hand-written JSON header encoder's output decodes with
// jsoniter to the same values.
func TestGoClientReadsOurJSONHeaders(t *testing.T) {
	req := typicalPullRequest(JSON)
	resp := NewResponse(req, PullNotFound, "OFFSET_OVERFLOW_ONE \"quoted\" \x01 é")
	(&PullMessageResponseHeader{NextBeginOffset: 5, MinOffset: 0, MaxOffset: 5}).EncodeTo(resp.ExtFields)
	resp.ExtFields["odd"] = "<&>\u2028\t"
	for _, c := range []*Command{req, resp} {
		frame, err := c.AppendFrame(nil)
		require.NoError(t, err)
		var g goRemotingCommand
		require.NoError(t, jsoniter.Unmarshal(frame[8:], &g))
		require.Equal(t, goRemotingCommand{
			Code: int16(c.Code), Language: "GO", Version: c.Version, Opaque: c.Opaque, Flag: c.Flag, Remark: c.Remark, ExtFields: c.ExtFields,
		}, g)
	}
}
