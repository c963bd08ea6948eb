package remoting_test

import (
	"context"
	"io"
	"log/slog"
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

func slogTo(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func newClient(t *testing.T, opts remoting.ClientOptions) *remoting.Client {
	if opts.Logger == nil {
		opts.Logger = quietLogger()
	}
	cl := remoting.NewClient(opts)
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

func TestClientReconnects(t *testing.T) {
	checkGoroutines(t)
	ln := mustListen(t)
	addr := ln.Addr().String()
	srv := serveOn(t, ln, newTestHandler(), remoting.ServerOptions{})
	cl := newClient(t, remoting.ClientOptions{})

	resp, err := cl.Invoke(ctxTimeout(t, 3*time.Second), addr, echoRequest("one"))
	require.NoError(t, err)
	assert.Equal(t, "one", string(resp.Body))
	first, err := cl.Conn(ctxTimeout(t, 3*time.Second), addr)
	require.NoError(t, err)

	require.NoError(t, srv.Shutdown(ctxTimeout(t, 3*time.Second)))
	recv(t, first.Done(), "the client to see the server go")

	_, err = cl.Invoke(ctxTimeout(t, 3*time.Second), addr, echoRequest("down"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "dial "+addr)

	ln2, err := net.Listen("tcp", addr)
	require.NoError(t, err, "listen again on the same port")
	serveOn(t, ln2, newTestHandler(), remoting.ServerOptions{})

	resp, err = cl.Invoke(ctxTimeout(t, 3*time.Second), addr, echoRequest("two"))
	require.NoError(t, err)
	assert.Equal(t, "two", string(resp.Body))
	second, err := cl.Conn(ctxTimeout(t, 3*time.Second), addr)
	require.NoError(t, err)
	assert.NotSame(t, first, second)
}

// A call on a connection that is already dead but not yet forgotten redials instead of
// failing: nothing had been sent.
func TestClientRetriesUnsentCall(t *testing.T) {
	checkGoroutines(t)
	srv := startServer(t, newTestHandler(), remoting.ServerOptions{})
	cl := newClient(t, remoting.ClientOptions{})
	c, err := cl.Conn(ctxTimeout(t, 3*time.Second), srv.addr)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	resp, err := cl.Invoke(ctxTimeout(t, 3*time.Second), srv.addr, echoRequest("again"))
	require.NoError(t, err)
	assert.Equal(t, "again", string(resp.Body))
	require.NoError(t, cl.InvokeOneway(ctxTimeout(t, 3*time.Second), srv.addr, echoRequest("oneway")))
}

func TestClientSharesOneConnPerAddress(t *testing.T) {
	checkGoroutines(t)
	var opened atomic.Int32
	srv := startServer(t, newTestHandler(), remoting.ServerOptions{OnConnOpen: func(*remoting.Conn) { opened.Add(1) }})
	closed := make(chan *remoting.Conn, 1)
	cl := newClient(t, remoting.ClientOptions{Serialize: protocol.RocketMQ, OnConnClose: func(c *remoting.Conn) { closed <- c }})

	var wg sync.WaitGroup
	conns := make([]*remoting.Conn, 32)
	for i := range conns {
		wg.Go(func() {
			c, err := cl.Conn(ctxTimeout(t, 3*time.Second), srv.addr)
			if assert.NoError(t, err) {
				conns[i] = c
			}
			resp, err := cl.Invoke(ctxTimeout(t, 3*time.Second), srv.addr, echoRequest(body(i, 0)))
			if assert.NoError(t, err) {
				assert.Equal(t, body(i, 0), string(resp.Body))
				assert.Equal(t, protocol.RocketMQ, resp.Serialize)
			}
		})
	}
	wg.Wait()
	for _, c := range conns {
		assert.Same(t, conns[0], c)
	}
	assert.Equal(t, int32(1), opened.Load())

	require.NoError(t, cl.Close())
	c := recv(t, closed, "OnConnClose")
	require.ErrorIs(t, c.Err(), remoting.ErrClientClosed)
	_, err := cl.Invoke(ctxTimeout(t, 3*time.Second), srv.addr, echoRequest("closed"))
	require.ErrorIs(t, err, remoting.ErrClientClosed)
	require.NoError(t, cl.Close(), "Close twice")
}

func TestClientDialHonoursContext(t *testing.T) {
	checkGoroutines(t)
	cl := newClient(t, remoting.ClientOptions{})
	// Nothing listens on a port just released.
	ln := mustListen(t)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	_, err := cl.Invoke(ctxTimeout(t, 3*time.Second), addr, echoRequest("x"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "dial "+addr)

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = cl.Conn(cancelled, addr)
	require.ErrorIs(t, err, context.Canceled)
}

func TestDialRejectsUnknownSerialize(t *testing.T) {
	_, err := remoting.Dial(context.Background(), "127.0.0.1:1", remoting.ClientOptions{Serialize: 7})
	require.ErrorIs(t, err, protocol.ErrUnknownSerialize)
	cl := remoting.NewClient(remoting.ClientOptions{Serialize: 7})
	defer cl.Close()
	_, err = cl.Invoke(context.Background(), "127.0.0.1:1", echoRequest("x"))
	require.ErrorIs(t, err, protocol.ErrUnknownSerialize)
}
