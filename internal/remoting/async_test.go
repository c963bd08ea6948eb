package remoting_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

type asyncResult struct {
	resp *protocol.Command
	err  error
}

// Many InvokeAsync calls made by one goroutine, without waiting, each get their own answer,
// and every callback runs once.
func TestInvokeAsyncAnswersEachRequest(t *testing.T) {
	checkGoroutines(t)
	srv := startServer(t, newTestHandler(), remoting.ServerOptions{Logger: quietLogger(), MaxInFlightPerConn: 1024})
	for _, st := range []protocol.SerializeType{protocol.JSON, protocol.RocketMQ} {
		c := dial(t, srv.addr, remoting.ClientOptions{Logger: quietLogger(), Serialize: st})
		const n = 500
		results := make([]chan asyncResult, n)
		for i := range n {
			results[i] = make(chan asyncResult, 2)
			err := c.InvokeAsync(context.Background(), echoRequest(body(0, i)), 10*time.Second, func(resp *protocol.Command, err error) {
				results[i] <- asyncResult{resp, err}
			})
			require.NoError(t, err)
		}
		for i := range n {
			r := recv(t, results[i], "an answer")
			require.NoError(t, r.err)
			assert.Equal(t, body(0, i), r.resp.ExtFields["k"])
			assert.Equal(t, st.String(), r.resp.ExtFields["serialize"])
			assert.Equal(t, []byte(body(0, i)), r.resp.Body)
			assert.Empty(t, results[i], "callback called twice")
		}
	}
}

// The call's timeout, its context and the connection's close each end a call whose answer
// has not come, with an error saying which; an answer arriving afterwards is dropped.
func TestInvokeAsyncEnds(t *testing.T) {
	checkGoroutines(t)
	h := newTestHandler()
	srv := startServer(t, h, remoting.ServerOptions{Logger: quietLogger()})
	c := dial(t, srv.addr, remoting.ClientOptions{Logger: quietLogger()})
	block := func() *protocol.Command { return protocol.NewRequest(codeBlock, nil, nil) }
	invoke := func(ctx context.Context, timeout time.Duration) chan asyncResult {
		ch := make(chan asyncResult, 2)
		require.NoError(t, c.InvokeAsync(ctx, block(), timeout, func(resp *protocol.Command, err error) { ch <- asyncResult{resp, err} }))
		recv(t, h.entered, "the request to reach the handler")
		return ch
	}

	timedOut := invoke(context.Background(), 20*time.Millisecond)
	r := recv(t, timedOut, "the timeout")
	require.ErrorIs(t, r.err, context.DeadlineExceeded)
	require.Nil(t, r.resp)

	ctx, cancel := context.WithCancel(context.Background())
	cancelled := invoke(ctx, time.Hour)
	cancel()
	r = recv(t, cancelled, "the cancellation")
	require.ErrorIs(t, r.err, context.Canceled)

	h.release <- struct{}{} // the two answers come now, and nobody waits for them
	h.release <- struct{}{}
	requireEcho(t, c, "still usable")
	assert.Empty(t, timedOut)
	assert.Empty(t, cancelled)

	closed := invoke(context.Background(), time.Hour)
	require.NoError(t, c.Close())
	r = recv(t, closed, "the close")
	require.ErrorIs(t, r.err, remoting.ErrConnClosed)

	err := c.InvokeAsync(context.Background(), echoRequest("late"), time.Second, func(*protocol.Command, error) {
		t.Error("done called for a call refused at once")
	})
	require.ErrorIs(t, err, remoting.ErrConnClosed)
}

// A callback may send again from the read goroutine it runs on.
func TestInvokeAsyncFromCallback(t *testing.T) {
	checkGoroutines(t)
	srv := startServer(t, newTestHandler(), remoting.ServerOptions{Logger: quietLogger()})
	c := newClient(t, remoting.ClientOptions{Logger: quietLogger()})
	const n = 200
	finished := make(chan error, 1)
	var mu sync.Mutex
	got := 0
	var next func(resp *protocol.Command, err error)
	next = func(resp *protocol.Command, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			finished <- err
			return
		}
		if resp != nil {
			got++
		}
		if got == n {
			finished <- nil
			return
		}
		if err := c.InvokeAsync(context.Background(), srv.addr, echoRequest(body(1, got)), 10*time.Second, next); err != nil {
			finished <- err
		}
	}
	next(nil, nil)
	require.NoError(t, recv(t, finished, "the chain of calls"))
}

// rawReceiver is an AsyncReceiver that passes the outcome on: a copy of the response, which
// is the receiver's only until InvokeDone returns (the connection decodes the next one into
// it).
type rawReceiver chan asyncResult

func (r rawReceiver) InvokeDone(resp *protocol.Command, err error) {
	if resp != nil {
		c := *resp
		resp = &c
	}
	r <- asyncResult{resp, err}
}

// InvokeAsyncRaw hands over the fields of a binary answer as they came, without the map, and
// those of a JSON answer in its map; Invoke and InvokeAsync on the same connection get the
// map either way.
func TestInvokeAsyncRawLeavesBinaryFieldsRaw(t *testing.T) {
	checkGoroutines(t)
	srv := startServer(t, newTestHandler(), remoting.ServerOptions{Logger: quietLogger()})
	for _, st := range []protocol.SerializeType{protocol.JSON, protocol.RocketMQ} {
		c := dial(t, srv.addr, remoting.ClientOptions{Logger: quietLogger(), Serialize: st})
		r := make(rawReceiver, 2)
		require.NoError(t, c.InvokeAsyncRaw(context.Background(), echoRequest("raw"), 10*time.Second, r))
		got := recv(t, r, "the answer")
		first := got
		require.NoError(t, got.err)
		assert.Equal(t, "raw", got.resp.Ext("k"), st)
		assert.Equal(t, st.String(), got.resp.Ext("serialize"))
		assert.Equal(t, []byte("raw"), got.resp.Body)
		if st == protocol.RocketMQ {
			assert.Nil(t, got.resp.ExtFields, "no map for a binary answer")
			assert.NotEmpty(t, got.resp.RawExt)
		} else {
			assert.Equal(t, "raw", got.resp.ExtFields["k"])
		}

		done := make(chan asyncResult, 1)
		require.NoError(t, c.InvokeAsync(context.Background(), echoRequest("map"), 10*time.Second, func(resp *protocol.Command, err error) {
			done <- asyncResult{resp, err}
		}))
		got = recv(t, done, "the answer")
		require.NoError(t, got.err)
		assert.Equal(t, "map", got.resp.ExtFields["k"], st)

		resp, err := c.Invoke(ctxTimeout(t, 10*time.Second), echoRequest("sync"))
		require.NoError(t, err)
		assert.Equal(t, "sync", resp.ExtFields["k"], st)
		assert.Empty(t, r, "receiver called twice")

		// The next raw answer may be decoded into the Command the first one came in: what
		// the receiver kept of the first (its strings, its body) is unchanged.
		require.NoError(t, c.InvokeAsyncRaw(context.Background(), echoRequest("raw2"), 10*time.Second, r))
		second := recv(t, r, "the second answer")
		require.NoError(t, second.err)
		assert.Equal(t, "raw2", second.resp.Ext("k"), st)
		assert.Equal(t, []byte("raw2"), second.resp.Body)
		assert.Equal(t, "raw", first.resp.Ext("k"), st)
		assert.Equal(t, []byte("raw"), first.resp.Body)
	}
}

// Calls made with many timeouts (more than a connection keeps a shared timer for) each end
// with a deadline error once their own timeout has passed, not before; the connection then
// serves on.
func TestInvokeAsyncDeadlinesOfManyTimeouts(t *testing.T) {
	checkGoroutines(t)
	h := newTestHandler()
	srv := startServer(t, h, remoting.ServerOptions{Logger: quietLogger()})
	c := dial(t, srv.addr, remoting.ClientOptions{Logger: quietLogger()})
	ms := time.Millisecond
	timeouts := []time.Duration{60 * ms, 20 * ms, 100 * ms, 40 * ms, 80 * ms, 120 * ms, 20 * ms, 60 * ms, 140 * ms}
	start := time.Now()
	results := make([]rawReceiver, len(timeouts))
	for i, d := range timeouts {
		results[i] = make(rawReceiver, 2)
		require.NoError(t, c.InvokeAsyncRaw(context.Background(), protocol.NewRequest(codeBlock, nil, nil), d, results[i]))
	}
	for range timeouts {
		recv(t, h.entered, "the request to reach the handler")
	}
	for i, d := range timeouts {
		r := recv(t, results[i], "the deadline")
		require.ErrorIs(t, r.err, context.DeadlineExceeded, "call %d", i)
		assert.GreaterOrEqual(t, time.Since(start), d, "call %d ended before its timeout", i)
	}
	for range timeouts {
		h.release <- struct{}{} // the late answers are dropped
	}
	requireEcho(t, c, "still usable")
	for i := range results {
		assert.Empty(t, results[i], "call %d ended twice", i)
	}
}
