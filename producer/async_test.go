package producer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/protocol"
)

// An asynchronous send whose first attempt fails retriably is retried on another queue, as
// Send is, and its callback gets the second attempt's result.
func TestSendAsyncRetries(t *testing.T) {
	fb := startFakeBroker(t, 2)
	p := newFakeProducer(t, fb, producer.WithQueueSelector(retryStays(false)))
	ctx := context.Background()
	_, err := p.Send(ctx, &producer.Message{Topic: "retry-async", Body: []byte("route")}) // caches the route
	require.NoError(t, err)
	fb.failNext(1)
	type result struct {
		res producer.SendResult
		err error
	}
	got := make(chan result, 1)
	p.SendAsync(ctx, &producer.Message{Topic: "retry-async", Body: []byte("x")}, func(res producer.SendResult, err error) {
		got <- result{res, err}
	})
	var r result
	select {
	case r = <-got:
	case <-time.After(wait):
		t.Fatal("no result")
	}
	require.NoError(t, r.err)
	assert.Equal(t, []int32{0, 0, 1}, fb.sent())
	assert.EqualValues(t, 1, r.res.Queue.QueueID)
}

// An asynchronous send that gets no answer within the send timeout fails with
// context.DeadlineExceeded, and is not retried (the broker may have stored it).
func TestSendAsyncTimesOut(t *testing.T) {
	fb := startFakeBroker(t, 2)
	p := newFakeProducer(t, fb, producer.WithSendTimeout(200*time.Millisecond))
	ctx := context.Background()
	_, err := p.Send(ctx, &producer.Message{Topic: "slow", Body: []byte("route")})
	require.NoError(t, err)
	<-fb.entered
	fb.hold()
	got := make(chan error, 1)
	p.SendAsync(ctx, &producer.Message{Topic: "slow", Body: []byte("x")}, func(_ producer.SendResult, err error) { got <- err })
	select {
	case err := <-got:
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(wait):
		t.Fatal("the send never timed out")
	}
	assert.Len(t, fb.sent(), 2, "sent once, not retried")
}

// A callback may call SendAsync, even with every slot taken (by its own send, whose callback
// has not returned): the callback's SendAsync takes that slot over rather than wait for it,
// and callbacks do not run on the goroutine that reads the answers. So with batching, whose
// callbacks run one after another on one goroutine, and with more chains than slots, whose
// callbacks run at once on several goroutines while the later chains wait to begin.
func TestSendAsyncFromCallback(t *testing.T) {
	for _, tc := range []struct {
		batching      bool
		limit, chains int
	}{{false, 1, 1}, {true, 1, 1}, {false, 2, 3}, {true, 2, 3}} {
		t.Run(fmt.Sprintf("batching=%v,limit=%d,chains=%d", tc.batching, tc.limit, tc.chains), func(t *testing.T) {
			b := startBroker(t, nil)
			createTopic(t, b, "chain", 2)
			opts := []producer.Option{producer.WithMaxInFlightAsync(tc.limit)}
			if tc.batching {
				opts = append(opts, producer.WithAsyncBatching(8, 64<<10, 0))
			}
			p := newProducer(t, b, opts...)
			ctx := context.Background()
			_, err := p.Send(ctx, &producer.Message{Topic: "chain", Body: []byte("route")})
			require.NoError(t, err)
			const n = 200
			finished := make(chan error, tc.chains)
			var next func(int) func(producer.SendResult, error)
			next = func(i int) func(producer.SendResult, error) {
				return func(_ producer.SendResult, err error) {
					if err != nil || i == n {
						finished <- err
						return
					}
					p.SendAsync(ctx, &producer.Message{Topic: "chain", Body: []byte("x")}, next(i+1)) // no slot free but this callback's
				}
			}
			for range tc.chains {
				go p.SendAsync(ctx, &producer.Message{Topic: "chain", Body: []byte("x")}, next(1))
			}
			for range tc.chains {
				select {
				case err := <-finished:
					require.NoError(t, err)
				case <-time.After(30 * time.Second):
					t.Fatal("the chains of sends stalled")
				}
			}
			require.Len(t, readAll(t, b, "chain", 1+n*tc.chains), 1+n*tc.chains)
		})
	}
}

// WithMaxInFlightAsync bounds the sends whose callback has not returned, not only those
// waiting for an answer: with a slow callback, SendAsync waits for callbacks to return, so
// that no burst of sends queues more callbacks (and holds more messages) than the bound. A
// SendAsync waiting for a slot ends when its context does, with the context's error, given to
// its callback before it returns, and nothing sent. So with batching.
func TestSendAsyncBoundHoldsUntilCallbackReturns(t *testing.T) {
	for _, batching := range []bool{false, true} {
		t.Run(fmt.Sprintf("batching=%v", batching), func(t *testing.T) {
			const limit, n = 8, 200
			b := startBroker(t, nil)
			createTopic(t, b, "bounded", 4)
			opts := []producer.Option{producer.WithMaxInFlightAsync(limit)}
			if batching {
				opts = append(opts, producer.WithAsyncBatching(4, 64<<10, 0))
			}
			p := newProducer(t, b, opts...)
			ctx := context.Background()
			_, err := p.Send(ctx, &producer.Message{Topic: "bounded", Body: []byte("route")}) // caches the route
			require.NoError(t, err)
			msg := func() *producer.Message { return &producer.Message{Topic: "bounded", Body: []byte("x")} }

			// A slow callback: outstanding sends (returned from SendAsync, callback not yet
			// returned) never exceed the bound. A send is admitted before SendAsync returns
			// and counted as finished before its callback returns, so the count is a lower
			// bound of the truth, which the fix keeps at limit.
			var returned, finished, most atomic.Int64
			errs := make(chan error, n)
			for range n {
				p.SendAsync(ctx, msg(), func(_ producer.SendResult, err error) {
					if err != nil {
						errs <- err
					}
					time.Sleep(2 * time.Millisecond) // slow, not an assertion
					finished.Add(1)
				})
				out := returned.Add(1) - finished.Load()
				for m := most.Load(); out > m && !most.CompareAndSwap(m, out); m = most.Load() {
				}
			}
			require.Eventually(t, func() bool { return finished.Load() == n }, wait, time.Millisecond)
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			assert.LessOrEqual(t, most.Load(), int64(limit), "sends outstanding at once")

			// Every slot held by a callback that does not return: SendAsync waits, and its
			// context ends the wait with its error.
			release := make(chan struct{})
			var releaseOnce sync.Once
			open := func() { releaseOnce.Do(func() { close(release) }) }
			t.Cleanup(open) // before Close, which waits for the callbacks
			entered := make(chan struct{}, limit)
			var gated atomic.Int64
			for range limit {
				p.SendAsync(ctx, msg(), func(_ producer.SendResult, err error) {
					assert.NoError(t, err)
					entered <- struct{}{}
					<-release
					gated.Add(1)
				})
			}
			select {
			case <-entered:
			case <-time.After(wait):
				t.Fatal("no callback ran")
			}
			cctx, cancel := context.WithCancel(ctx)
			probe := &doneProbe{Context: cctx, asked: make(chan struct{})}
			got := make(chan error, 1)
			cancelled := make(chan struct{})
			go func() {
				p.SendAsync(probe, msg(), func(_ producer.SendResult, err error) { got <- err })
				close(cancelled)
			}()
			admittedAfter := make(chan int64, 1)
			waiting := make(chan error, 1)
			go func() {
				p.SendAsync(ctx, msg(), func(_ producer.SendResult, err error) { waiting <- err })
				admittedAfter <- gated.Load()
			}()
			select { // SendAsync waits on its context: cancel it then, not before
			case <-probe.asked:
			case <-time.After(wait):
				t.Fatal("SendAsync never waited on its context")
			}
			cancel()
			select {
			case <-cancelled:
			case <-time.After(wait):
				t.Fatal("cancelling its context did not end SendAsync's wait")
			}
			select {
			case err := <-got:
				require.ErrorIs(t, err, context.Canceled)
			default:
				t.Fatal("SendAsync returned before its callback got the context's error: it did not wait for a slot")
			}
			open()
			select {
			case n := <-admittedAfter:
				assert.GreaterOrEqual(t, n, int64(1), "admitted only once a callback returned")
			case <-time.After(wait):
				t.Fatal("SendAsync never got a slot")
			}
			select {
			case err := <-waiting:
				require.NoError(t, err)
			case <-time.After(wait):
				t.Fatal("no callback")
			}
			require.Eventually(t, func() bool { return gated.Load() == limit }, wait, time.Millisecond)
			// The route, the burst, the gated sends and the one that waited: not the cancelled one.
			require.Len(t, readAll(t, b, "bounded", 1+n+limit+1), 1+n+limit+1)
		})
	}
}

// doneProbe is a context that tells when Done is first asked for: when SendAsync waits on it.
type doneProbe struct {
	context.Context
	once  sync.Once
	asked chan struct{}
}

func (c *doneProbe) Done() <-chan struct{} {
	c.once.Do(func() { close(c.asked) })
	return c.Context.Done()
}

// Unbatched asynchronous sends, their state reused from send to send, each report their own
// message's id, queue and offsets: many sends from several goroutines, few slots, so that
// every send's state has served several before it.
func TestSendAsyncResultsPerMessageUnbatched(t *testing.T) {
	b := startBroker(t, nil)
	mqs := createTopic(t, b, "unbatched", 2)
	p := newProducer(t, b, producer.WithMaxInFlightAsync(8))

	const senders, each = 4, 150
	msgs := make([]*producer.Message, senders*each)
	for i := range msgs {
		msgs[i] = &producer.Message{Topic: "unbatched", Body: fmt.Appendf(nil, "m-%04d", i)}
	}
	out := make([]asyncOutcome, len(msgs))
	var wg sync.WaitGroup
	var sendersWG sync.WaitGroup
	for s := range senders {
		sendersWG.Go(func() {
			for i := s * each; i < (s+1)*each; i++ {
				wg.Add(1)
				p.SendAsync(context.Background(), msgs[i], func(res producer.SendResult, err error) {
					out[i] = asyncOutcome{res, err}
					wg.Done()
				})
			}
		})
	}
	sendersWG.Wait()
	wg.Wait()

	byQueue := map[int]map[int64]int{} // queue id -> queue offset -> index in msgs
	ids := map[string]bool{}
	for i, o := range out {
		require.NoError(t, o.err, "message %d", i)
		assert.False(t, ids[o.res.MsgID], "message id %s given twice", o.res.MsgID)
		ids[o.res.MsgID] = true
		q := byQueue[o.res.Queue.QueueID]
		if q == nil {
			q = map[int64]int{}
			byQueue[o.res.Queue.QueueID] = q
		}
		_, dup := q[o.res.QueueOffset]
		assert.False(t, dup, "two results name offset %d of queue %d", o.res.QueueOffset, o.res.Queue.QueueID)
		q[o.res.QueueOffset] = i
	}
	for _, mq := range mqs {
		q := byQueue[mq.QueueID]
		stored := rawPull(t, b, mq, 0, len(q))
		require.Len(t, stored, len(q))
		for k, m := range stored {
			i, ok := q[int64(k)]
			require.True(t, ok, "no result names offset %d of queue %d", k, mq.QueueID)
			r := out[i].res
			assert.Equal(t, string(msgs[i].Body), string(m.Body), "message %d's result names its own stored message", i)
			assert.Equal(t, r.MsgID, m.Properties[protocol.PropertyUniqueKey], "message %d", i)
			_, clOffset, err := protocol.ParseOffsetMsgID(r.OffsetMsgID)
			require.NoError(t, err)
			assert.Equal(t, m.CommitLogOffset, clOffset, "message %d", i)
		}
	}
}
