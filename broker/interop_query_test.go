//go:build !race

package broker_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// TestRocketMQClientMessagesAreFoundByKeyAndID sends with rocketmq-client-go's producer and
// finds the messages again the ways RocketMQ's admin tools do: by key and by unique key
// (QUERY_MESSAGE), and by the offset message id (VIEW_MESSAGE_BY_ID). rocketmq-client-go v2
// has no public query API (its QueryMessageRequestHeader lives in an internal package), so
// the requests carry the fields as that header encodes them, and the responses are read with
// the client's own decoder and message-id parser.
func TestRocketMQClientMessagesAreFoundByKeyAndID(t *testing.T) {
	b := startBroker(t, nil)
	p := newProducer(t, b)
	var sent []*primitive.SendResult
	for i := range 4 {
		m := primitive.NewMessage("rq", []byte(fmt.Sprintf("body-%d", i)))
		m.WithKeys([]string{fmt.Sprintf("order-%d", i%2), "all"})
		m.WithTag("t")
		res, err := p.SendSync(context.Background(), m)
		require.NoError(t, err)
		require.Equal(t, primitive.SendOK, res.Status)
		sent = append(sent, res)
	}
	tr := newTransport(t)
	invoke := func(code protocol.RequestCode, ext map[string]string) *protocol.Command {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := tr.Invoke(ctx, b.Addr(), protocol.NewRequest(code, ext, nil))
		require.NoError(t, err)
		return resp
	}
	queryResp := func(key string, maxNum int, unique bool) *protocol.Command {
		// The fields and formatting of rocketmq-client-go's QueryMessageRequestHeader.Encode.
		ext := map[string]string{
			"topic": "rq", "key": key, "maxNum": fmt.Sprintf("%d", maxNum),
			"beginTimestamp": "0", "endTimestamp": fmt.Sprintf("%d", int64(math.MaxInt64)),
		}
		if unique {
			ext["_UNIQUE_KEY_QUERY"] = "true"
		}
		return invoke(protocol.QueryMessage, ext)
	}
	query := func(key string, maxNum int, unique bool) []*primitive.MessageExt {
		resp := queryResp(key, maxNum, unique)
		require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
		return primitive.DecodeMessage(resp.Body)
	}

	// A message becomes findable once dispatched, just after the send returns.
	require.Eventually(t, func() bool {
		resp := queryResp("all", 32, false)
		return resp.ResponseCode() == protocol.Success && len(primitive.DecodeMessage(resp.Body)) == 4
	}, 5*time.Second, 5*time.Millisecond)

	got := query("order-1", 32, false)
	require.Len(t, got, 2)
	for j, m := range got {
		want := sent[2*j+1]
		assert.Equal(t, fmt.Sprintf("body-%d", 2*j+1), string(m.Body))
		assert.Equal(t, want.MsgID, m.MsgId, "the client's msgId is the message's UNIQ_KEY")
		assert.Equal(t, want.OffsetMsgID, m.OffsetMsgId)
		assert.Equal(t, "order-1 all", m.GetKeys())
		assert.Equal(t, "t", m.GetTags())
	}

	for i, res := range sent {
		// By unique key, as RocketMQ's admin "queryMsgByUniqueKey" does.
		got := query(res.MsgID, 32, true)
		require.Len(t, got, 1)
		assert.Equal(t, fmt.Sprintf("body-%d", i), string(got[0].Body))

		// By offset message id, as "queryMsgById" does.
		id, err := primitive.UnmarshalMsgID([]byte(res.OffsetMsgID))
		require.NoError(t, err)
		resp := invoke(protocol.ViewMessageByID, map[string]string{"offset": fmt.Sprintf("%d", id.Offset)})
		require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
		viewed := primitive.DecodeMessage(resp.Body)
		require.Len(t, viewed, 1)
		assert.Equal(t, res.MsgID, viewed[0].MsgId)
		assert.Equal(t, res.OffsetMsgID, viewed[0].OffsetMsgId)
		assert.True(t, strings.HasSuffix(viewed[0].GetKeys(), "all"))
	}
}
