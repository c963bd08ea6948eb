package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/protocol"
)

// remote sends req through the broker's dispatch as a binary-header client's request goes
// over the wire (the pop codes travel with a JSON header) and returns the decoded answer.
func remote(t *testing.T, b *Broker, code protocol.RequestCode, h protocol.Header, body []byte) *protocol.Command {
	t.Helper()
	req := protocol.NewRequestWith(code, h, body)
	req.Serialize = protocol.RocketMQ
	frame, err := req.AppendFrame(nil)
	require.NoError(t, err)
	in, err := protocol.DecodeFrame(frame[4:])
	require.NoError(t, err)
	require.Equal(t, code, in.RequestCode())
	resp := b.serveBroker(context.Background(), nil, in)
	frame, err = resp.AppendFrame(nil)
	require.NoError(t, err)
	out, err := protocol.DecodeFrame(frame[4:])
	require.NoError(t, err)
	return out
}

func popHeader(group, topic string, n int32) *protocol.PopMessageRequestHeader {
	return &protocol.PopMessageRequestHeader{ConsumerGroup: group, Topic: topic, QueueID: -1, MaxMsgNums: n,
		InvisibleTime: 10_000, BornTime: time.Now().UnixMilli(), ExpType: protocol.ExpressionTag, Exp: "*"}
}

// remotePop pops and returns the messages of the answer, which must be SUCCESS.
func remotePop(t *testing.T, b *Broker, h *protocol.PopMessageRequestHeader) ([]*protocol.MessageExt, protocol.PopMessageResponseHeader) {
	t.Helper()
	resp := remote(t, b, protocol.PopMessage, h, nil)
	var rh protocol.PopMessageResponseHeader
	require.NoError(t, resp.DecodeHeader(&rh))
	if resp.ResponseCode() != protocol.Success {
		require.Equal(t, protocol.PullNotFound, resp.ResponseCode(), resp.Remark)
		return nil, rh
	}
	msgs, err := protocol.DecodeStoredAll(resp.Body)
	require.NoError(t, err)
	return msgs, rh
}

func remoteAck(t *testing.T, b *Broker, group string, m *protocol.MessageExt) *protocol.Command {
	t.Helper()
	return remote(t, b, protocol.AckMessage, &protocol.AckMessageRequestHeader{ConsumerGroup: group, Topic: m.Topic, QueueID: m.QueueID,
		ExtraInfo: m.Properties[protocol.PropertyPopCK], Offset: m.QueueOffset}, nil)
}

func TestRemotingPopAck(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 2, WriteQueueNums: 2, Perm: 6}))
	popSendN(t, b, "T", 0, 3, nil)
	popSendN(t, b, "T", 1, 3, nil)

	msgs, rh := remotePop(t, b, popHeader("G", "T", 32))
	require.Len(t, msgs, 6, "one answer carries the messages of every queue")
	assert.Equal(t, int64(10_000), rh.InvisibleTime)
	assert.NotEmpty(t, rh.StartOffsetInfo)
	offsets, err := parseOffsetInfo(rh.MsgOffsetInfo)
	require.NoError(t, err)
	assert.Len(t, offsets, 2)
	for _, m := range msgs {
		x, err := protocol.ParseExtraInfo(m.Properties[protocol.PropertyPopCK])
		require.NoError(t, err, "every message carries its receipt")
		assert.Equal(t, m.QueueID, x.QueueID)
		assert.Equal(t, m.QueueOffset, x.QueueOffset)
		assert.Equal(t, int64(0), x.CkQueueOffset, "the queue's first offset of the pop")
		assert.Equal(t, "broker-a", x.BrokerName)
		assert.Equal(t, rh.PopTime, x.PopTime, "one pop time for the answer's queues: 4.9 clients build receipts from it")
		assert.Equal(t, int32(0), m.ReconsumeTimes)
		assert.NotEmpty(t, m.Properties[protocol.PropertyFirstPopTime])
	}

	for _, m := range msgs {
		resp := remoteAck(t, b, "G", m)
		require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	}
	// A second ack of the same receipt: the message is done.
	resp := remoteAck(t, b, "G", msgs[0])
	assert.Equal(t, protocol.NoMessage, resp.ResponseCode())
	advance(b, time.Minute)
	again, _ := remotePop(t, b, popHeader("G", "T", 32))
	assert.Empty(t, again, "acknowledged messages never come back")
	st := b.PopStats("G")
	require.Len(t, st, 2)
	assert.Equal(t, uint64(3), st[0].Acked)
	assert.Equal(t, int64(3), st[1].ConsumedOffset)
}

// parseOffsetInfo reads a msgOffsetInfo as RocketMQ's client does: "retry queueId o,o;…".
func parseOffsetInfo(s string) (map[string][]string, error) {
	out := map[string][]string{}
	for _, one := range splitNonEmpty(s, ';') {
		f := splitNonEmpty(one, ' ')
		if len(f) != 3 {
			return nil, &json.UnsupportedValueError{Str: one}
		}
		out[f[0]+"@"+f[1]] = splitNonEmpty(f[2], ',')
	}
	return out, nil
}

func splitNonEmpty(s string, sep byte) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == sep {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	return out
}

func TestRemotingBatchAck(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 2, WriteQueueNums: 2, Perm: 6}))
	popSendN(t, b, "T", 0, 4, nil)
	popSendN(t, b, "T", 1, 4, nil)
	msgs, _ := remotePop(t, b, popHeader("G", "T", 32))
	require.Len(t, msgs, 8)

	// As RocketMQ's client merges receipts: one entry per (retry, queue, ck, pop time).
	acks := map[string]*protocol.BatchAck{}
	var order []string
	for _, m := range msgs {
		if m.QueueOffset == 3 {
			continue // left in flight
		}
		x, err := protocol.ParseExtraInfo(m.Properties[protocol.PropertyPopCK])
		require.NoError(t, err)
		key := x.Retry + "@" + string(rune('0'+x.QueueID)) + "@" + string(rune('0'+x.CkQueueOffset)) + "@" + time.UnixMilli(x.PopTime).String()
		a := acks[key]
		if a == nil {
			a = &protocol.BatchAck{ConsumerGroup: "G", Topic: "T", Retry: x.Retry, StartOffset: x.CkQueueOffset, QueueID: x.QueueID,
				ReviveQueueID: x.ReviveQid, PopTime: x.PopTime, InvisibleTime: x.InvisibleTime}
			acks[key] = a
			order = append(order, key)
		}
		a.Set(x.QueueOffset)
	}
	body := protocol.BatchAckMessageRequestBody{BrokerName: "broker-a"}
	for _, k := range order {
		body.Acks = append(body.Acks, *acks[k])
	}
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	resp := remote(t, b, protocol.BatchAckMessage, nil, raw)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)

	var acked uint64
	for _, st := range b.PopStats("G") {
		acked += st.Acked
		assert.Equal(t, 1, st.InFlight, "offset 3 of each queue")
	}
	assert.Equal(t, uint64(6), acked)

	// The same body again: every receipt names a message already done.
	resp = remote(t, b, protocol.BatchAckMessage, nil, raw)
	assert.Equal(t, protocol.NoMessage, resp.ResponseCode())
	assert.Contains(t, resp.Remark, "6 of 6 messages not acknowledged")

	resp = remote(t, b, protocol.BatchAckMessage, nil, []byte(`{"acks":[]}`))
	assert.Equal(t, protocol.NoMessage, resp.ResponseCode())
	resp = remote(t, b, protocol.BatchAckMessage, nil, []byte(`{"acks":`))
	assert.Equal(t, protocol.MessageIllegal, resp.ResponseCode())
}

func TestRemotingChangeInvisibleAndRedelivery(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	popSendN(t, b, "T", 0, 2, nil)
	msgs, _ := remotePop(t, b, popHeader("G", "T", 32))
	require.Len(t, msgs, 2)
	m := msgs[0]
	old := m.Properties[protocol.PropertyPopCK]

	resp := remote(t, b, protocol.ChangeMessageInvisibleTime, &protocol.ChangeInvisibleTimeRequestHeader{ConsumerGroup: "G", Topic: "T",
		QueueID: 0, ExtraInfo: old, Offset: m.QueueOffset, InvisibleTime: 60_000}, nil)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	var ch protocol.ChangeInvisibleTimeResponseHeader
	require.NoError(t, resp.DecodeHeader(&ch))
	assert.Equal(t, int64(60_000), ch.InvisibleTime)
	x, err := protocol.ParseExtraInfo(old)
	require.NoError(t, err)
	assert.Greater(t, ch.PopTime, x.PopTime, "a new delivery has a later pop time")

	// The old receipt names a superseded delivery.
	resp = remoteAck(t, b, "G", m)
	assert.Equal(t, protocol.NoMessage, resp.ResponseCode())
	assert.Contains(t, resp.Remark, ErrReceiptHandleExpired.Error())

	// Past 10 s the second message comes back with its attempt counted; the first, made
	// invisible for 60 s, does not.
	advance(b, 15*time.Second)
	again, _ := remotePop(t, b, popHeader("G", "T", 32))
	require.Len(t, again, 1)
	assert.Equal(t, int64(1), again[0].QueueOffset)
	assert.Equal(t, int32(1), again[0].ReconsumeTimes)
	resp = remoteAck(t, b, "G", msgs[1])
	assert.Equal(t, protocol.NoMessage, resp.ResponseCode(), "the first delivery's receipt expired")
	resp = remoteAck(t, b, "G", again[0])
	assert.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)

	// The renewed receipt (old one with the answer's pop time and invisibility) acks.
	x.PopTime, x.InvisibleTime, x.ReviveQid = ch.PopTime, ch.InvisibleTime, ch.ReviveQid
	resp = remote(t, b, protocol.AckMessage, &protocol.AckMessageRequestHeader{ConsumerGroup: "G", Topic: "T", QueueID: 0, ExtraInfo: x.String(), Offset: 0}, nil)
	assert.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
}

func TestRemotingPopDeadLetter(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	_, err := b.PutGroup(GroupConfig{Name: "G", ConsumeEnable: true, RetryQueueNums: 1, RetryMaxTimes: 1})
	require.NoError(t, err)
	popSendN(t, b, "T", 0, 1, nil)
	for attempt := int32(0); attempt < 2; attempt++ {
		msgs, _ := remotePop(t, b, popHeader("G", "T", 1))
		require.Len(t, msgs, 1, "delivery %d", attempt+1)
		assert.Equal(t, attempt, msgs[0].ReconsumeTimes)
		advance(b, 15*time.Second)
	}
	msgs, _ := remotePop(t, b, popHeader("G", "T", 1))
	assert.Empty(t, msgs, "after RetryMaxTimes+1 deliveries the message is dead-lettered")
	require.Eventually(t, func() bool { return b.store.MaxOffset(DLQTopicPrefix+"G", 0) == 1 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, uint64(1), b.PopStats("G")[0].DeadLettered)
}

func TestRemotingPopOrder(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	popSendN(t, b, "T", 0, 3, map[string]string{PropertyShardingKey: "k"})
	h := popHeader("G", "T", 32)
	h.Order = true
	msgs, rh := remotePop(t, b, h)
	require.Len(t, msgs, 1, "the next of the message group waits for the first's ack")
	assert.Equal(t, int32(protocol.PopOrderReviveQueue), rh.ReviveQid)
	assert.Equal(t, int64(0), msgs[0].QueueOffset)
	none, _ := remotePop(t, b, h)
	assert.Empty(t, none)
	require.Equal(t, protocol.Success, remoteAck(t, b, "G", msgs[0]).ResponseCode())
	msgs, _ = remotePop(t, b, h)
	require.Len(t, msgs, 1)
	assert.Equal(t, int64(1), msgs[0].QueueOffset)

	// Without a message group an ordered pop keeps the whole queue in order, as RocketMQ's
	// does; an expired one comes again before its successors.
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "U", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	popSendN(t, b, "U", 0, 3, nil)
	u := popHeader("G", "U", 32)
	u.Order = true
	msgs, _ = remotePop(t, b, u)
	require.Len(t, msgs, 1)
	assert.Equal(t, int64(0), msgs[0].QueueOffset)
	advance(b, 15*time.Second)
	msgs, _ = remotePop(t, b, u)
	require.Len(t, msgs, 1)
	assert.Equal(t, int64(0), msgs[0].QueueOffset, "redelivered first")
	assert.Equal(t, int32(1), msgs[0].ReconsumeTimes)
	require.Equal(t, protocol.Success, remoteAck(t, b, "G", msgs[0]).ResponseCode())
	msgs, _ = remotePop(t, b, u)
	require.Len(t, msgs, 1)
	assert.Equal(t, int64(1), msgs[0].QueueOffset)
}

func TestRemotingPopBadInput(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	popSendN(t, b, "T", 0, 1, nil)

	resp := remote(t, b, protocol.PopMessage, popHeader("G", "missing", 32), nil)
	assert.Equal(t, protocol.TopicNotExist, resp.ResponseCode())
	var rh protocol.PopMessageResponseHeader
	assert.Error(t, resp.DecodeHeader(&rh), "a refusal carries no pop header")
	resp = remote(t, b, protocol.PopMessage, popHeader("G", "T", 33), nil)
	assert.Equal(t, protocol.InvalidParameter, resp.ResponseCode())
	h := popHeader("G", "T", 1)
	h.InvisibleTime = 10
	assert.Equal(t, protocol.InvalidParameter, remote(t, b, protocol.PopMessage, h, nil).ResponseCode())
	h = popHeader("G", "T", 1)
	h.ExpType, h.Exp = protocol.ExpressionSQL92, "a >"
	assert.Equal(t, protocol.SubscriptionParseFailed, remote(t, b, protocol.PopMessage, h, nil).ResponseCode())
	h = popHeader("G", "T", 1)
	h.QueueID = 5
	assert.Equal(t, protocol.InvalidParameter, remote(t, b, protocol.PopMessage, h, nil).ResponseCode())
	resp = remote(t, b, protocol.PopMessage, &protocol.AckMessageRequestHeader{}, nil)
	assert.Equal(t, protocol.InvalidParameter, resp.ResponseCode(), "a header without the pop fields")

	msgs, _ := remotePop(t, b, popHeader("G", "T", 1))
	require.Len(t, msgs, 1)
	m := msgs[0]
	ack := func(topic string, qid int32, info string, off int64) *protocol.Command {
		return remote(t, b, protocol.AckMessage, &protocol.AckMessageRequestHeader{ConsumerGroup: "G", Topic: topic, QueueID: qid, ExtraInfo: info, Offset: off}, nil)
	}
	info := m.Properties[protocol.PropertyPopCK]
	assert.Equal(t, protocol.TopicNotExist, ack("missing", 0, info, 0).ResponseCode())
	assert.Equal(t, protocol.MessageIllegal, ack("T", 3, info, 0).ResponseCode(), "a queue the topic has not")
	assert.Equal(t, protocol.MessageIllegal, ack("T", 0, "1 2 x", 0).ResponseCode(), "an extra info that does not parse")
	assert.Equal(t, protocol.MessageIllegal, ack("T", 0, info, 7).ResponseCode(), "an offset the receipt does not name")
	x, _ := protocol.ParseExtraInfo(info)
	x.PopTime++
	assert.Equal(t, protocol.NoMessage, ack("T", 0, x.String(), 0).ResponseCode(), "a pop time never handed out")
	assert.Equal(t, protocol.NoMessage, remote(t, b, protocol.AckMessage, &protocol.AckMessageRequestHeader{ConsumerGroup: "H", Topic: "T", QueueID: 0, ExtraInfo: info}, nil).ResponseCode(), "another group's")
	advance(b, 15*time.Second)
	assert.Equal(t, protocol.NoMessage, ack("T", 0, info, 0).ResponseCode(), "an expired receipt")

	// No message: PULL_NOT_FOUND at once, POLLING_TIMEOUT after a poll, both with the header.
	resp = remote(t, b, protocol.PopMessage, popHeader("G2", "T", 1), nil)
	require.Equal(t, protocol.Success, resp.ResponseCode())
	resp = remote(t, b, protocol.PopMessage, popHeader("G2", "T", 1), nil)
	assert.Equal(t, protocol.PullNotFound, resp.ResponseCode())
	require.NoError(t, resp.DecodeHeader(&rh))
	h = popHeader("G2", "T", 1)
	h.PollTime = 50
	resp = remote(t, b, protocol.PopMessage, h, nil)
	assert.Equal(t, protocol.PollingTimeout, resp.ResponseCode())
	require.NoError(t, resp.DecodeHeader(&rh))
}

// A delivery popped over one protocol is acknowledged over the other: the broker takes an
// extra info where it takes a receipt handle (gRPC's AckMessage calls PopAckBatch), and a
// receipt handle in an ACK_MESSAGE's extraInfo.
func TestRemotingPopInteropWithHandles(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	popSendN(t, b, "T", 0, 2, nil)
	ctx := context.Background()

	msgs, _ := remotePop(t, b, popHeader("G", "T", 1))
	require.Len(t, msgs, 1)
	errs := b.PopAckBatch(ctx, "G", "T", []string{msgs[0].Properties[protocol.PropertyPopCK]})
	require.NoError(t, errs[0])

	got, err := b.Pop(ctx, popReq("G", "T", 1))
	require.NoError(t, err)
	require.Len(t, got, 1)
	resp := remote(t, b, protocol.AckMessage, &protocol.AckMessageRequestHeader{ConsumerGroup: "G", Topic: "T", QueueID: 0, ExtraInfo: got[0].Handle, Offset: got[0].Message.QueueOffset}, nil)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	assert.Equal(t, int64(2), b.PopStats("G")[0].ConsumedOffset)
}

// A remoting receipt survives a kill -9: acknowledged stays done, unacknowledged may still be
// acknowledged with the receipt it was handed out with.
func TestRemotingPopKillKeepsAcks(t *testing.T) {
	dir := t.TempDir()
	b := newPopBroker(t, dir)
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	popSendN(t, b, "T", 0, 4, nil)
	h := popHeader("G", "T", 32)
	h.InvisibleTime = restartInvisible.Milliseconds()
	msgs, _ := remotePop(t, b, h)
	require.Len(t, msgs, 4)
	for _, m := range msgs[:2] {
		require.Equal(t, protocol.Success, remoteAck(t, b, "G", m).ResponseCode())
	}
	b2 := newPopBroker(t, copyDir(t, dir))
	assert.Equal(t, protocol.Success, remoteAck(t, b2, "G", msgs[2]).ResponseCode(), "a receipt handed out before the kill")
	assert.Equal(t, protocol.NoMessage, remoteAck(t, b2, "G", msgs[0]).ResponseCode(), "acknowledged before the kill")
	advance(b2, restartInvisible+time.Second)
	again, _ := remotePop(t, b2, popHeader("G", "T", 32))
	require.Len(t, again, 1)
	assert.Equal(t, int64(3), again[0].QueueOffset)
	assert.Equal(t, int32(1), again[0].ReconsumeTimes)
}

// BenchmarkRemotingPopAck is one POP_MESSAGE of 32 messages of 1 KiB and the
// BATCH_ACK_MESSAGE of them, through the broker's dispatch (no network), per op.
func BenchmarkRemotingPopAck(b *testing.B) {
	br := newPopBroker(b, "")
	require.NoError(b, br.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	body := make([]byte, 1024)
	n := b.N * 32
	for range n {
		_, err := br.Send(context.Background(), protocol.Message{Topic: "T", Body: body, Properties: map[string]string{protocol.PropertyUniqueKey: "7F000001000118B4AAC2000000000000"}}, 0)
		require.NoError(b, err)
	}
	require.Eventually(b, func() bool { return br.store.MaxOffset("T", 0) >= int64(n) }, 30*time.Second, time.Millisecond)
	ctx := context.Background()
	h := popHeader("G", "T", 32)
	b.ReportAllocs()
	b.SetBytes(32 * 1024)
	b.ResetTimer()
	for range b.N {
		resp := br.serveBroker(ctx, nil, protocol.NewRequestWith(protocol.PopMessage, h, nil))
		if resp.ResponseCode() != protocol.Success {
			b.Fatal(resp.Remark)
		}
		var rh protocol.PopMessageResponseHeader
		require.NoError(b, rh.Decode(resp.ExtFields))
		msgs, err := protocol.DecodeStoredAll(resp.Body)
		require.NoError(b, err)
		a := protocol.BatchAck{ConsumerGroup: "G", Topic: "T", Retry: "0", StartOffset: msgs[0].QueueOffset, PopTime: rh.PopTime, InvisibleTime: rh.InvisibleTime}
		for _, m := range msgs {
			a.Set(m.QueueOffset)
		}
		raw, _ := json.Marshal(protocol.BatchAckMessageRequestBody{BrokerName: "broker-a", Acks: []protocol.BatchAck{a}})
		resp = br.serveBroker(ctx, nil, protocol.NewRequest(protocol.BatchAckMessage, nil, raw))
		if resp.ResponseCode() != protocol.Success {
			b.Fatal(resp.Remark)
		}
	}
}

// A pop is served on the read goroutine only when it finds messages at once: never the
// group's first of a queue, never one that would wait (nothing fresh, or only messages
// FIFO order holds back).
func TestRemotingPopInline(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	popSendN(t, b, "T", 0, 3, map[string]string{PropertyShardingKey: "k"})
	h := popHeader("G", "T", 1)
	req := func() *protocol.Command { return protocol.NewRequestWith(protocol.PopMessage, h, nil) }
	assert.False(t, b.inline(req()), "no progress of the group in the queue yet")
	msgs, _ := remotePop(t, b, h)
	require.Len(t, msgs, 1)
	assert.True(t, b.inline(req()), "two fresh messages")
	h.MaxMsgNums = 32
	msgs, _ = remotePop(t, b, h)
	require.Len(t, msgs, 2)
	assert.False(t, b.inline(req()), "nothing fresh, nothing due")
	advance(b, 15*time.Second)
	assert.True(t, b.inline(req()), "three due again")

	h.Order = true
	msgs, _ = remotePop(t, b, h)
	require.Len(t, msgs, 1, "in order: the first of the message group")
	assert.False(t, b.inline(req()), "what is visible waits for its predecessor (FIFO)")
	for _, c := range []protocol.RequestCode{protocol.AckMessage, protocol.BatchAckMessage, protocol.ChangeMessageInvisibleTime} {
		assert.True(t, b.inline(protocol.NewRequest(c, nil, nil)), c.String())
	}
}

// A redelivery carries the first delivery's 1ST_POP_TIME, and its own pop time in its
// receipt, as RocketMQ's revived messages do.
func TestRemotingRedeliveryKeepsTheFirstPopTime(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	popSendN(t, b, "T", 0, 1, nil)
	first, _ := remotePop(t, b, popHeader("G", "T", 32))
	require.Len(t, first, 1)
	firstPop := first[0].Properties[protocol.PropertyFirstPopTime]
	x1, err := protocol.ParseExtraInfo(first[0].Properties[protocol.PropertyPopCK])
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprint(x1.PopTime), firstPop, "a first delivery's 1ST_POP_TIME is its pop time")

	advance(b, time.Minute) // past the 10 s invisibility: it comes back
	again, _ := remotePop(t, b, popHeader("G", "T", 32))
	require.Len(t, again, 1)
	assert.Equal(t, int32(1), again[0].ReconsumeTimes)
	x2, err := protocol.ParseExtraInfo(again[0].Properties[protocol.PropertyPopCK])
	require.NoError(t, err)
	assert.Greater(t, x2.PopTime, x1.PopTime, "the redelivery's receipt names its own pop")
	assert.Equal(t, firstPop, again[0].Properties[protocol.PropertyFirstPopTime], "1ST_POP_TIME stays the first delivery's")
}

// A batch ack naming more offsets than any client sends is refused before its bit sets
// are expanded (one of 16 MiB of set bits would have been 100 million receipts), and
// nothing of it is acknowledged; the broker then takes a good one.
func TestRemotingBatchAckTooLargeIsRefused(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	popSendN(t, b, "T", 0, 2, nil)
	msgs, _ := remotePop(t, b, popHeader("G", "T", 32))
	require.Len(t, msgs, 2)
	x, err := protocol.ParseExtraInfo(msgs[0].Properties[protocol.PropertyPopCK])
	require.NoError(t, err)
	entry := func(bits []byte) protocol.BatchAck {
		return protocol.BatchAck{ConsumerGroup: "G", Topic: "T", Retry: x.Retry, StartOffset: x.CkQueueOffset, QueueID: x.QueueID,
			ReviveQueueID: x.ReviveQid, PopTime: x.PopTime, InvisibleTime: x.InvisibleTime, Bits: bits}
	}
	wide := bytes.Repeat([]byte{0xff}, maxBatchAckSpan/8+1)
	many := make([]protocol.BatchAck, 0, maxBatchAckOffsets/8+1)
	for range maxBatchAckOffsets/8 + 1 {
		many = append(many, entry([]byte{0xff}))
	}
	for name, acks := range map[string][]protocol.BatchAck{
		"an entry reaching too far":   {entry(wide)},
		"too many offsets in entries": many,
	} {
		raw, err := json.Marshal(protocol.BatchAckMessageRequestBody{BrokerName: "broker-a", Acks: acks})
		require.NoError(t, err)
		resp := remote(t, b, protocol.BatchAckMessage, nil, raw)
		assert.Equal(t, protocol.MessageIllegal, resp.ResponseCode(), name)
		assert.Contains(t, resp.Remark, "batch ack", name)
		assert.Equal(t, 2, b.PopStats("G")[0].InFlight, "%s: nothing acknowledged", name)
	}
	ok := entry(nil)
	ok.Set(msgs[0].QueueOffset)
	ok.Set(msgs[1].QueueOffset)
	raw, err := json.Marshal(protocol.BatchAckMessageRequestBody{BrokerName: "broker-a", Acks: []protocol.BatchAck{ok}})
	require.NoError(t, err)
	resp := remote(t, b, protocol.BatchAckMessage, nil, raw)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	assert.Equal(t, 0, b.PopStats("G")[0].InFlight)
}

// switchRole is a Replication whose node is master or replica as the test says.
type switchRole struct{ replica atomic.Bool }

func (r *switchRole) Writable() error {
	if r.replica.Load() {
		return fmt.Errorf("a replica: %w", ErrNotMaster)
	}
	return nil
}
func (r *switchRole) Sync() bool                                   { return false }
func (r *switchRole) Await(_ int64, _ time.Time, done func(error)) { done(nil) }

// A replica hands out nothing and takes no acknowledgement (the pop state is the master's):
// both answer SERVICE_NOT_AVAILABLE, as a refused send does, and what was in flight on the
// node stays so until it is master again.
func TestRemotingPopRefusedOnAReplica(t *testing.T) {
	r := &switchRole{}
	b := newPopBroker(t, "", func(c *Config) { c.Replication = r })
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	popSendN(t, b, "T", 0, 2, nil)
	msgs, _ := remotePop(t, b, popHeader("G", "T", 1))
	require.Len(t, msgs, 1)

	r.replica.Store(true)
	resp := remote(t, b, protocol.PopMessage, popHeader("G", "T", 32), nil)
	assert.Equal(t, protocol.ServiceNotAvailable, resp.ResponseCode(), resp.Remark)
	resp = remoteAck(t, b, "G", msgs[0])
	assert.Equal(t, protocol.ServiceNotAvailable, resp.ResponseCode(), resp.Remark)
	_, err := b.Pop(context.Background(), popReq("G", "T", 32))
	assert.ErrorIs(t, err, ErrNotMaster)
	assert.Equal(t, 1, b.PopStats("G")[0].InFlight)

	r.replica.Store(false)
	resp = remoteAck(t, b, "G", msgs[0])
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	rest, _ := remotePop(t, b, popHeader("G", "T", 32))
	assert.Len(t, rest, 1)
}

// A replica corrects no offset from its own copy (its retention runs on its own clock):
// a pull it would move, or whose consume-queue file it no longer has, is answered
// PULL_RETRY_IMMEDIATELY at the requested offset, so that the consumer asks the master;
// the master answers such pulls as any broker does.
func TestReplicaCorrectsNoOffset(t *testing.T) {
	r := &switchRole{}
	b := newPopBroker(t, "", func(c *Config) { c.Replication = r })
	for _, tc := range []struct {
		status store.GetStatus
		code   protocol.ResponseCode
	}{
		{store.OffsetTooSmall, protocol.PullOffsetMoved},
		{store.OffsetOverflowBadly, protocol.PullOffsetMoved},
		{store.NoMessageInQueue, protocol.PullOffsetMoved},
		{store.OffsetFoundNull, protocol.PullNotFound},
	} {
		for _, replica := range []bool{false, true} {
			r.replica.Store(replica)
			res := &store.GetResult{Status: tc.status, NextBeginOffset: 7}
			code, turned := b.replicaCaughtUp(res, tc.code, 42)
			if replica {
				assert.True(t, turned, "%v on a replica", tc.status)
				assert.Equal(t, protocol.PullRetryImmediately, code, "%v on a replica", tc.status)
				assert.Equal(t, int64(42), res.NextBeginOffset, "%v on a replica: the offset stands", tc.status)
			} else {
				assert.False(t, turned, "%v on the master", tc.status)
				assert.Equal(t, tc.code, code)
				assert.Equal(t, int64(7), res.NextBeginOffset)
			}
		}
	}
}
