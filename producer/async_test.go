package producer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/producer"
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

// A callback may call SendAsync, even with every slot taken: callbacks do not run on the
// goroutine that reads the answers which free the slots.
func TestSendAsyncFromCallback(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "chain", 2)
	p := newProducer(t, b, producer.WithMaxInFlightAsync(1))
	ctx := context.Background()
	_, err := p.Send(ctx, &producer.Message{Topic: "chain", Body: []byte("route")})
	require.NoError(t, err)
	const n = 300
	finished := make(chan error, 1)
	var next func(int) func(producer.SendResult, error)
	next = func(i int) func(producer.SendResult, error) {
		return func(_ producer.SendResult, err error) {
			if err != nil || i == n {
				finished <- err
				return
			}
			p.SendAsync(ctx, &producer.Message{Topic: "chain", Body: []byte("x")}, next(i+1)) // waits for the slot just freed
		}
	}
	p.SendAsync(ctx, &producer.Message{Topic: "chain", Body: []byte("x")}, next(1))
	select {
	case err := <-finished:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the chain of sends stalled")
	}
	require.Len(t, readAll(t, b, "chain", n+1), n+1)
}
