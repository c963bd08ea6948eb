package broker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/broker/filter"
	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/protocol"
)

// bodyMatcher is a batch filter (as a Wasm module would be) that keeps messages whose body
// contains "want". It counts its calls and records every queue offset it evaluated; with
// block set, a call waits for block to close (or its context) before deciding.
type bodyMatcher struct {
	calls   atomic.Int64
	mu      sync.Mutex
	seen    []int64
	err     error
	block   chan struct{}
	entered chan struct{} // receives once per blocked call
}

func (m *bodyMatcher) Match(ctx context.Context, msgs []filter.Message, keep []bool) error {
	m.calls.Add(1)
	m.mu.Lock()
	for _, msg := range msgs {
		m.seen = append(m.seen, msg.QueueOffset)
	}
	err := m.err
	m.mu.Unlock()
	if m.block != nil {
		m.entered <- struct{}{}
		select {
		case <-m.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err != nil {
		return err
	}
	for i, msg := range msgs {
		keep[i] = bytes.Contains(msg.Body, []byte("want"))
	}
	return nil
}

func (m *bodyMatcher) evaluated() []int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.seen)
}

// startFilterBroker starts a broker whose WASM expressions all resolve to m.
func startFilterBroker(t *testing.T, m filter.BatchMatcher, onError store.FilterErrorPolicy) *testBroker {
	reg := filter.NewRegistry(0)
	reg.Register(filter.TypeWasm, filter.Batch(func(context.Context, filter.Subscription) (filter.BatchMatcher, error) {
		return m, nil
	}, onError))
	return startBroker(t, func(c *broker.Config) { c.Filters = reg })
}

func wasmPullHeader(topic string, offset int64, suspend time.Duration) *protocol.PullMessageRequestHeader {
	h := pullHeader(topic, offset, suspend, "want@1")
	h.ExpressionType = filter.TypeWasm
	return h
}

type pullResult struct {
	resp *protocol.Command
	err  error
}

func (c *rawClient) pullAsync(ctx context.Context, h *protocol.PullMessageRequestHeader) chan pullResult {
	done := make(chan pullResult, 1)
	go func() {
		resp, err := c.cl.Invoke(ctx, c.b.Addr(), protocol.NewRequestWith(protocol.PullMessage, h, nil))
		done <- pullResult{resp, err}
	}()
	return done
}

// pulled returns the bodies and nextBeginOffset of a pull response.
func pulled(t *testing.T, resp *protocol.Command) ([]string, int64) {
	t.Helper()
	var rh protocol.PullMessageResponseHeader
	require.NoError(t, resp.DecodeHeader(&rh))
	var bodies []string
	if resp.ResponseCode() == protocol.Success {
		msgs, err := protocol.DecodeStoredAll(resp.Body)
		require.NoError(t, err)
		for _, m := range msgs {
			bodies = append(bodies, string(m.Body))
		}
	}
	return bodies, rh.NextBeginOffset
}

func TestParkedPullWakesOnlyForAMatchingMessage(t *testing.T) {
	m := &bodyMatcher{}
	b := startFilterBroker(t, m, store.FailClosed)
	c := newRawClient(t, b, nil)
	c.send("lpf", "first", "")
	require.Eventually(t, func() bool { return b.StoreMax("lpf", 0) == 1 }, 5*time.Second, 5*time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := c.pullAsync(ctx, wasmPullHeader("lpf", 1, 20*time.Second))
	require.Eventually(t, func() bool { return b.WaitingPulls() == 1 }, 5*time.Second, time.Millisecond, "the pull parks")

	// A message the filter rejects wakes the pull (its tag code passes), which evaluates
	// it and goes back to waiting without answering.
	c.send("lpf", "not this one", "")
	require.Eventually(t, func() bool {
		return slices.Contains(m.evaluated(), 1) && b.WaitingPulls() == 1
	}, 5*time.Second, time.Millisecond, "the rejected arrival is evaluated and the pull waits again")
	select {
	case r := <-done:
		t.Fatalf("pull answered for a message its filter rejects: %v %v", r.resp, r.err)
	default:
	}

	c.send("lpf", "wanted", "")
	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, protocol.Success, r.resp.ResponseCode(), r.resp.Remark)
	bodies, next := pulled(t, r.resp)
	assert.Equal(t, []string{"wanted"}, bodies)
	assert.Equal(t, int64(3), next)
	assert.Equal(t, []int64{1, 2}, m.evaluated(), "each arrival evaluated once")
}

func TestPullCallsTheFilterOncePerWindow(t *testing.T) {
	m := &bodyMatcher{}
	b := startFilterBroker(t, m, store.FailClosed)
	c := newRawClient(t, b, nil)
	for i := range 10 {
		body := fmt.Sprint("skip-", i)
		if i%2 == 0 {
			body = fmt.Sprint("want-", i)
		}
		c.send("win", body, "")
	}
	require.Eventually(t, func() bool { return b.StoreMax("win", 0) == 10 }, 5*time.Second, 5*time.Millisecond)
	resp := c.invoke(context.Background(), protocol.PullMessage, wasmPullHeader("win", 0, 0), nil)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	bodies, next := pulled(t, resp)
	assert.Equal(t, []string{"want-0", "want-2", "want-4", "want-6", "want-8"}, bodies)
	assert.Equal(t, int64(10), next)
	assert.Equal(t, int64(1), m.calls.Load(), "ten messages, one filter call")
}

func TestPullFilterErrorPolicies(t *testing.T) {
	for _, policy := range []store.FilterErrorPolicy{store.FailClosed, store.FailOpen} {
		t.Run(policy.String(), func(t *testing.T) {
			m := &bodyMatcher{err: errors.New("module trapped")}
			b := startFilterBroker(t, m, policy)
			c := newRawClient(t, b, nil)
			c.send("fe", "want-0", "")
			c.send("fe", "skip-1", "")
			require.Eventually(t, func() bool { return b.StoreMax("fe", 0) == 2 }, 5*time.Second, 5*time.Millisecond)
			resp := c.invoke(context.Background(), protocol.PullMessage, wasmPullHeader("fe", 0, 0), nil)
			if policy == store.FailClosed {
				assert.Equal(t, protocol.SystemError, resp.ResponseCode())
				assert.Contains(t, resp.Remark, "module trapped")
				assert.Empty(t, resp.Body)
				// Another queue with no such filter is served meanwhile.
				c.send("other", "x", "")
				require.Eventually(t, func() bool { return b.StoreMax("other", 0) == 1 }, 5*time.Second, 5*time.Millisecond)
				resp = c.invoke(context.Background(), protocol.PullMessage, pullHeader("other", 0, 0, "*"), nil)
				require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
				return
			}
			require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
			bodies, next := pulled(t, resp)
			assert.Equal(t, []string{"want-0", "skip-1"}, bodies, "fail-open delivers the batch")
			assert.Equal(t, int64(2), next)
		})
	}
}

// TestASlowFilterStallsNeitherDispatchNorOtherQueues parks a pull whose filter blocks:
// the arrival that wakes it is evaluated on the pull's own goroutine, so dispatch goes on
// and a parked pull of another queue is still answered by its arrival.
func TestASlowFilterStallsNeitherDispatchNorOtherQueues(t *testing.T) {
	m := &bodyMatcher{block: make(chan struct{}), entered: make(chan struct{}, 8)}
	b := startFilterBroker(t, m, store.FailClosed)
	c := newRawClient(t, b, nil)
	c.send("slow", "first", "")
	c.send("fast", "first", "")
	require.Eventually(t, func() bool { return b.StoreMax("slow", 0) == 1 && b.StoreMax("fast", 0) == 1 }, 5*time.Second, 5*time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	slow := c.pullAsync(ctx, wasmPullHeader("slow", 1, 20*time.Second))
	require.Eventually(t, func() bool { return b.WaitingPulls() == 1 }, 5*time.Second, time.Millisecond)
	c.send("slow", "want-1", "")
	select {
	case <-m.entered: // the slow pull is inside its filter now
	case <-ctx.Done():
		t.Fatal("the parked pull was not woken")
	}

	h := pullHeader("fast", 1, 20*time.Second, "*")
	h.ConsumerGroup = "fast-group"
	fast := c.pullAsync(ctx, h)
	require.Eventually(t, func() bool { return b.WaitingPulls() == 1 }, 5*time.Second, time.Millisecond, "the fast pull parks")
	c.send("fast", "second", "")
	r := <-fast
	require.NoError(t, r.err)
	require.Equal(t, protocol.Success, r.resp.ResponseCode(), r.resp.Remark)
	bodies, _ := pulled(t, r.resp)
	assert.Equal(t, []string{"second"}, bodies)

	close(m.block)
	r = <-slow
	require.NoError(t, r.err)
	require.Equal(t, protocol.Success, r.resp.ResponseCode(), r.resp.Remark)
	bodies, next := pulled(t, r.resp)
	assert.Equal(t, []string{"want-1"}, bodies)
	assert.Equal(t, int64(2), next)
}

// TestSharedFilterUnderConcurrentPullsAndWakeups runs long-polling readers on separate
// connections, all with the one compiled filter of their subscription, while messages
// arrive: every reader gets exactly the matching messages, in order.
func TestSharedFilterUnderConcurrentPullsAndWakeups(t *testing.T) {
	m := &bodyMatcher{}
	b := startFilterBroker(t, m, store.FailClosed)
	producer := newRawClient(t, b, nil)
	producer.send("conc", "skip-start", "")
	require.Eventually(t, func() bool { return b.StoreMax("conc", 0) == 1 }, 5*time.Second, 5*time.Millisecond)
	const n = 60
	var want []string
	for i := range n {
		if i%3 == 0 {
			want = append(want, fmt.Sprint("want-", i))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 4 {
		c := newRawClient(t, b, nil)
		wg.Go(func() {
			var got []string
			off := int64(0)
			for len(got) < len(want) && ctx.Err() == nil {
				resp, err := c.cl.Invoke(ctx, b.Addr(), protocol.NewRequestWith(protocol.PullMessage, wasmPullHeader("conc", off, 5*time.Second), nil))
				if !assert.NoError(t, err) {
					return
				}
				code := resp.ResponseCode()
				if !assert.Contains(t, []protocol.ResponseCode{protocol.Success, protocol.PullNotFound, protocol.PullRetryImmediately}, code, resp.Remark) {
					return
				}
				var rh protocol.PullMessageResponseHeader
				if !assert.NoError(t, resp.DecodeHeader(&rh)) {
					return
				}
				if code == protocol.Success {
					msgs, err := protocol.DecodeStoredAll(resp.Body)
					if !assert.NoError(t, err) {
						return
					}
					for _, msg := range msgs {
						got = append(got, string(msg.Body))
					}
				}
				off = rh.NextBeginOffset
			}
			assert.Equal(t, want, got)
		})
	}
	for i := range n {
		body := fmt.Sprint("skip-", i)
		if i%3 == 0 {
			body = fmt.Sprint("want-", i)
		}
		producer.send("conc", body, "")
	}
	wg.Wait()
}

// TestAFilteredPullThatSkippedMessagesIsStillSuperseded: a parked pull that moved past a
// rejected arrival is still the one a newer pull of the same client supersedes, and its
// answer carries the offset past what it rejected.
func TestAFilteredPullThatSkippedMessagesIsStillSuperseded(t *testing.T) {
	m := &bodyMatcher{}
	b := startFilterBroker(t, m, store.FailClosed)
	c := newRawClient(t, b, nil)
	c.send("supf", "first", "")
	require.Eventually(t, func() bool { return b.StoreMax("supf", 0) == 1 }, 5*time.Second, 5*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first := c.pullAsync(ctx, wasmPullHeader("supf", 1, 20*time.Second))
	require.Eventually(t, func() bool { return b.WaitingPulls() == 1 }, 5*time.Second, time.Millisecond)
	c.send("supf", "skip", "")
	require.Eventually(t, func() bool {
		return slices.Contains(m.evaluated(), 1) && b.WaitingPulls() == 1
	}, 5*time.Second, time.Millisecond)

	second := c.pullAsync(ctx, wasmPullHeader("supf", 2, 20*time.Second))
	r := <-first
	require.NoError(t, r.err)
	assert.Equal(t, protocol.PullNotFound, r.resp.ResponseCode(), r.resp.Remark)
	_, next := pulled(t, r.resp)
	assert.Equal(t, int64(2), next, "past the rejected message")

	require.Eventually(t, func() bool { return b.WaitingPulls() == 1 }, 5*time.Second, time.Millisecond, "the newer pull parks")
	c.send("supf", "want", "")
	r = <-second
	require.NoError(t, r.err)
	require.Equal(t, protocol.Success, r.resp.ResponseCode(), r.resp.Remark)
	bodies, next := pulled(t, r.resp)
	assert.Equal(t, []string{"want"}, bodies)
	assert.Equal(t, int64(3), next)
}

// TestArrivalsOfOneDispatchAreEvaluatedInOneCall: a batch of six messages dispatched at
// once wakes a parked pull, which evaluates them with one filter call, not one per message
// (and never on the dispatcher).
func TestArrivalsOfOneDispatchAreEvaluatedInOneCall(t *testing.T) {
	m := &bodyMatcher{}
	b := startFilterBroker(t, m, store.FailClosed)
	c := newRawClient(t, b, nil)
	c.send("disp", "first", "")
	require.Eventually(t, func() bool { return b.StoreMax("disp", 0) == 1 }, 5*time.Second, 5*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := c.pullAsync(ctx, wasmPullHeader("disp", 1, 20*time.Second))
	require.Eventually(t, func() bool { return b.WaitingPulls() == 1 }, 5*time.Second, time.Millisecond)
	calls := m.calls.Load()

	var msgs []*protocol.Message
	for i := range 6 {
		body := fmt.Sprint("skip-", i)
		if i == 4 {
			body = "want-4"
		}
		msgs = append(msgs, &protocol.Message{Topic: "disp", Body: []byte(body)})
	}
	body, err := protocol.EncodeBatch(msgs)
	require.NoError(t, err)
	h := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: "disp", BornTimestamp: time.Now().UnixMilli(), Batch: true}
	resp, err := c.cl.Invoke(ctx, b.Addr(), protocol.NewRequest(protocol.SendBatchMessage, h.EncodeV2(), body))
	require.NoError(t, err)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)

	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, protocol.Success, r.resp.ResponseCode(), r.resp.Remark)
	bodies, next := pulled(t, r.resp)
	assert.Equal(t, []string{"want-4"}, bodies)
	assert.Equal(t, int64(7), next)
	assert.Equal(t, int64(1), m.calls.Load()-calls, "six arrivals, one filter call")
	assert.Equal(t, []int64{1, 2, 3, 4, 5, 6}, m.evaluated())
}

func TestPullWithABadExpressionAnswersSubscriptionParseFailed(t *testing.T) {
	reg := filter.NewRegistry(0)
	reg.Register(filter.TypeSQL92, filter.SQL92(func(expr string) (filter.Selector, error) {
		return nil, fmt.Errorf("unexpected end of expression %q", expr)
	}))
	b := startBroker(t, func(c *broker.Config) { c.Filters = reg })
	c := newRawClient(t, b, nil)
	c.send("bad", "m", "")
	h := pullHeader("bad", 0, 0, "a >")
	h.ExpressionType = filter.TypeSQL92
	resp := c.invoke(context.Background(), protocol.PullMessage, h, nil)
	assert.Equal(t, protocol.SubscriptionParseFailed, resp.ResponseCode())
	assert.Contains(t, resp.Remark, "unexpected end of expression")
}
