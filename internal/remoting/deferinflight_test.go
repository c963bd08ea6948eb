package remoting_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

const codeDeferInFlight protocol.RequestCode = 1021 // served inline, answered later

// inFlightHandler serves codeDeferInFlight inline and defers it with DeferInFlight, handing
// the Deferred (and the request's body) to deferred; when DeferInFlight refuses, it answers
// at once with the remark "not deferred". Everything else is echoed on its own goroutine.
type inFlightHandler struct {
	deferred chan inFlightReq
	dropped  atomic.Int64
	inline   atomic.Int64 // requests of the code served inline
}

type inFlightReq struct {
	d    remoting.Deferred
	body string
}

func (h *inFlightHandler) Inline(req *protocol.Command) bool {
	return req.RequestCode() == codeDeferInFlight
}

func (h *inFlightHandler) ServeRemoting(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
	if req.RequestCode() != codeDeferInFlight {
		return echo(req)
	}
	h.inline.Add(1)
	if _, parked := remoting.Defer(ctx, nil); parked {
		panic("an inline request must not park")
	}
	d, ok := remoting.DeferInFlight(ctx, func() { h.dropped.Add(1) })
	if !ok {
		return protocol.NewResponse(req, protocol.Success, "not deferred")
	}
	if _, again := remoting.DeferInFlight(ctx, nil); again {
		panic("a request must not be deferred twice")
	}
	if _, parked := remoting.Defer(ctx, nil); parked {
		panic("a request deferred in flight must not park")
	}
	h.deferred <- inFlightReq{d, string(req.Body)}
	return nil
}

// Requests deferred with DeferInFlight on the read goroutine do not stop it: every request
// of a pipelined burst reaches the Handler before any is answered; they are answered in any
// order, each to its caller; and until answered they hold in-flight slots, so the request
// past MaxInFlightPerConn is refused SYSTEM_BUSY. Answers give the slots back.
func TestDeferInFlightKeepsReadingAndBoundsWaits(t *testing.T) {
	checkGoroutines(t)
	const bound = 8
	h := &inFlightHandler{deferred: make(chan inFlightReq, 64)}
	srv := startServer(t, h, remoting.ServerOptions{MaxInFlightPerConn: bound})
	c := dial(t, srv.addr, remoting.ClientOptions{})

	answers := make([]<-chan *protocol.Command, bound)
	for i := range answers {
		req := protocol.NewRequest(codeDeferInFlight, nil, []byte(body(0, i)))
		answers[i] = invokeAsync(t, c, req)
	}
	got := map[string]remoting.Deferred{}
	for range bound {
		r := recv(t, h.deferred, "a deferred request")
		got[r.body] = r.d
	}
	assert.Equal(t, int64(bound), h.inline.Load(), "served inline")

	// Every in-flight slot is held by a waiting answer: one more request is refused, as it
	// would be with that many Handlers blocked.
	resp, err := c.Invoke(ctxTimeout(t, 5*time.Second), echoRequest("over the bound"))
	require.NoError(t, err)
	assert.Equal(t, protocol.SystemBusy, resp.ResponseCode(), resp.Remark)

	// Answered last to first, from another goroutine.
	var wg sync.WaitGroup
	for i := bound - 1; i >= 0; i-- {
		d := got[body(0, i)]
		wg.Go(func() {
			assert.True(t, d.Respond(protocol.NewResponse(&protocol.Command{}, protocol.Success, body(0, i))))
			assert.False(t, d.Respond(protocol.NewResponse(&protocol.Command{}, protocol.Success, "again")))
		})
		wg.Wait()
	}
	for i, ch := range answers {
		assert.Equal(t, body(0, i), recv(t, ch, "an answer").Remark)
	}
	// The slots are free again.
	requireEcho(t, c, "after the answers")
	assert.Zero(t, h.dropped.Load())

	// A context from elsewhere cannot be deferred.
	_, ok := remoting.DeferInFlight(context.Background(), nil)
	assert.False(t, ok)
}

// Answering deferred requests never waits for the peer: a peer that sends requests and
// never reads their answers fills its socket buffers, and Respond, called on one goroutine
// as a group commit calls it, still returns for every request (the answers are queued for
// the connection's writer). The writer's timeout then closes the connection, and the
// requests not yet answered are dropped.
func TestDeferInFlightRespondDoesNotBlockOnAPeerThatDoesNotRead(t *testing.T) {
	checkGoroutines(t)
	const n = 64
	h := &inFlightHandler{deferred: make(chan inFlightReq, n)}
	srv := startServer(t, h, remoting.ServerOptions{WriteTimeout: 300 * time.Millisecond})

	nc, err := net.Dial("tcp", srv.addr)
	require.NoError(t, err)
	defer nc.Close()
	var frames []byte
	for i := range n {
		req := protocol.NewRequest(codeDeferInFlight, nil, []byte(body(1, i)))
		req.Opaque = int32(i + 1)
		frames = append(frames, encode(t, req)...)
	}
	_, err = nc.Write(frames)
	require.NoError(t, err)

	ds := make([]remoting.Deferred, 0, n)
	for range n {
		ds = append(ds, recv(t, h.deferred, "a deferred request").d)
	}
	// 1 MiB answers: far more than the socket buffers of a peer that reads nothing.
	big := make([]byte, 1<<20)
	responded := make(chan int, 1)
	go func() {
		ok := 0
		for _, d := range ds {
			r := protocol.NewResponse(&protocol.Command{}, protocol.Success, "")
			r.Body = big
			if d.Respond(r) {
				ok++
			}
		}
		responded <- ok
	}()
	select {
	case ok := <-responded:
		t.Logf("%d of %d answers queued before the write timeout closed the connection", ok, n)
	case <-time.After(20 * time.Second):
		t.Fatal("Respond blocked on a peer that does not read")
	}
	// The stalled write closes the connection; answers not queued by then were dropped.
	require.Eventually(t, func() bool { return srv.ConnCount() == 0 }, 10*time.Second, time.Millisecond)
}

// A connection that closes while requests deferred in flight wait drops them: their owners
// are told, later answers are refused, and the server shuts down without waiting.
func TestDeferInFlightDroppedWhenTheConnectionCloses(t *testing.T) {
	checkGoroutines(t)
	h := &inFlightHandler{deferred: make(chan inFlightReq, 8)}
	srv := startServer(t, h, remoting.ServerOptions{MaxInFlightPerConn: 3})
	c := dial(t, srv.addr, remoting.ClientOptions{})
	for i := range 3 {
		go func() {
			_, _ = c.Invoke(ctxTimeout(t, 10*time.Second), protocol.NewRequest(codeDeferInFlight, nil, []byte(body(2, i))))
		}()
	}
	var ds []remoting.Deferred
	for range 3 {
		ds = append(ds, recv(t, h.deferred, "deferred").d)
	}
	require.NoError(t, c.Close())
	require.Eventually(t, func() bool { return h.dropped.Load() == 3 }, 5*time.Second, time.Millisecond)
	for _, d := range ds {
		assert.False(t, d.Respond(protocol.NewResponse(&protocol.Command{}, protocol.Success, "")))
	}
	require.Eventually(t, func() bool { return srv.ConnCount() == 0 }, 5*time.Second, time.Millisecond)

	// A graceful shutdown waits for an answer still due on an open connection.
	c2 := dial(t, srv.addr, remoting.ClientOptions{})
	got := invokeAsync(t, c2, protocol.NewRequest(codeDeferInFlight, nil, []byte("last")))
	d := recv(t, h.deferred, "deferred").d
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(ctxTimeout(t, 10*time.Second)) }()
	require.True(t, d.Respond(protocol.NewResponse(&protocol.Command{}, protocol.Success, "before the close")))
	assert.Equal(t, "before the close", recv(t, got, "the answer").Remark)
	require.NoError(t, recv(t, shut, "Shutdown"))
}
