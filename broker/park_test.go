package broker_test

import (
	"bytes"
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

// parkPulls sends a suspended pull for each of queues [0, n) of topic on c, in windows below
// the connection's in-flight bound, and waits until total pulls wait on the broker.
func parkPulls(t *testing.T, br *testBroker, c *rawConn, topic string, n int, suspend time.Duration, total int) {
	t.Helper()
	for q0 := 0; q0 < n; q0 += 128 {
		for q := q0; q < min(q0+128, n); q++ {
			h := pullHeader(topic, 0, suspend, "*")
			h.QueueID = int32(q)
			c.write(t, protocol.PullMessage, h, nil)
		}
		want := int64(total - n + min(q0+128, n))
		require.Eventually(t, func() bool { return br.WaitingPulls() == want }, 10*time.Second, time.Millisecond)
	}
}

// A parked pull is a waiter in the long-poll table answered through its request's
// remoting.Deferred: with hundreds parked, the broker runs no goroutine for them. Closing the
// connection drops them.
func TestParkedPullsHoldNoGoroutines(t *testing.T) {
	br := startBroker(t, nil)
	const conns, queues = 2, 200
	createTopic(t, br, "idle", queues)
	cs := make([]*rawConn, conns)
	for i := range cs {
		cs[i] = dialRaw(t, br.Addr())
		cs[i].write(t, protocol.GetRouteInfoByTopic, &protocol.GetRouteInfoRequestHeader{Topic: "idle"}, nil)
		cs[i].read(t)
	}
	base := runtime.NumGoroutine()
	for i, c := range cs {
		parkPulls(t, br, c, "idle", queues, 30*time.Second, (i+1)*queues)
	}
	// A connection keeps a few request goroutines for its next requests (at most 16) and a
	// flusher; nothing grows with the parked pulls.
	grown := runtime.NumGoroutine() - base
	assert.Less(t, grown, conns*20, "goroutines added by %d parked pulls", conns*queues)

	// A message still wakes its queue's pulls (one per connection), answered on their
	// connections.
	c := newRawClientB(t, br)
	c.sendTo("idle", 7, []byte("wake"))
	for _, conn := range cs {
		resp := conn.read(t)
		require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
		assert.Equal(t, int32(1+1+7), resp.Opaque, "the pull of queue 7 (after the route query)")
		msgs, err := protocol.DecodeStoredAll(resp.Body)
		require.NoError(t, err)
		require.Len(t, msgs, 1)
		assert.Equal(t, "wake", string(msgs[0].Body))
	}
	require.Eventually(t, func() bool { return br.WaitingPulls() == conns*(queues-1) }, 5*time.Second, time.Millisecond)

	// Closing a connection drops its parked pulls, without answering them.
	require.NoError(t, cs[0].nc.Close())
	require.Eventually(t, func() bool { return br.WaitingPulls() == queues-1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, cs[1].nc.Close())
	require.Eventually(t, func() bool { return br.WaitingPulls() == 0 }, 5*time.Second, time.Millisecond)
	c.sendTo("idle", 8, []byte("nobody waits"))
}

// Each parked pull answers PULL_NOT_FOUND at its own suspend time, whatever the others'.
func TestParkedPullsTimeOutEachAtItsOwnDeadline(t *testing.T) {
	br := startBroker(t, nil)
	createTopic(t, br, "deadline", 3)
	c := dialRaw(t, br.Addr())
	suspends := []time.Duration{30 * time.Second, 300 * time.Millisecond, 100 * time.Millisecond}
	for q, s := range suspends {
		h := pullHeader("deadline", 0, s, "*")
		h.QueueID = int32(q)
		c.write(t, protocol.PullMessage, h, nil)
	}
	require.Eventually(t, func() bool { return br.WaitingPulls() == 3 }, 5*time.Second, time.Millisecond)
	answered := map[int32]bool{}
	for range 2 {
		resp := c.read(t)
		assert.Equal(t, protocol.PullNotFound, resp.ResponseCode())
		answered[resp.Opaque] = true
	}
	assert.Equal(t, map[int32]bool{2: true, 3: true}, answered, "the two short pulls answered (opaques 2 and 3)")
	assert.Equal(t, int64(1), br.WaitingPulls(), "the 30 s pull is still parked")

	// And the long one still answers for a message.
	newRawClientB(t, br).sendTo("deadline", 0, []byte("late"))
	resp := c.read(t)
	assert.Equal(t, int32(1), resp.Opaque)
	assert.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
}

// A woken pull is answered from the commit-log files through its deferred answer: small
// messages copied into the write buffer, large ones with sendfile; and a copying broker
// answers the same bytes.
func TestWokenPullsAnswerFromTheFiles(t *testing.T) {
	for _, copying := range []bool{false, true} {
		br := startBroker(t, func(c *broker.Config) { c.DisableZeroCopy = copying })
		createTopic(t, br, "files", 1)
		conn := dialRaw(t, br.Addr())
		c := newRawClientB(t, br)
		for i, size := range []int{100, 64 << 10} {
			body := bytes.Repeat([]byte{byte('a' + i)}, size)
			conn.write(t, protocol.PullMessage, pullHeader("files", int64(i), 30*time.Second, "*"), nil)
			require.Eventually(t, func() bool { return br.WaitingPulls() == 1 }, 5*time.Second, time.Millisecond)
			c.sendTo("files", 0, body)
			resp := conn.read(t)
			require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
			msgs, err := protocol.DecodeStoredAll(resp.Body)
			require.NoError(t, err)
			require.Len(t, msgs, 1)
			assert.Equal(t, body, msgs[0].Body, "copying=%v size=%d", copying, size)
			var rh protocol.PullMessageResponseHeader
			require.NoError(t, resp.DecodeHeader(&rh))
			assert.Equal(t, int64(i+1), rh.NextBeginOffset)
		}
	}
}

// Shutdown answers the parked pulls (PULL_NOT_FOUND: nothing arrived) before it closes their
// connections.
func TestShutdownAnswersParkedPulls(t *testing.T) {
	br := startBroker(t, nil)
	createTopic(t, br, "bye", 4)
	c := dialRaw(t, br.Addr())
	parkPulls(t, br, c, "bye", 4, 30*time.Second, 4)
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		shut <- br.Shutdown(ctx)
	}()
	for range 4 {
		resp := c.read(t)
		assert.Equal(t, protocol.PullNotFound, resp.ResponseCode(), resp.Remark)
	}
	require.NoError(t, <-shut)
	assert.Zero(t, br.WaitingPulls())
}

// panicObserver panics when told of a parked pull's latency, once armed.
type panicObserver struct{ armed atomic.Bool }

func (o *panicObserver) MessagesIn(string, int, int)  {}
func (o *panicObserver) MessagesOut(string, int, int) {}
func (o *panicObserver) PullLatency(_ time.Duration, parked bool) {
	if parked && o.armed.Load() {
		panic("observer bug")
	}
}

// A panic while a woken pull is served (here in the Observer, after the answer) is
// recovered on the runner, as the transport recovers a Handler's: the broker goes on serving,
// and the pull leaves the long-poll table.
func TestAPanicInAWokenPullIsRecovered(t *testing.T) {
	o := &panicObserver{}
	br := startBroker(t, func(c *broker.Config) { c.Observer = o })
	c := newRawClient(t, br, nil)
	c.send("boom", "first", "")
	require.Eventually(t, func() bool { return br.StoreMax("boom", 0) == 1 }, 5*time.Second, 5*time.Millisecond)
	o.armed.Store(true)
	done := c.pullAsync(context.Background(), pullHeader("boom", 1, 20*time.Second, "*"))
	require.Eventually(t, func() bool { return br.WaitingPulls() == 1 }, 5*time.Second, time.Millisecond)
	c.send("boom", "second", "")
	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, protocol.Success, r.resp.ResponseCode(), r.resp.Remark)
	assert.Zero(t, br.WaitingPulls())
	resp := c.invoke(context.Background(), protocol.PullMessage, pullHeader("boom", 0, 0, "*"), nil)
	assert.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
}
