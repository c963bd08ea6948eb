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
	"github.com/flowd-io/flowd/client"
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
		producer.WithAsyncBatchesInFlight(0),
	} {
		_, err := producer.New("g", producer.WithClientOptions(client.WithNameServers("127.0.0.1:1")), o)
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

// sendEach sends each body to topic t with SendAsync and returns a channel that gets every
// outcome, with the index of its message.
func sendEach(p *producer.Producer, out chan<- indexedOutcome, from int, bodies ...string) {
	for i, body := range bodies {
		p.SendAsync(context.Background(), &producer.Message{Topic: "t", Body: []byte(body)}, func(res producer.SendResult, err error) {
			out <- indexedOutcome{from + i, asyncOutcome{res, err}}
		})
	}
}

type indexedOutcome struct {
	i int
	asyncOutcome
}

func bodies(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// collect waits for n outcomes and returns them by message index.
func collect(t *testing.T, ch <-chan indexedOutcome, n int) []asyncOutcome {
	t.Helper()
	out := make([]asyncOutcome, n)
	for range n {
		select {
		case o := <-ch:
			out[o.i] = o.asyncOutcome
		case <-time.After(wait):
			t.Fatal("callbacks did not all run")
		}
	}
	return out
}

// Several batches of one queue are in flight at once, never more than
// WithAsyncBatchesInFlight: while that many are, the next messages gather into one batch,
// even past the size at which a batch leaves early. Every message gets its own result, and
// the callbacks of a batch run in its order (QueueOffset counts up within each batch).
func TestAsyncBatchingSeveralBatchesInFlight(t *testing.T) {
	fb := startFakeBroker(t, 1)
	// One queue, 128 sends in flight: a batch is half full, and may leave while others are
	// in flight, at min(40, 128)/2 = 20 messages.
	p := newFakeProducer(t, fb, producer.WithAsyncBatching(40, 1<<20, 0), producer.WithAsyncBatchesInFlight(3))
	fb.hold()
	outs := make(chan indexedOutcome, 100)
	sendEach(p, outs, 0, "first")
	<-fb.entered // alone: nothing was in flight
	sendEach(p, outs, 1, bodies("a", 20)...)
	<-fb.entered // a second batch in flight
	sendEach(p, outs, 21, bodies("b", 20)...)
	<-fb.entered // a third
	sendEach(p, outs, 41, bodies("c", 30)...)
	fb.open()
	got := collect(t, outs, 71)
	ids := map[string]bool{}
	for i, o := range got {
		require.NoError(t, o.err, "message %d", i)
		assert.False(t, ids[o.res.MsgID], "message id given twice")
		ids[o.res.MsgID] = true
	}
	// Within a batch, results count up from the broker's one answer (0 from this broker).
	for k := range 20 {
		assert.Equal(t, int64(k), got[1+k].res.QueueOffset, "message a-%d", k)
	}
	for k := range 30 {
		assert.Equal(t, int64(k), got[41+k].res.QueueOffset, "message c-%d", k)
	}
	counts, held := fb.sentCounts()
	assert.Equal(t, []int{1, 20, 20, 30}, counts, "the 30 gathered behind the three in flight")
	assert.Equal(t, []bool{true, true, true, false}, held, "the fourth left only once one in flight was answered")
	assert.Equal(t, []protocol.RequestCode{protocol.SendMessageV2, protocol.SendBatchMessage, protocol.SendBatchMessage, protocol.SendBatchMessage}, fb.sentCodes())
}

// While batches of a queue are in flight, the next one leaves early only once it is half
// full; smaller, it waits for them to finish.
func TestAsyncBatchingSmallBatchWaitsForThoseInFlight(t *testing.T) {
	fb := startFakeBroker(t, 1)
	p := newFakeProducer(t, fb, producer.WithAsyncBatching(40, 1<<20, 0), producer.WithAsyncBatchesInFlight(4))
	fb.hold()
	outs := make(chan indexedOutcome, 100)
	sendEach(p, outs, 0, "first")
	<-fb.entered
	sendEach(p, outs, 1, bodies("a", 19)...) // one short of half full
	fb.open()
	for i, o := range collect(t, outs, 20) {
		require.NoError(t, o.err, "message %d", i)
	}
	counts, held := fb.sentCounts()
	assert.Equal(t, []int{1, 19}, counts)
	assert.Equal(t, []bool{true, false}, held)
}

// A selector that keeps order gets one batch in flight per queue unless the option says
// otherwise: messages gather behind the batch in flight whatever their number.
func TestAsyncBatchingOrderedSelectorDefaultsToOneInFlight(t *testing.T) {
	fb := startFakeBroker(t, 1)
	p := newFakeProducer(t, fb, producer.WithAsyncBatching(100, 1<<20, 0), producer.WithQueueSelector(producer.HashByKey()))
	fb.hold()
	outs := make(chan indexedOutcome, 100)
	sendEach(p, outs, 0, "first")
	<-fb.entered
	sendEach(p, outs, 1, bodies("a", 60)...)
	fb.open()
	for i, o := range collect(t, outs, 61) {
		require.NoError(t, o.err, "message %d", i)
	}
	counts, _ := fb.sentCounts()
	assert.Equal(t, []int{1, 60}, counts)
}

// With several batches in flight, a batch the broker refuses as a whole is resent message by
// message while the others are answered: each message gets its own outcome, and only the one
// the broker refuses alone fails. A batch failed with a retriable error is retried, and its
// messages succeed.
func TestAsyncBatchingFailuresWithSeveralInFlight(t *testing.T) {
	fb := startFakeBroker(t, 1)
	fb.mu.Lock()
	fb.refuseBatches = true
	fb.mu.Unlock()
	p := newFakeProducer(t, fb, producer.WithAsyncBatching(8, 1<<20, 0), producer.WithAsyncBatchesInFlight(2))
	fb.hold()
	outs := make(chan indexedOutcome, 100)
	sendEach(p, outs, 0, "first")
	<-fb.entered
	// Half full, min(8, 128)/2 = 4 messages, a batch may leave while another is in flight.
	sendEach(p, outs, 1, "a", "refuse", "b", "c")
	<-fb.entered
	sendEach(p, outs, 5, bodies("d", 8)...) // gathers: two in flight
	fb.open()
	got := collect(t, outs, 13)
	for i, o := range got {
		if i == 2 {
			var be *producer.BrokerError
			require.ErrorAs(t, o.err, &be)
			assert.Equal(t, protocol.MessageIllegal, be.Code)
			continue
		}
		require.NoError(t, o.err, "message %d", i)
	}
	counts, _ := fb.sentCounts()
	assert.Len(t, counts, 1+2+12, "the first, two refused batches, then their twelve messages alone")

	// Retriable: the next batch is answered SYSTEM_BUSY once, then stored.
	fb.mu.Lock()
	fb.refuseBatches = false
	fb.mu.Unlock()
	fb.failNext(1)
	fb.hold()
	sendEach(p, outs, 0, "x")
	<-fb.entered
	sendEach(p, outs, 1, bodies("y", 4)...)
	<-fb.entered
	fb.open()
	for i, o := range collect(t, outs, 5) {
		require.NoError(t, o.err, "message %d", i)
	}
}

// Messages gathering in batches hold send slots: past WithMaxInFlightAsync, SendAsync waits
// (here until its context ends) however the sends are batched, and the slots come back once
// the batches are answered.
func TestAsyncBatchingBoundedBySlots(t *testing.T) {
	fb := startFakeBroker(t, 1)
	p := newFakeProducer(t, fb, producer.WithAsyncBatching(100, 1<<20, 0), producer.WithAsyncBatchesInFlight(2), producer.WithMaxInFlightAsync(8))
	fb.hold()
	outs := make(chan indexedOutcome, 100)
	sendEach(p, outs, 0, "first")
	<-fb.entered
	sendEach(p, outs, 1, bodies("a", 7)...) // 8 in all: every slot taken
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go p.SendAsync(ctx, &producer.Message{Topic: "t", Body: []byte("ninth")}, func(_ producer.SendResult, err error) { waited <- err })
	cancel()
	select {
	case err := <-waited:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(wait):
		t.Fatal("the ninth send did not end with its context")
	}
	fb.open()
	for i, o := range collect(t, outs, 8) {
		require.NoError(t, o.err, "message %d", i)
	}
	sendEach(p, outs, 0, bodies("b", 8)...)
	for i, o := range collect(t, outs, 8) {
		require.NoError(t, o.err, "message %d, once the slots came back", i)
	}
	counts, _ := fb.sentCounts()
	total := 0
	for _, c := range counts {
		total += c
	}
	assert.Equal(t, 16, total, "the ninth message was never sent")
}

// With an ordered selector and many batches of each queue in flight, against a flowd broker
// (asynchronous flush: it serves a connection's sends in order), every queue stores its
// messages in the order they were given, and each message's result names its own offset.
func TestAsyncBatchingOrderWithManyInFlight(t *testing.T) {
	b := startBroker(t, nil)
	mqs := createTopic(t, b, "ordered", 4)
	p := newProducer(t, b, producer.WithQueueSelector(producer.HashByKey()), producer.WithAsyncBatching(8, 64<<10, 0),
		producer.WithAsyncBatchesInFlight(8), producer.WithMaxInFlightAsync(256))
	const n = 3000
	msgs := make([]*producer.Message, n)
	for i := range msgs {
		msgs[i] = &producer.Message{Topic: "ordered", Keys: []string{fmt.Sprintf("key-%d", i%16)}, Body: fmt.Appendf(nil, "m-%04d", i)}
	}
	out := sendAllAsync(t, p, msgs)
	perQueue := map[int][]int{}
	for i, o := range out {
		require.NoError(t, o.err, "message %d", i)
		perQueue[o.res.Queue.QueueID] = append(perQueue[o.res.Queue.QueueID], i)
	}
	for _, mq := range mqs {
		idx := perQueue[mq.QueueID]
		if len(idx) == 0 {
			continue
		}
		stored := rawPull(t, b, mq, 0, len(idx))
		require.Len(t, stored, len(idx))
		for k, i := range idx {
			require.Equal(t, string(msgs[i].Body), string(stored[k].Body), "queue %d offset %d holds the messages in the order given", mq.QueueID, k)
			require.Equal(t, int64(k), out[i].res.QueueOffset, "message %d", i)
		}
	}
	require.GreaterOrEqual(t, len(perQueue), 2)
}

// With a linger, a small batch gathering behind another in flight leaves once its linger has
// passed, when there is room in flight, without waiting for the one in flight.
func TestAsyncBatchingLingerWithOthersInFlight(t *testing.T) {
	fb := startFakeBroker(t, 1)
	p := newFakeProducer(t, fb, producer.WithAsyncBatching(40, 1<<20, producer.MaxAsyncBatchLinger), producer.WithAsyncBatchesInFlight(2))
	fb.hold()
	outs := make(chan indexedOutcome, 10)
	sendEach(p, outs, 0, "first")
	<-fb.entered // once its linger passed, alone
	sendEach(p, outs, 1, "a", "b", "c")
	select {
	case <-fb.entered:
	case <-time.After(wait):
		t.Fatal("the small batch did not leave once its linger passed")
	}
	fb.open()
	for i, o := range collect(t, outs, 4) {
		require.NoError(t, o.err, "message %d", i)
	}
	counts, held := fb.sentCounts()
	assert.Equal(t, []int{1, 3}, counts)
	assert.Equal(t, []bool{true, true}, held)
}
