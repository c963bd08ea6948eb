package broker_test

import (
	"context"
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

type pushedReply struct {
	h    protocol.ReplyMessageRequestHeader
	body []byte
}

// requester is a raw client that answers PUSH_REPLY_MESSAGE_TO_CLIENT and hands the pushes
// to a channel.
func requester(t *testing.T, b *testBroker) (*rawClient, chan pushedReply) {
	pushed := make(chan pushedReply, 8)
	c := newRawClient(t, b, remoting.HandlerFunc(func(_ context.Context, _ *remoting.Conn, req *protocol.Command) *protocol.Command {
		if req.RequestCode() != protocol.PushReplyMessageToClient {
			return nil
		}
		var h protocol.ReplyMessageRequestHeader
		if err := req.DecodeHeader(&h); err != nil {
			return protocol.NewResponse(req, protocol.InvalidParameter, err.Error())
		}
		pushed <- pushedReply{h: h, body: req.Body}
		return protocol.NewResponse(req, protocol.Success, "")
	}))
	return c, pushed
}

func sendProps(c *rawClient, code protocol.RequestCode, topic string, props map[string]string, body string) *protocol.Command {
	h := &protocol.SendMessageRequestHeader{
		ProducerGroup: "rr", Topic: topic, DefaultTopic: protocol.AutoCreateTopicKey, DefaultTopicQueueNums: 4,
		QueueID: -1, BornTimestamp: time.Now().UnixMilli(), Properties: protocol.EncodeProperties(props),
	}
	ext := h.Encode()
	if code == protocol.SendReplyMessageV2 {
		ext = h.EncodeV2()
	}
	resp, err := c.cl.Invoke(context.Background(), c.b.Addr(), protocol.NewRequest(code, ext, []byte(body)))
	require.NoError(c.t, err)
	return resp
}

func TestEveryStoredMessageCarriesTheClusterName(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) { c.Cluster = "blue" })
	c := newRawClient(t, b, nil)
	rh := c.send("stamped", "x", "")
	m, err := b.MessageByID(rh.MsgID)
	require.NoError(t, err)
	assert.Equal(t, "blue", m.Properties[protocol.PropertyCluster])

	batch, err := protocol.EncodeBatch([]*protocol.Message{{Topic: "stamped", Body: []byte("1")}, {Topic: "stamped", Body: []byte("2"), Properties: map[string]string{"k": "v"}}})
	require.NoError(t, err)
	h := &protocol.SendMessageRequestHeader{ProducerGroup: "rr", Topic: "stamped", QueueID: 0, BornTimestamp: time.Now().UnixMilli(), Batch: true}
	resp, err := c.cl.Invoke(context.Background(), b.Addr(), protocol.NewRequest(protocol.SendBatchMessage, h.EncodeV2(), batch))
	require.NoError(t, err)
	requireCode(t, protocol.Success, resp)
	var sh protocol.SendMessageResponseHeader
	require.NoError(t, resp.DecodeHeader(&sh))
	for _, id := range strings.Split(sh.MsgID, ",") {
		m, err := b.MessageByID(id)
		require.NoError(t, err)
		assert.Equal(t, "blue", m.Properties[protocol.PropertyCluster], "batched message %s", id)
	}
}

func TestReplyIsStoredInTheReplyTopicAndPushedToTheRequester(t *testing.T) {
	for _, code := range []protocol.RequestCode{protocol.SendReplyMessage, protocol.SendReplyMessageV2} {
		t.Run(code.String(), func(t *testing.T) {
			b := startBroker(t, func(c *broker.Config) { c.Cluster = "rrc" })
			req, pushed := requester(t, b)
			// The request registers the requester's connection: no heartbeat needed.
			resp := sendProps(req, protocol.SendMessage, "service", map[string]string{
				protocol.PropertyReplyToClient: "requester-1", protocol.PropertyCorrelationID: "corr-1", protocol.PropertyMessageTTL: "3000",
			}, "question")
			requireCode(t, protocol.Success, resp)

			responder := newRawClient(t, b, nil)
			replyTopic := protocol.ReplyTopic("rrc")
			resp = sendProps(responder, code, replyTopic, map[string]string{
				protocol.PropertyReplyToClient: "requester-1", protocol.PropertyCorrelationID: "corr-1",
				protocol.PropertyMessageType: protocol.ReplyMessageType, protocol.PropertyMessageTTL: "3000",
			}, "answer")
			requireCode(t, protocol.Success, resp)
			var sh protocol.SendMessageResponseHeader
			require.NoError(t, resp.DecodeHeader(&sh))

			select {
			case p := <-pushed:
				assert.Equal(t, "answer", string(p.body))
				assert.Equal(t, replyTopic, p.h.Topic)
				assert.Equal(t, "rr", p.h.ProducerGroup)
				assert.NotZero(t, p.h.StoreTimestamp)
				assert.NotEmpty(t, p.h.StoreHost)
				props, err := protocol.DecodeProperties([]byte(p.h.Properties))
				require.NoError(t, err)
				assert.Equal(t, "corr-1", props[protocol.PropertyCorrelationID])
				assert.Equal(t, "rrc", props[protocol.PropertyCluster])
			case <-time.After(5 * time.Second):
				t.Fatal("the reply was not pushed")
			}
			m, err := b.MessageByID(sh.MsgID)
			require.NoError(t, err, "the reply is stored")
			assert.Equal(t, replyTopic, m.Topic)
			assert.Equal(t, "answer", string(m.Body))
		})
	}
}

func TestReplyFindsARequesterByItsHeartbeat(t *testing.T) {
	b := startBroker(t, nil)
	req, pushed := requester(t, b)
	hb := protocol.HeartbeatData{ClientID: "hb-requester", ProducerDataSet: []protocol.ProducerData{{GroupName: "req-group"}}}
	body, err := hb.Encode()
	require.NoError(t, err)
	requireCode(t, protocol.Success, req.invoke(context.Background(), protocol.HeartBeat, nil, body))

	responder := newRawClient(t, b, nil)
	resp := sendProps(responder, protocol.SendReplyMessage, protocol.ReplyTopic(b.Status().Cluster), map[string]string{
		protocol.PropertyReplyToClient: "hb-requester", protocol.PropertyCorrelationID: "c2",
	}, "answer")
	requireCode(t, protocol.Success, resp)
	select {
	case p := <-pushed:
		assert.Equal(t, "answer", string(p.body))
	case <-time.After(5 * time.Second):
		t.Fatal("the reply was not pushed")
	}
}

func TestReplyToAnAbsentRequesterIsStoredButAnsweredWithAnError(t *testing.T) {
	b := startBroker(t, nil)
	responder := newRawClient(t, b, nil)
	replyTopic := protocol.ReplyTopic(b.Status().Cluster)

	resp := sendProps(responder, protocol.SendReplyMessage, replyTopic, map[string]string{
		protocol.PropertyReplyToClient: "gone", protocol.PropertyCorrelationID: "c3",
	}, "answer")
	requireCode(t, protocol.SystemError, resp)
	assert.Contains(t, resp.Remark, "gone")
	assert.Contains(t, resp.Remark, broker.ErrRequesterGone.Error())
	waitQueued(t, b, replyTopic, 0, 1) // the reply is stored all the same

	resp = sendProps(responder, protocol.SendReplyMessage, replyTopic, map[string]string{protocol.PropertyCorrelationID: "c4"}, "answer")
	requireCode(t, protocol.SystemError, resp)
	assert.Contains(t, resp.Remark, protocol.PropertyReplyToClient)

	resp = sendProps(responder, protocol.SendReplyMessage, "no-such-topic", map[string]string{protocol.PropertyReplyToClient: "x"}, "answer")
	requireCode(t, protocol.TopicNotExist, resp)
	requireCode(t, protocol.InvalidParameter, responder.invoke(context.Background(), protocol.SendReplyMessage, nil, []byte("x")))
	requireCode(t, protocol.InvalidParameter, responder.invoke(context.Background(), protocol.SendReplyMessageV2, nil, []byte("x")))
}

// The broker stores a producer's properties as they came, in the producer's order, with
// CLUSTER appended; a CLUSTER the producer set is replaced, and a block without its trailing
// separator still reads back whole.
func TestStoredPropertiesKeepTheProducersBlockWithClusterAppended(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) { c.Cluster = "blue" })
	c := newRawClient(t, b, nil)
	c.createTopic("asis", 1)
	send := func(props string) {
		h := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: "asis", QueueID: 0, BornTimestamp: time.Now().UnixMilli(), Properties: props}
		requireCode(t, protocol.Success, c.invoke(context.Background(), protocol.SendMessage, h, []byte("x")))
	}
	send("zeta\x01z\x02alpha\x01a\x02")
	send("zeta\x01z\x02CLUSTER\x01red\x02alpha\x01a")
	send("")
	batch, err := protocol.EncodeBatch([]*protocol.Message{{Body: []byte("1"), Properties: map[string]string{"a": "1", "z": "2"}}, {Body: []byte("2")}})
	require.NoError(t, err)
	bh := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: "asis", QueueID: 0, BornTimestamp: time.Now().UnixMilli(), Batch: true}
	resp, err := c.cl.Invoke(context.Background(), b.Addr(), protocol.NewRequest(protocol.SendBatchMessage, bh.EncodeV2(), batch))
	require.NoError(t, err)
	requireCode(t, protocol.Success, resp)
	require.Eventually(t, func() bool { return b.StoreMax("asis", 0) == 5 }, 5*time.Second, 5*time.Millisecond)

	h := pullHeader("asis", 0, 0, "*")
	resp = c.invoke(context.Background(), protocol.PullMessage, h, nil)
	requireCode(t, protocol.Success, resp)
	var blocks []string
	for b := resp.Body; len(b) > 0; {
		n := int(binary.BigEndian.Uint32(b))
		props, err := store.StoredProperties(b[:n])
		require.NoError(t, err)
		blocks = append(blocks, string(props))
		b = b[n:]
	}
	assert.Equal(t, []string{
		"zeta\x01z\x02alpha\x01a\x02CLUSTER\x01blue\x02",
		"zeta\x01z\x02alpha\x01a\x02CLUSTER\x01blue\x02",
		"CLUSTER\x01blue\x02",
		"a\x011\x02z\x012\x02CLUSTER\x01blue\x02",
		"CLUSTER\x01blue\x02",
	}, blocks)
}

// A properties block with a pair that has no name/value separator is refused, as before.
func TestSendWithAMalformedPropertyIsRefused(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.createTopic("bad", 1)
	h := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: "bad", QueueID: 0, BornTimestamp: time.Now().UnixMilli(), Properties: "a\x01b\x02broken\x02"}
	resp := c.invoke(context.Background(), protocol.SendMessage, h, []byte("x"))
	requireCode(t, protocol.MessageIllegal, resp)
	assert.Contains(t, resp.Remark, "broken")
}

// A send in the binary (ROCKETMQ) header encoding is answered in it, single and batched, with
// the answer's fields readable.
func TestBinarySendIsAnsweredInBinary(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.createTopic("bin", 1)
	bin := remoting.NewClient(remoting.ClientOptions{Serialize: protocol.RocketMQ})
	t.Cleanup(func() { bin.Close() })
	single := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: "bin", QueueID: 0, BornTimestamp: time.Now().UnixMilli(), Properties: "k\x01v\x02"}
	batchBody, err := protocol.EncodeBatch([]*protocol.Message{{Body: []byte("1")}, {Body: []byte("2")}})
	require.NoError(t, err)
	batch := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: "bin", QueueID: 0, BornTimestamp: time.Now().UnixMilli(), Batch: true}
	for i, req := range []*protocol.Command{
		protocol.NewRequest(protocol.SendMessage, single.Encode(), []byte("x")),
		protocol.NewRequest(protocol.SendMessageV2, single.EncodeV2(), []byte("y")),
		protocol.NewRequest(protocol.SendBatchMessage, batch.EncodeV2(), batchBody),
	} {
		resp, err := bin.Invoke(context.Background(), b.Addr(), req)
		require.NoError(t, err)
		requireCode(t, protocol.Success, resp)
		assert.Equal(t, protocol.RocketMQ, resp.Serialize, "request %d", i)
		var rh protocol.SendMessageResponseHeader
		require.NoError(t, resp.DecodeHeader(&rh))
		assert.Equal(t, []int64{0, 1, 2}[i], rh.QueueOffset)
		assert.NotEmpty(t, rh.MsgID)
	}
}
