package producer_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/protocol"
)

func bodiesOf(msgs []*consumer.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = string(m.Body)
	}
	slices.Sort(out)
	return out
}

func TestSendModesLand(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "modes", 4)
	p := newProducer(t, b)
	ctx := context.Background()
	var want []string

	for i := range 10 {
		body := fmt.Sprint("sync-", i)
		res, err := p.Send(ctx, &producer.Message{Topic: "modes", Body: []byte(body)})
		require.NoError(t, err)
		assert.Equal(t, producer.SendOK, res.Status)
		assert.Len(t, res.MsgID, 32)
		assert.NotEmpty(t, res.OffsetMsgID)
		assert.Equal(t, "modes", res.Queue.Topic)
		want = append(want, body)
	}

	var wg sync.WaitGroup
	var mu sync.Mutex
	var asyncErrs []error
	for i := range 10 {
		body := fmt.Sprint("async-", i)
		wg.Add(1)
		p.SendAsync(ctx, &producer.Message{Topic: "modes", Body: []byte(body)}, func(res producer.SendResult, err error) {
			defer wg.Done()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				asyncErrs = append(asyncErrs, err)
			}
		})
		want = append(want, body)
	}
	wg.Wait()
	assert.Empty(t, asyncErrs)

	for i := range 10 {
		body := fmt.Sprint("oneway-", i)
		require.NoError(t, p.SendOneway(ctx, &producer.Message{Topic: "modes", Body: []byte(body)}))
		want = append(want, body)
	}

	var batch []*producer.Message
	for i := range 10 {
		body := fmt.Sprint("batch-", i)
		batch = append(batch, &producer.Message{Topic: "modes", Body: []byte(body), Tags: "bt"})
		want = append(want, body)
	}
	results, err := p.SendBatch(ctx, batch...)
	require.NoError(t, err)
	require.Len(t, results, 10, "one result per message")

	got := readAll(t, b, "modes", len(want))
	slices.Sort(want)
	assert.Equal(t, want, bodiesOf(got))
	// A batch lands in one queue, in order, with consecutive offsets.
	var inBatch []*consumer.Message
	for _, m := range got {
		if strings.HasPrefix(string(m.Body), "batch-") {
			inBatch = append(inBatch, m)
			assert.Equal(t, results[0].Queue, m.Queue)
			assert.Equal(t, "bt", m.Tags)
		}
	}
	slices.SortFunc(inBatch, func(a, b *consumer.Message) int { return int(a.QueueOffset - b.QueueOffset) })
	for i, m := range inBatch {
		assert.Equal(t, fmt.Sprint("batch-", i), string(m.Body))
		r := results[i]
		assert.Equal(t, results[0].QueueOffset+int64(i), m.QueueOffset)
		assert.Equal(t, r.QueueOffset, m.QueueOffset)
		assert.Equal(t, r.Queue, m.Queue)
		assert.Equal(t, r.MsgID, m.MsgID)
		assert.Equal(t, r.OffsetMsgID, m.OffsetMsgID)
		assert.Equal(t, producer.SendOK, r.Status)
	}
}

func TestTagsKeysProperties(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "props", 1)
	p := newProducer(t, b)
	res, err := p.Send(context.Background(), &producer.Message{
		Topic: "props", Body: []byte("hello"), Tags: "TagA", Keys: []string{"order-1", "user-2"},
		Properties: map[string]string{"region": "eu", "priority": "7"}, Flag: 3,
	})
	require.NoError(t, err)
	got := readAll(t, b, "props", 1)
	require.Len(t, got, 1)
	m := got[0]
	assert.Equal(t, "TagA", m.Tags)
	assert.Equal(t, []string{"order-1", "user-2"}, m.Keys)
	assert.Equal(t, "eu", m.Property("region"))
	assert.Equal(t, "7", m.Property("priority"))
	assert.Equal(t, res.MsgID, m.MsgID)
	assert.Equal(t, res.OffsetMsgID, m.OffsetMsgID)
	assert.EqualValues(t, 3, m.Flag)
	assert.Equal(t, "true", m.Property(protocol.PropertyWaitStoreOK))
}

func TestHashByKeyKeepsPerKeyOrder(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "ordered", 8)
	p := newProducer(t, b, producer.WithQueueSelector(producer.HashByKey()))
	ctx := context.Background()
	keys := []string{"alice", "bob", "carol", "dave", "erin", "frank"}
	for i := range 20 {
		for _, k := range keys {
			m := &producer.Message{Topic: "ordered", Body: []byte(fmt.Sprintf("%s-%02d", k, i)), Keys: []string{k}}
			if k == "frank" {
				m.Keys, m.ShardingKey = nil, k
			}
			_, err := p.Send(ctx, m)
			require.NoError(t, err)
		}
	}
	got := readAll(t, b, "ordered", 20*len(keys))
	require.Len(t, got, 20*len(keys))
	slices.SortFunc(got, func(a, b *consumer.Message) int {
		if a.Queue.QueueID != b.Queue.QueueID {
			return a.Queue.QueueID - b.Queue.QueueID
		}
		return int(a.QueueOffset - b.QueueOffset)
	})
	queueOf := map[string]int{}
	next := map[string]int{}
	usedQueues := map[int]bool{}
	for _, m := range got {
		k, n, _ := strings.Cut(string(m.Body), "-")
		if q, ok := queueOf[k]; ok {
			assert.Equal(t, q, m.Queue.QueueID, "key %s in one queue", k)
		}
		queueOf[k] = m.Queue.QueueID
		usedQueues[m.Queue.QueueID] = true
		assert.Equal(t, fmt.Sprintf("%02d", next[k]), n, "key %s in order", k)
		next[k]++
	}
	assert.Greater(t, len(usedQueues), 1, "keys spread over queues")
}

func TestSelectors(t *testing.T) {
	qs := []producer.MessageQueue{{Topic: "t", BrokerName: "b", QueueID: 0}, {Topic: "t", BrokerName: "b", QueueID: 1}, {Topic: "t", BrokerName: "b", QueueID: 2}}
	rr := producer.RoundRobin()
	var seen []int
	for range 6 {
		seen = append(seen, rr.Select(&producer.Message{}, qs).QueueID)
	}
	assert.Equal(t, []int{0, 1, 2, 0, 1, 2}, seen)
	r := producer.Random()
	for range 20 {
		assert.Contains(t, qs, r.Select(&producer.Message{}, qs))
	}
	h := producer.HashByKey()
	a := h.Select(&producer.Message{Keys: []string{"x"}}, qs)
	for range 5 {
		assert.Equal(t, a, h.Select(&producer.Message{Keys: []string{"x"}}, qs))
		assert.Equal(t, a, h.Select(&producer.Message{ShardingKey: "x", Keys: []string{"other"}}, qs))
	}
	_, ordered := h.(producer.OrderedSelector)
	assert.True(t, ordered)
}

func TestCompressionRoundTrip(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "zip", 1)
	p := newProducer(t, b, producer.WithCompressOver(1024), producer.WithCompressLevel(9))
	ctx := context.Background()
	big := strings.Repeat("flowd compresses bodies over the threshold. ", 500)
	_, err := p.Send(ctx, &producer.Message{Topic: "zip", Body: []byte(big)})
	require.NoError(t, err)
	small := "tiny"
	_, err = p.Send(ctx, &producer.Message{Topic: "zip", Body: []byte(small)})
	require.NoError(t, err)

	stored := rawPull(t, b, queues[0], 0, 2)
	require.Len(t, stored, 2)
	assert.NotZero(t, stored[0].SysFlag&protocol.MsgFlagCompressed, "stored compressed")
	assert.Less(t, len(stored[0].Body), len(big)/10)
	assert.Zero(t, stored[1].SysFlag&protocol.MsgFlagCompressed)

	got := readAll(t, b, "zip", 2)
	require.Len(t, got, 2)
	assert.Equal(t, big, string(got[0].Body), "the consumer inflates it")
	assert.Equal(t, small, string(got[1].Body))
}

func TestAutoCreateTopic(t *testing.T) {
	b := startBroker(t, nil)
	ctx := context.Background()
	p := newProducer(t, b, producer.WithDefaultTopicQueues(3))
	for i := range 9 {
		_, err := p.Send(ctx, &producer.Message{Topic: "brand-new", Body: []byte(fmt.Sprint(i))})
		require.NoError(t, err)
	}
	r, err := admin(t, b).Route(ctx, "brand-new")
	require.NoError(t, err)
	assert.Len(t, r.PublishQueues, 3)
	assert.Len(t, readAll(t, b, "brand-new", 9), 9)

	off := startBroker(t, func(c *broker.Config) { c.DisableAutoCreateTopics = true })
	p2 := newProducer(t, off)
	_, err = p2.Send(ctx, &producer.Message{Topic: "brand-new", Body: []byte("x")})
	require.ErrorIs(t, err, producer.ErrNoRoute)
}

func TestDeadAddressFailsClearly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	ln.Close()
	p, err := producer.New("g", producer.WithClientOptions(client.WithNameServers(dead), client.WithLogger(quiet())), producer.WithSendTimeout(time.Second))
	require.NoError(t, err)
	require.NoError(t, p.Start(context.Background()))
	defer p.Close(context.Background())
	_, err = p.Send(context.Background(), &producer.Message{Topic: "t", Body: []byte("x")})
	require.ErrorIs(t, err, producer.ErrNoRoute)
	assert.Contains(t, err.Error(), dead)
	assert.Contains(t, err.Error(), "refused", "the cause, not a timeout")
}

func TestSendTimeout(t *testing.T) {
	// A name server that accepts connections and never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}()
	// Were the send timeout not honoured, the send would hang for good: the test's own
	// timeout, not a speed assertion, is the check.
	p, err := producer.New("g", producer.WithClientOptions(client.WithNameServers(ln.Addr().String()), client.WithLogger(quiet())), producer.WithSendTimeout(300*time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, p.Start(context.Background()))
	defer p.Close(context.Background())
	_, err = p.Send(context.Background(), &producer.Message{Topic: "t", Body: []byte("x")})
	require.Error(t, err)
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)

	// The caller's context bounds it too, below the send timeout.
	long, err := producer.New("g", producer.WithClientOptions(client.WithNameServers(ln.Addr().String()), client.WithLogger(quiet())), producer.WithSendTimeout(time.Hour))
	require.NoError(t, err)
	require.NoError(t, long.Start(context.Background()))
	defer long.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = long.Send(ctx, &producer.Message{Topic: "t", Body: []byte("x")})
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestMessageTooLargeRefusedClientSide(t *testing.T) {
	// No broker at all: the size check comes first.
	p, err := producer.New("g", producer.WithClientOptions(client.WithNameServers("127.0.0.1:1"), client.WithLogger(quiet())), producer.WithMaxMessageSize(1024))
	require.NoError(t, err)
	require.NoError(t, p.Start(context.Background()))
	defer p.Close(context.Background())
	ctx := context.Background()
	big := &producer.Message{Topic: "t", Body: make([]byte, 1025)}
	_, err = p.Send(ctx, big)
	require.ErrorIs(t, err, producer.ErrMessageTooLarge)
	require.ErrorIs(t, p.SendOneway(ctx, big), producer.ErrMessageTooLarge)
	var asyncErr error
	p.SendAsync(ctx, big, func(_ producer.SendResult, err error) { asyncErr = err })
	require.ErrorIs(t, asyncErr, producer.ErrMessageTooLarge, "reported before SendAsync returns")
	p.SendAsync(ctx, big, nil) // a nil callback is allowed
	var batch []*producer.Message
	for range 3 {
		batch = append(batch, &producer.Message{Topic: "t", Body: make([]byte, 400)})
	}
	_, err = p.SendBatch(ctx, batch...)
	require.ErrorIs(t, err, producer.ErrMessageTooLarge)
}

func TestInvalidMessagesAndStates(t *testing.T) {
	p, err := producer.New("g", producer.WithClientOptions(client.WithNameServers("127.0.0.1:1"), client.WithLogger(quiet())))
	require.NoError(t, err)
	ctx := context.Background()
	_, err = p.Send(ctx, &producer.Message{Topic: "t", Body: []byte("x")})
	require.ErrorIs(t, err, producer.ErrNotStarted)
	require.NoError(t, p.Start(ctx))
	require.ErrorIs(t, p.Start(ctx), producer.ErrBadState)
	for name, m := range map[string]*producer.Message{
		"no topic":   {Body: []byte("x")},
		"long topic": {Topic: strings.Repeat("t", 200), Body: []byte("x")},
		"no body":    {Topic: "t"},
	} {
		_, err := p.Send(ctx, m)
		assert.ErrorIs(t, err, producer.ErrInvalidMessage, name)
	}
	_, err = p.SendBatch(ctx, &producer.Message{Topic: "a", Body: []byte("x")}, &producer.Message{Topic: "b", Body: []byte("x")})
	assert.ErrorIs(t, err, producer.ErrInvalidMessage)
	_, err = p.SendBatch(ctx, &producer.Message{Topic: "a", Body: []byte("x"), DelayLevel: 1})
	assert.ErrorIs(t, err, producer.ErrInvalidMessage)
	_, err = p.SendBatch(ctx)
	assert.ErrorIs(t, err, producer.ErrInvalidMessage)
	require.NoError(t, p.Close(ctx))
	_, err = p.Send(ctx, &producer.Message{Topic: "t", Body: []byte("x")})
	require.ErrorIs(t, err, producer.ErrClosed)
	require.NoError(t, p.Close(ctx))

	_, err = producer.New("g")
	require.ErrorIs(t, err, producer.ErrInvalidOption)
	_, err = producer.New("g", producer.WithClientOptions(client.WithNameServers("127.0.0.1:1")), producer.WithCompressLevel(42))
	require.ErrorIs(t, err, producer.ErrInvalidOption)
	_, err = producer.New("g", producer.WithClientOptions(client.WithNameServers("127.0.0.1:1")), producer.WithMaxInFlightAsync(0))
	require.ErrorIs(t, err, producer.ErrInvalidOption)
}

func TestBrokerErrorCarriesCodeAndRemark(t *testing.T) {
	b := startBroker(t, nil)
	p := newProducer(t, b)
	// An illegal topic name has no route; the send goes through the auto-create route and the
	// broker refuses it: not retriable.
	_, err := p.Send(context.Background(), &producer.Message{Topic: "bad topic!", Body: []byte("x")})
	var be *producer.BrokerError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, protocol.MessageIllegal, be.Code)
	assert.NotEmpty(t, be.Remark)
	assert.Contains(t, err.Error(), "1 attempts")
}

func TestDelayLevel(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "later", 1)
	p := newProducer(t, b)
	start := time.Now()
	_, err := p.Send(context.Background(), &producer.Message{Topic: "later", Body: []byte("delayed"), DelayLevel: 2})
	require.NoError(t, err)
	got := readAll(t, b, "later", 1)
	require.Len(t, got, 1)
	assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
}

func TestUniqueIDs(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "ids", 2)
	p := newProducer(t, b)
	seen := map[string]bool{}
	for range 50 {
		res, err := p.Send(context.Background(), &producer.Message{Topic: "ids", Body: []byte("x")})
		require.NoError(t, err)
		require.Len(t, res.MsgID, 32)
		require.Equal(t, strings.ToUpper(res.MsgID), res.MsgID)
		require.False(t, seen[res.MsgID])
		seen[res.MsgID] = true
	}
}

func TestCloseWaitsForAsyncSends(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "closing", 2)
	p := newProducer(t, b)
	var mu sync.Mutex
	done := 0
	for range 50 {
		p.SendAsync(context.Background(), &producer.Message{Topic: "closing", Body: []byte("x")}, func(_ producer.SendResult, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				done++
			}
		})
	}
	require.NoError(t, p.Close(context.Background()))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 50, done)
}

// TestSendAsyncBoundsInFlight: past WithMaxInFlightAsync sends in flight, SendAsync blocks
// until a slot frees, its context ends, or the producer closes; it never piles up goroutines.
func TestSendAsyncBoundsInFlight(t *testing.T) {
	fb := startFakeBroker(t, 2)
	p := newFakeProducer(t, fb, producer.WithMaxInFlightAsync(2), producer.WithSendTimeout(time.Hour))
	ctx := context.Background()
	msg := func(body string) *producer.Message { return &producer.Message{Topic: "bounded", Body: []byte(body)} }
	results := make(chan error, 16)
	record := func(_ producer.SendResult, err error) { results <- err }

	fb.hold()
	p.SendAsync(ctx, msg("a"), record)
	p.SendAsync(ctx, msg("b"), record)
	for range 2 {
		select {
		case <-fb.entered:
		case <-time.After(wait):
			t.Fatal("the first two sends did not reach the broker")
		}
	}

	// Both slots taken: a third send waits, and its context ending fails it before
	// SendAsync returns, without anything sent.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	var got error
	called := false
	p.SendAsync(short, msg("c"), func(_ producer.SendResult, err error) { called, got = true, err })
	require.True(t, called, "SendAsync waited for a slot and reported the timeout itself")
	require.ErrorIs(t, got, context.DeadlineExceeded)
	assert.Len(t, fb.sent(), 2)

	// A waiting send goes once a slot frees.
	waiting := make(chan struct{})
	go func() {
		defer close(waiting)
		p.SendAsync(ctx, msg("d"), record)
	}()
	fb.open()
	<-waiting
	for range 3 {
		require.NoError(t, <-results)
	}
	assert.Len(t, fb.sent(), 3)
	<-fb.entered // d's

	// Close wakes a send waiting for a slot with ErrClosed.
	fb.hold()
	p.SendAsync(ctx, msg("e"), record)
	p.SendAsync(ctx, msg("f"), record)
	for range 2 {
		<-fb.entered
	}
	blocked := make(chan error, 1)
	go p.SendAsync(ctx, msg("g"), func(_ producer.SendResult, err error) { blocked <- err })
	closeCtx, cancelClose := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelClose()
	err := p.Close(closeCtx)
	require.ErrorIs(t, err, context.DeadlineExceeded, "e and f were still in flight")
	select {
	case err := <-blocked:
		require.ErrorIs(t, err, producer.ErrClosed)
	case <-time.After(wait):
		t.Fatal("a send waiting for a slot was not woken by Close")
	}
	for range 2 {
		select {
		case err := <-results:
			require.Error(t, err, "closing the client core fails the sends in flight")
			assert.NotContains(t, err.Error(), "3 attempts", "a closed client is not retried")
		case <-time.After(wait):
			t.Fatal("the sends in flight did not end when the client core closed")
		}
	}
}

// retryStays is a selector that always picks the first queue it is given, and says whether
// retries must stay there.
type retryStays bool

func (r retryStays) Select(_ *producer.Message, qs []producer.MessageQueue) producer.MessageQueue {
	return qs[0]
}
func (r retryStays) Ordered() bool { return bool(r) }

// TestRetryQueueFollowsOrdered: a retriable failure is retried on another queue, unless the
// selector is an OrderedSelector whose Ordered reports true.
func TestRetryQueueFollowsOrdered(t *testing.T) {
	for _, tc := range []struct {
		ordered bool
		want    []int32
	}{{false, []int32{0, 1}}, {true, []int32{0, 0}}} {
		t.Run(fmt.Sprint("ordered=", tc.ordered), func(t *testing.T) {
			fb := startFakeBroker(t, 2)
			p := newFakeProducer(t, fb, producer.WithQueueSelector(retryStays(tc.ordered)))
			fb.failNext(1)
			res, err := p.Send(context.Background(), &producer.Message{Topic: "retry", Body: []byte("x")})
			require.NoError(t, err)
			assert.Equal(t, tc.want, fb.sent())
			assert.EqualValues(t, tc.want[1], res.Queue.QueueID)
		})
	}
}
