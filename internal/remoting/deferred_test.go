package remoting_test

import (
	"bytes"
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

const codeDefer protocol.RequestCode = 1020 // deferred: answered later through the handle

// deferHandler defers codeDefer requests and hands their Deferred to deferred; when Defer
// refuses, it answers at once with the remark "not deferred". Everything else is echoed.
type deferHandler struct {
	deferred chan remoting.Deferred
	dropped  atomic.Int64
	// answer makes the Handler return an answer after a successful Defer.
	answer atomic.Bool
}

func newDeferHandler() *deferHandler {
	return &deferHandler{deferred: make(chan remoting.Deferred, 64)}
}

func (h *deferHandler) ServeRemoting(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
	if req.RequestCode() != codeDefer {
		return echo(req)
	}
	d, ok := remoting.Defer(ctx, func() { h.dropped.Add(1) })
	if !ok {
		return protocol.NewResponse(req, protocol.Success, "not deferred")
	}
	if _, again := remoting.Defer(ctx, nil); again {
		panic("a request must not be deferred twice")
	}
	if remoting.RespondWithFiles(ctx, protocol.NewResponse(req, protocol.Success, ""), nil, nil) {
		panic("RespondWithFiles must refuse a deferred request")
	}
	h.deferred <- d
	if h.answer.Load() {
		return protocol.NewResponse(req, protocol.Success, "returned")
	}
	return nil
}

func invokeAsync(t *testing.T, c *remoting.Conn, req *protocol.Command) <-chan *protocol.Command {
	t.Helper()
	got := make(chan *protocol.Command, 1)
	go func() {
		resp, err := c.Invoke(ctxTimeout(t, 10*time.Second), req)
		if assert.NoError(t, err) {
			got <- resp
		}
	}()
	return got
}

// A deferred request is answered once, from another goroutine, after its Handler returned;
// until then it holds a parked slot (not an in-flight one, and no goroutine), which the
// answer gives back.
func TestDeferredRequestIsAnsweredOnceFromAnyGoroutine(t *testing.T) {
	checkGoroutines(t)
	h := newDeferHandler()
	srv := startServer(t, h, remoting.ServerOptions{MaxInFlightPerConn: 1, MaxParkedPerConn: 2})
	c := dial(t, srv.addr, remoting.ClientOptions{})

	first := invokeAsync(t, c, protocol.NewRequest(codeDefer, nil, nil))
	d1 := recv(t, h.deferred, "the first deferred request")
	second := invokeAsync(t, c, protocol.NewRequest(codeDefer, nil, nil))
	d2 := recv(t, h.deferred, "the second deferred request")

	// Both parked slots are taken and the one in-flight slot is free: the connection serves,
	// and a third request cannot be deferred.
	resp := invokeServed(t, c, echoRequest("while deferred"))
	assert.Equal(t, "while deferred", string(resp.Body))
	resp = invokeServed(t, c, protocol.NewRequest(codeDefer, nil, nil))
	assert.Equal(t, "not deferred", resp.Remark)

	// Answered from other goroutines; only the first answer of each counts.
	var wg sync.WaitGroup
	var won atomic.Int64
	for _, d := range []remoting.Deferred{d1, d1, d2} {
		wg.Go(func() {
			r := protocol.NewResponse(&protocol.Command{}, protocol.Success, "later")
			r.Body = []byte("answer")
			if d.Respond(r) {
				won.Add(1)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int64(2), won.Load())
	for _, ch := range []<-chan *protocol.Command{first, second} {
		r := recv(t, ch, "the deferred answer")
		assert.Equal(t, protocol.Success, r.ResponseCode())
		assert.Equal(t, "later", r.Remark)
		assert.Equal(t, "answer", string(r.Body))
	}
	assert.False(t, d1.Respond(protocol.NewResponse(&protocol.Command{}, protocol.Success, "again")))

	// The answers gave their slots back.
	done := invokeAsync(t, c, protocol.NewRequest(codeDefer, nil, nil))
	d3 := recv(t, h.deferred, "a deferred request after the answers")
	require.True(t, d3.Respond(protocol.NewResponse(&protocol.Command{}, protocol.Success, "third")))
	assert.Equal(t, "third", recv(t, done, "the third answer").Remark)
	assert.Zero(t, h.dropped.Load())

	// The zero Deferred and a context from elsewhere defer nothing.
	assert.False(t, remoting.Deferred{}.Respond(protocol.NewResponse(&protocol.Command{}, protocol.Success, "")))
	_, ok := remoting.Defer(context.Background(), nil)
	assert.False(t, ok)
}

// Deferred requests hold no goroutine of the transport while they wait.
func TestDeferredRequestsHoldNoGoroutines(t *testing.T) {
	checkGoroutines(t)
	h := newDeferHandler()
	srv := startServer(t, h, remoting.ServerOptions{})
	c := dial(t, srv.addr, remoting.ClientOptions{})
	requireEcho(t, c, "warm")
	const n = 200
	calls := make(chan *protocol.Command, n)
	var ds []remoting.Deferred
	// Sent in windows below the in-flight bound, with their Invoke goroutines counted apart.
	base := runtime.NumGoroutine()
	for range n {
		go func() {
			resp, err := c.Invoke(ctxTimeout(t, 10*time.Second), protocol.NewRequest(codeDefer, nil, nil))
			if assert.NoError(t, err) {
				calls <- resp
			}
		}()
		ds = append(ds, recv(t, h.deferred, "a deferred request"))
	}
	// n client goroutines waiting in Invoke; the server side adds a bounded few (kept
	// workers, the flusher), not one per deferred request.
	grown := runtime.NumGoroutine() - base - n
	assert.Less(t, grown, 40, "goroutines beyond the waiting callers, with %d deferred requests", n)
	for _, d := range ds {
		require.True(t, d.Respond(protocol.NewResponse(&protocol.Command{}, protocol.Success, "done")))
	}
	for range n {
		assert.Equal(t, "done", recv(t, calls, "an answer").Remark)
	}
}

// A connection that closes before its deferred requests are answered drops them: their
// owners are told, later answers are refused (and release their regions), and the server
// shuts down without waiting for them.
func TestDeferredRequestsAreDroppedWhenTheConnectionCloses(t *testing.T) {
	checkGoroutines(t)
	h := newDeferHandler()
	srv := startServer(t, h, remoting.ServerOptions{})
	c := dial(t, srv.addr, remoting.ClientOptions{})
	for range 3 {
		go func() { _, _ = c.Invoke(ctxTimeout(t, 10*time.Second), protocol.NewRequest(codeDefer, nil, nil)) }()
	}
	ds := []remoting.Deferred{recv(t, h.deferred, "deferred"), recv(t, h.deferred, "deferred"), recv(t, h.deferred, "deferred")}
	require.NoError(t, c.Close())
	require.Eventually(t, func() bool { return h.dropped.Load() == 3 }, 5*time.Second, time.Millisecond, "the close drops the deferred requests")
	assert.NotNil(t, ds[0].Context().Err(), "the deferred request's context ends with its connection")
	assert.False(t, ds[0].Respond(protocol.NewResponse(&protocol.Command{}, protocol.Success, "")))
	released := 0
	assert.False(t, ds[1].RespondFiles(protocol.NewResponse(&protocol.Command{}, protocol.Success, ""),
		[]remoting.FileRegion{{File: bytes.NewReader([]byte("abc")), Length: 3}}, func() { released++ }))
	assert.Equal(t, 1, released, "a refused file answer releases its regions")
	require.Eventually(t, func() bool { return srv.ConnCount() == 0 }, 5*time.Second, time.Millisecond)
}

// A deferred request keeps its connection open through a graceful shutdown until it is
// answered, as a Handler still running does; a Handler that deferred and still returns a
// response answers with it.
func TestShutdownWaitsForDeferredAnswers(t *testing.T) {
	checkGoroutines(t)
	h := newDeferHandler()
	srv := startServer(t, h, remoting.ServerOptions{})
	c := dial(t, srv.addr, remoting.ClientOptions{})
	got := invokeAsync(t, c, protocol.NewRequest(codeDefer, nil, nil))
	d := recv(t, h.deferred, "deferred")
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(ctxTimeout(t, 10*time.Second)) }()
	require.True(t, d.Respond(protocol.NewResponse(&protocol.Command{}, protocol.Success, "before the close")))
	assert.Equal(t, "before the close", recv(t, got, "the answer").Remark)
	require.NoError(t, recv(t, shut, "Shutdown"))
	assert.Zero(t, h.dropped.Load())
}

func TestDeferredHandlerMayStillReturnItsAnswer(t *testing.T) {
	checkGoroutines(t)
	h := newDeferHandler()
	h.answer.Store(true)
	srv := startServer(t, h, remoting.ServerOptions{MaxParkedPerConn: 1})
	c := dial(t, srv.addr, remoting.ClientOptions{})
	resp, err := c.Invoke(ctxTimeout(t, 5*time.Second), protocol.NewRequest(codeDefer, nil, nil))
	require.NoError(t, err)
	assert.Equal(t, "returned", resp.Remark)
	d := recv(t, h.deferred, "deferred")
	assert.False(t, d.Respond(protocol.NewResponse(&protocol.Command{}, protocol.Success, "late")))
	// Its parked slot is free again.
	h.answer.Store(false)
	got := invokeAsync(t, c, protocol.NewRequest(codeDefer, nil, nil))
	require.True(t, recv(t, h.deferred, "deferred again").Respond(protocol.NewResponse(&protocol.Command{}, protocol.Success, "ok")))
	assert.Equal(t, "ok", recv(t, got, "the answer").Remark)
}
