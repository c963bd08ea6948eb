package producer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/protocol"
)

// asyncOutcome is what one SendAsync callback got.
type asyncOutcome struct {
	res producer.SendResult
	err error
}

// sendAllAsync sends msgs with SendAsync from one goroutine, in order, and waits for every
// callback.
func sendAllAsync(t *testing.T, p *producer.Producer, msgs []*producer.Message) []asyncOutcome {
	t.Helper()
	out := make([]asyncOutcome, len(msgs))
	var wg sync.WaitGroup
	for i, m := range msgs {
		wg.Add(1)
		p.SendAsync(context.Background(), m, func(res producer.SendResult, err error) {
			out[i] = asyncOutcome{res, err}
			wg.Done()
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(wait):
		t.Fatal("callbacks did not all run")
	}
	return out
}

// Batched asynchronous sends report each message's own ids and offset, keep the order in
// which they were given within each queue, and store every message once.
func TestAsyncBatchingResultsPerMessage(t *testing.T) {
	b := startBroker(t, nil)
	mqs := createTopic(t, b, "batched", 3)
	p := newProducer(t, b, producer.WithAsyncBatching(16, 64<<10, time.Millisecond), producer.WithMaxInFlightAsync(256))

	const n = 300
	msgs := make([]*producer.Message, n)
	for i := range msgs {
		msgs[i] = &producer.Message{Topic: "batched", Body: fmt.Appendf(nil, "m-%03d", i), Tags: "t"}
	}
	out := sendAllAsync(t, p, msgs)

	perQueue := map[int][]int{} // queue id -> indexes of msgs, in send order
	ids := map[string]bool{}
	for i, o := range out {
		require.NoError(t, o.err, "message %d", i)
		assert.Equal(t, producer.SendOK, o.res.Status)
		assert.Len(t, o.res.MsgID, 32)
		assert.False(t, ids[o.res.MsgID], "message id %s given twice", o.res.MsgID)
		ids[o.res.MsgID] = true
		perQueue[o.res.Queue.QueueID] = append(perQueue[o.res.Queue.QueueID], i)
	}
	require.Len(t, perQueue, len(mqs), "the selector spread messages over every queue")
	for _, mq := range mqs {
		idx := perQueue[mq.QueueID]
		stored := rawPull(t, b, mq, 0, len(idx))
		require.Len(t, stored, len(idx))
		for k, i := range idx {
			r := out[i].res
			assert.Equal(t, int64(k), r.QueueOffset, "message %d: offsets follow the send order within queue %d", i, mq.QueueID)
			m := stored[k]
			assert.Equal(t, string(msgs[i].Body), string(m.Body), "queue %d offset %d", mq.QueueID, k)
			_, clOffset, err := protocol.ParseOffsetMsgID(r.OffsetMsgID)
			require.NoError(t, err)
			assert.Equal(t, m.CommitLogOffset, clOffset, "message %d: its offset id names its commit-log offset", i)
			assert.Equal(t, r.MsgID, m.Properties[protocol.PropertyUniqueKey])
		}
	}
}

// With one batch in flight per queue, messages given while a send of their queue is in flight
// leave together, as one batch, once it is answered; a lone message leaves at once, alone.
func TestAsyncBatchingGathersWhileInFlight(t *testing.T) {
	fb := startFakeBroker(t, 1)
	p := newFakeProducer(t, fb, producer.WithAsyncBatching(100, 1<<20, 0), producer.WithAsyncBatchesInFlight(1))
	fb.hold()
	results := make(chan asyncOutcome, 10)
	cb := func(res producer.SendResult, err error) { results <- asyncOutcome{res, err} }
	p.SendAsync(context.Background(), &producer.Message{Topic: "t", Body: []byte("first")}, cb)
	recv := <-fb.entered // the first message is in flight, alone
	assert.Equal(t, int32(0), recv)
	for i := range 9 {
		p.SendAsync(context.Background(), &producer.Message{Topic: "t", Body: fmt.Appendf(nil, "next-%d", i)}, cb)
	}
	fb.open()
	for range 10 {
		select {
		case o := <-results:
			require.NoError(t, o.err)
		case <-time.After(wait):
			t.Fatal("callbacks did not all run")
		}
	}
	assert.Equal(t, []protocol.RequestCode{protocol.SendMessageV2, protocol.SendBatchMessage}, fb.sentCodes(),
		"the nine messages given during the first send left in one batch")
}

// A batch the broker refuses as a whole is sent again one message at a time: each message
// gets its own answer, and only the one the broker refuses alone fails.
func TestAsyncBatchingRefusedBatchAnswersEachMessage(t *testing.T) {
	fb := startFakeBroker(t, 1)
	fb.mu.Lock()
	fb.refuseBatches = true
	fb.mu.Unlock()
	p := newFakeProducer(t, fb, producer.WithAsyncBatching(100, 1<<20, 0), producer.WithAsyncBatchesInFlight(1))
	fb.hold()
	bodies := []string{"first", "a", "refuse", "b", "c"}
	outs := make([]asyncOutcome, len(bodies))
	var wg sync.WaitGroup
	for i, body := range bodies {
		wg.Add(1)
		p.SendAsync(context.Background(), &producer.Message{Topic: "t", Body: []byte(body)}, func(res producer.SendResult, err error) {
			outs[i] = asyncOutcome{res, err}
			wg.Done()
		})
		if i == 0 {
			<-fb.entered // the rest gather behind the first
		}
	}
	fb.open()
	wg.Wait()
	for i, o := range outs {
		if bodies[i] == "refuse" {
			var be *producer.BrokerError
			require.ErrorAs(t, o.err, &be, "message %d", i)
			assert.Equal(t, protocol.MessageIllegal, be.Code)
			continue
		}
		require.NoError(t, o.err, "message %d (%s)", i, bodies[i])
		assert.Equal(t, producer.SendOK, o.res.Status)
	}
	codes := fb.sentCodes()
	require.Len(t, codes, 1+1+4, "the first alone, the refused batch, then its four messages alone")
	assert.Equal(t, protocol.SendBatchMessage, codes[1])
}

func TestWithAsyncBatchingValidates(t *testing.T) {
	for _, o := range []producer.Option{
		producer.WithAsyncBatching(0, 1, 0),
		producer.WithAsyncBatching(2, 0, 0),
		producer.WithAsyncBatching(2, 1, -time.Nanosecond),
		producer.WithAsyncBatching(2, 1, 2*time.Millisecond),
	} {
		_, err := producer.New("g", producer.WithNameServers("127.0.0.1:1"), o)
		require.ErrorIs(t, err, producer.ErrInvalidOption)
	}
}

// Against a broker whose message size limit one message exceeds: the batch holding it is
// refused as a whole, every other message is stored once and answered on its own, and only the
// large one fails.
func TestAsyncBatchingOneMessageOverTheBrokerLimit(t *testing.T) {
	b := startBroker(t, func(cfg *broker.Config) { cfg.MaxMessageSize = 700 })
	createTopic(t, b, "limited", 1)
	p := newProducer(t, b, producer.WithAsyncBatching(16, 1<<20, time.Millisecond))
	const large = 5
	msgs := make([]*producer.Message, 12)
	for i := range msgs {
		body := make([]byte, 100)
		if i == large {
			body = make([]byte, 1000)
		}
		copy(body, fmt.Sprintf("m-%02d", i))
		msgs[i] = &producer.Message{Topic: "limited", Body: body}
	}
	out := sendAllAsync(t, p, msgs)
	offsets := map[int64]bool{}
	for i, o := range out {
		if i == large {
			var be *producer.BrokerError
			require.ErrorAs(t, o.err, &be)
			assert.Equal(t, protocol.MessageIllegal, be.Code)
			continue
		}
		require.NoError(t, o.err, "message %d", i)
		assert.False(t, offsets[o.res.QueueOffset], "offset %d given twice", o.res.QueueOffset)
		offsets[o.res.QueueOffset] = true
	}
	got := readAll(t, b, "limited", len(msgs)-1)
	require.Len(t, got, len(msgs)-1, "each other message stored once")
	byID := map[string]string{}
	for _, m := range got {
		byID[m.MsgID] = string(m.Body[:4])
	}
	for i, o := range out {
		if i != large {
			assert.Equal(t, fmt.Sprintf("m-%02d", i), byID[o.res.MsgID], "message %d's id names its own stored message", i)
		}
	}
}
