package broker_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// rawClient talks to the broker with flowd's own transport, one request at a time.
type rawClient struct {
	t  *testing.T
	cl *remoting.Client
	b  *testBroker
}

func newRawClient(t *testing.T, b *testBroker, h remoting.Handler) *rawClient {
	cl := remoting.NewClient(remoting.ClientOptions{Handler: h})
	t.Cleanup(func() { cl.Close() })
	return &rawClient{t: t, cl: cl, b: b}
}

func newTransport(tb testing.TB) *remoting.Client {
	cl := remoting.NewClient(remoting.ClientOptions{})
	tb.Cleanup(func() { cl.Close() })
	return cl
}

func (c *rawClient) invoke(ctx context.Context, code protocol.RequestCode, h protocol.Header, body []byte) *protocol.Command {
	c.t.Helper()
	resp, err := c.cl.Invoke(ctx, c.b.Addr(), protocol.NewRequestWith(code, h, body))
	require.NoError(c.t, err)
	return resp
}

func (c *rawClient) send(topic, body, tags string) *protocol.SendMessageResponseHeader {
	c.t.Helper()
	props := map[string]string{}
	if tags != "" {
		props[protocol.PropertyTags] = tags
	}
	h := &protocol.SendMessageRequestHeader{
		ProducerGroup: "raw", Topic: topic, DefaultTopic: protocol.AutoCreateTopicKey, DefaultTopicQueueNums: 4,
		QueueID: 0, BornTimestamp: time.Now().UnixMilli(), Properties: protocol.EncodeProperties(props),
	}
	resp := c.invoke(context.Background(), protocol.SendMessage, h, []byte(body))
	require.Equal(c.t, protocol.Success, resp.ResponseCode(), resp.Remark)
	var rh protocol.SendMessageResponseHeader
	require.NoError(c.t, resp.DecodeHeader(&rh))
	return &rh
}

func pullHeader(topic string, offset int64, suspend time.Duration, expr string) *protocol.PullMessageRequestHeader {
	h := &protocol.PullMessageRequestHeader{
		ConsumerGroup: "raw-group", Topic: topic, QueueID: 0, QueueOffset: offset, MaxMsgNums: 32,
		SysFlag: protocol.PullFlagSubscription, Subscription: expr, ExpressionType: "TAG",
	}
	if suspend > 0 {
		h.SysFlag |= protocol.PullFlagSuspend
		h.SuspendTimeoutMillis = suspend.Milliseconds()
	}
	return h
}

func TestLongPollAnswersWhenAMatchingMessageArrives(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.send("lp", "first", "x")
	require.Eventually(t, func() bool { return b.StoreMax("lp", 0) == 1 }, 5*time.Second, 5*time.Millisecond)

	// Suspended for 20 s, but the client gives up after 10 s: an answer within that can only
	// come from the arrival, not from the suspend timing out.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type result struct {
		resp *protocol.Command
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := c.cl.Invoke(ctx, b.Addr(), protocol.NewRequestWith(protocol.PullMessage, pullHeader("lp", 1, 20*time.Second, "want"), nil))
		done <- result{resp, err}
	}()
	require.Eventually(t, func() bool { return b.WaitingPulls() == 1 }, 5*time.Second, time.Millisecond, "the pull parks")
	c.send("lp", "not this one", "other") // filtered out by tag: must not wake the pull
	select {
	case r := <-done:
		t.Fatalf("pull answered before a matching message arrived: %v %v", r.resp, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	c.send("lp", "wanted", "want")
	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, protocol.Success, r.resp.ResponseCode(), r.resp.Remark)
	msgs, err := protocol.DecodeStoredAll(r.resp.Body)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	assert.Equal(t, "wanted", string(msgs[0].Body))
	var rh protocol.PullMessageResponseHeader
	require.NoError(t, r.resp.DecodeHeader(&rh))
	assert.Equal(t, int64(3), rh.NextBeginOffset)
}

func TestLongPollTimesOutWithNotFound(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.send("lp", "first", "")
	require.Eventually(t, func() bool { return b.StoreMax("lp", 0) == 1 }, 5*time.Second, 5*time.Millisecond)
	start := time.Now()
	resp := c.invoke(context.Background(), protocol.PullMessage, pullHeader("lp", 1, 300*time.Millisecond, "*"), nil)
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	assert.Equal(t, protocol.PullNotFound, resp.ResponseCode())
	assert.Equal(t, "OFFSET_OVERFLOW_ONE", resp.Remark)
}

func TestPullStatusesMapToResponseCodes(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	for i := range 3 {
		c.send("st", "m"+string(rune('0'+i)), "")
	}
	require.Eventually(t, func() bool { return b.StoreMax("st", 0) == 3 }, 5*time.Second, 5*time.Millisecond)
	for _, tc := range []struct {
		name   string
		topic  string
		queue  int32
		offset int64
		code   protocol.ResponseCode
		next   int64
	}{
		{"found", "st", 0, 0, protocol.Success, 3},
		{"caught up", "st", 0, 3, protocol.PullNotFound, 3},
		{"overflow badly", "st", 0, 9, protocol.PullOffsetMoved, 0}, // min is 0: re-deliver, never skip
		{"empty queue at 0", "st", 1, 0, protocol.PullNotFound, 0},
		{"empty queue past 0", "st", 1, 5, protocol.PullOffsetMoved, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := pullHeader(tc.topic, tc.offset, 0, "*")
			h.QueueID = tc.queue
			resp := c.invoke(context.Background(), protocol.PullMessage, h, nil)
			assert.Equal(t, tc.code, resp.ResponseCode(), resp.Remark)
			var rh protocol.PullMessageResponseHeader
			require.NoError(t, resp.DecodeHeader(&rh))
			assert.Equal(t, tc.next, rh.NextBeginOffset)
		})
	}
}

func TestBadRequestsGetClearErrorsAndTheBrokerKeepsServing(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) { c.MaxMessageSize = 1024 })
	c := newRawClient(t, b, nil)
	kept := c.send("safe", "kept", "")
	ctx := context.Background()

	t.Run("missing required field", func(t *testing.T) {
		req := protocol.NewRequest(protocol.PullMessage, map[string]string{"consumerGroup": "g", "topic": "safe"}, nil)
		resp, err := c.cl.Invoke(ctx, b.Addr(), req)
		require.NoError(t, err)
		assert.Equal(t, protocol.InvalidParameter, resp.ResponseCode())
		assert.Contains(t, resp.Remark, "queueId")
	})
	t.Run("malformed number", func(t *testing.T) {
		h := pullHeader("safe", 0, 0, "*")
		ext := map[string]string{}
		h.EncodeTo(ext)
		ext["queueOffset"] = "twelve"
		resp, err := c.cl.Invoke(ctx, b.Addr(), protocol.NewRequest(protocol.PullMessage, ext, nil))
		require.NoError(t, err)
		assert.Equal(t, protocol.InvalidParameter, resp.ResponseCode())
		assert.Contains(t, resp.Remark, "queueOffset")
	})
	t.Run("oversize message", func(t *testing.T) {
		h := &protocol.SendMessageRequestHeader{ProducerGroup: "p", Topic: "safe", DefaultTopic: protocol.AutoCreateTopicKey, DefaultTopicQueueNums: 4, BornTimestamp: 1}
		resp := c.invoke(ctx, protocol.SendMessage, h, make([]byte, 2048))
		assert.Equal(t, protocol.MessageIllegal, resp.ResponseCode())
		assert.Contains(t, resp.Remark, "2048")
	})
	t.Run("bad topic name", func(t *testing.T) {
		h := &protocol.SendMessageRequestHeader{ProducerGroup: "p", Topic: "bad topic!", DefaultTopic: protocol.AutoCreateTopicKey, DefaultTopicQueueNums: 4, BornTimestamp: 1}
		resp := c.invoke(ctx, protocol.SendMessage, h, []byte("x"))
		assert.Equal(t, protocol.MessageIllegal, resp.ResponseCode())
		assert.Contains(t, resp.Remark, "bad topic!")
	})
	t.Run("bad queue id", func(t *testing.T) {
		h := &protocol.SendMessageRequestHeader{ProducerGroup: "p", Topic: "safe", DefaultTopic: protocol.AutoCreateTopicKey, DefaultTopicQueueNums: 4, QueueID: 99, BornTimestamp: 1}
		resp := c.invoke(ctx, protocol.SendMessage, h, []byte("x"))
		assert.Equal(t, protocol.InvalidParameter, resp.ResponseCode())
		assert.Contains(t, resp.Remark, "99")
	})
	t.Run("unknown topic pull", func(t *testing.T) {
		resp := c.invoke(ctx, protocol.PullMessage, pullHeader("nope", 0, 0, "*"), nil)
		assert.Equal(t, protocol.TopicNotExist, resp.ResponseCode())
	})
	t.Run("unknown code", func(t *testing.T) {
		resp := c.invoke(ctx, protocol.RequestCode(9999), nil, nil)
		assert.Equal(t, protocol.RequestCodeNotSupported, resp.ResponseCode())
	})
	t.Run("invalid heartbeat JSON", func(t *testing.T) {
		resp := c.invoke(ctx, protocol.HeartBeat, nil, []byte("{not json"))
		assert.Equal(t, protocol.InvalidParameter, resp.ResponseCode())
	})

	// Broken frames close that connection alone. (A whole frame with an unreadable header does
	// not close it: see TestMalformedHeadersAreAnsweredAndTheConnectionKept.)
	for name, frame := range map[string][]byte{
		"garbage":               []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		"oversize length":       binary.BigEndian.AppendUint32(nil, 64<<20),
		"header past frame":     append(binary.BigEndian.AppendUint32(nil, 8), 0, 0, 0x10, 0, 0, 0, 0, 0),
		"negative frame length": binary.BigEndian.AppendUint32(nil, 0xFFFFFFF0),
	} {
		t.Run(name, func(t *testing.T) {
			nc, err := net.Dial("tcp", b.Addr())
			require.NoError(t, err)
			defer nc.Close()
			_, err = nc.Write(frame)
			require.NoError(t, err)
			nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = bufio.NewReader(nc).ReadByte()
			require.Error(t, err, "the broker closes a connection that sent a broken frame")
			assert.False(t, strings.Contains(err.Error(), "timeout"), "closed, not left hanging: %v", err)
		})
	}

	// Everyone else is still served, and what was stored is intact.
	require.Eventually(t, func() bool { return b.StoreMax("safe", 0) >= 1 }, 5*time.Second, 5*time.Millisecond)
	resp := c.invoke(ctx, protocol.PullMessage, pullHeader("safe", kept.QueueOffset, 0, "*"), nil)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	msgs, err := protocol.DecodeStoredAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, "kept", string(msgs[0].Body))
}

func TestMembershipChangesNotifyMembersAndEmitEvents(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) { c.ClientExpiry = 600 * time.Millisecond })
	var mu sync.Mutex
	var events []broker.Event
	b.Subscribe(func(e broker.Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	})
	notified := make(chan string, 16)
	handler := remoting.HandlerFunc(func(ctx context.Context, conn *remoting.Conn, req *protocol.Command) *protocol.Command {
		if req.RequestCode() == protocol.NotifyConsumerIDsChanged {
			notified <- req.ExtFields["consumerGroup"]
		}
		return nil
	})
	c1 := newRawClient(t, b, handler)
	c2 := newRawClient(t, b, nil)
	heartbeat := func(c *rawClient, id string) {
		hb := protocol.HeartbeatData{ClientID: id, ConsumerDataSet: []protocol.ConsumerData{{
			GroupName: "members", ConsumeType: protocol.ConsumeActively, MessageModel: protocol.Clustering,
			ConsumeFromWhere:    protocol.ConsumeFromFirstOffset,
			SubscriptionDataSet: []protocol.SubscriptionData{{Topic: "t", SubString: "*", ExpressionType: "TAG"}},
		}}}
		body, err := hb.Encode()
		require.NoError(t, err)
		resp := c.invoke(context.Background(), protocol.HeartBeat, nil, body)
		require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	}
	heartbeat(c1, "client-1")
	assert.Equal(t, "members", <-notified, "a member is told about its own join")
	heartbeat(c2, "client-2")
	assert.Equal(t, "members", <-notified, "an existing member is told at once when another joins")
	assert.Equal(t, []string{"client-1", "client-2"}, b.GroupMembers("members"))

	// client-2 goes silent: it expires; client-1 keeps heartbeating and is told.
	deadline := time.Now().Add(5 * time.Second)
	for len(b.GroupMembers("members")) != 1 && time.Now().Before(deadline) {
		heartbeat(c1, "client-1")
		time.Sleep(100 * time.Millisecond)
	}
	assert.Equal(t, []string{"client-1"}, b.GroupMembers("members"))
	select {
	case <-notified:
	case <-time.After(5 * time.Second):
		t.Fatal("client-1 was not notified when client-2 expired")
	}

	// Closing the connection removes the member at once.
	c1.cl.Close()
	require.Eventually(t, func() bool { return len(b.GroupMembers("members")) == 0 }, 5*time.Second, 10*time.Millisecond)

	// Events reach subscribers on their own goroutine: wait for the last one.
	want := []string{
		"member.joined:client-1:", "member.joined:client-2:",
		"member.left:client-2:expired", "member.left:client-1:connection closed",
	}
	kinds := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for _, e := range events {
			if e.Group == "members" && (e.Type == broker.MemberJoined || e.Type == broker.MemberLeft) {
				out = append(out, e.Type.String()+":"+e.ClientID+":"+e.Reason)
			}
		}
		return out
	}
	require.Eventually(t, func() bool { return len(kinds()) >= len(want) }, 5*time.Second, time.Millisecond)
	assert.Equal(t, want, kinds())
}

func TestSendBackRetriesThenDeadLetters(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	ctx := context.Background()
	sent := c.send("work", "payload", "")
	_, phys, err := protocol.ParseOffsetMsgID(sent.MsgID)
	require.NoError(t, err)

	sendBack := func(offset int64) {
		t.Helper()
		h := &protocol.ConsumerSendMsgBackRequestHeader{Offset: offset, Group: "workers", DelayLevel: 1, MaxReconsumeTimes: 1}
		resp := c.invoke(ctx, protocol.ConsumerSendMsgBack, h, nil)
		require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	}
	pullOne := func(topic string) *protocol.MessageExt {
		t.Helper()
		var msgs []*protocol.MessageExt
		require.Eventually(t, func() bool {
			h := pullHeader(topic, 0, 0, "*")
			resp, err := c.cl.Invoke(ctx, b.Addr(), protocol.NewRequestWith(protocol.PullMessage, h, nil))
			if err != nil || resp.ResponseCode() != protocol.Success {
				return false
			}
			msgs, err = protocol.DecodeStoredAll(resp.Body)
			return err == nil && len(msgs) > 0
		}, 10*time.Second, 20*time.Millisecond, "a message arrives in %s", topic)
		require.Len(t, msgs, 1)
		return msgs[0]
	}

	sendBack(phys)
	retry := pullOne("%RETRY%workers")
	assert.Equal(t, "payload", string(retry.Body))
	assert.Equal(t, int32(1), retry.ReconsumeTimes)
	assert.Equal(t, "work", retry.Properties[protocol.PropertyRetryTopic])

	sendBack(retry.CommitLogOffset) // the maximum (1) is reached: dead letter
	dead := pullOne("%DLQ%workers")
	assert.Equal(t, "payload", string(dead.Body))
	assert.Equal(t, int32(2), dead.ReconsumeTimes)
	assert.Equal(t, "work", dead.Properties[protocol.PropertyRetryTopic])
	assert.NotEmpty(t, dead.Properties[protocol.PropertyOriginMsgID])
}

func TestANewerPullSupersedesTheParkedOneOfTheSameConsumer(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.send("sup", "first", "")
	require.Eventually(t, func() bool { return b.StoreMax("sup", 0) == 1 }, 5*time.Second, 5*time.Millisecond)

	// The first pull parks for 20 s; the client "gives up" on it and pulls the same queue
	// again. The old one must answer at once instead of holding a request slot.
	first := make(chan *protocol.Command, 1)
	go func() {
		resp, err := c.cl.Invoke(context.Background(), b.Addr(), protocol.NewRequestWith(protocol.PullMessage, pullHeader("sup", 1, 20*time.Second, "*"), nil))
		assert.NoError(t, err)
		first <- resp
	}()
	require.Eventually(t, func() bool { return b.WaitingPulls() == 1 }, 5*time.Second, time.Millisecond, "the first pull parks")
	second := make(chan *protocol.Command, 1)
	go func() {
		resp, err := c.cl.Invoke(context.Background(), b.Addr(), protocol.NewRequestWith(protocol.PullMessage, pullHeader("sup", 1, 20*time.Second, "*"), nil))
		assert.NoError(t, err)
		second <- resp
	}()
	select {
	case resp := <-first:
		assert.Equal(t, protocol.PullNotFound, resp.ResponseCode())
	case <-time.After(10 * time.Second):
		t.Fatal("the superseded pull stayed parked")
	}
	// The newer one is still parked and answers when a message comes.
	c.send("sup", "second", "")
	select {
	case resp := <-second:
		assert.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	case <-time.After(10 * time.Second):
		t.Fatal("the newer pull was not woken")
	}
}
