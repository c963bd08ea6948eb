package remoting_test

import (
	"bufio"
	"context"
	"errors"
	"io"
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

func TestRoundTrip(t *testing.T) {
	for _, st := range []protocol.SerializeType{protocol.JSON, protocol.RocketMQ} {
		t.Run(st.String(), func(t *testing.T) {
			checkGoroutines(t)
			srv := startServer(t, newTestHandler(), remoting.ServerOptions{})
			c := dial(t, srv.addr, remoting.ClientOptions{Serialize: st})

			for i := range 3 {
				req := protocol.NewRequest(codeEcho, map[string]string{"k": "v", "topic": "T"}, []byte("hello"))
				resp, err := c.Invoke(ctxTimeout(t, 3*time.Second), req)
				require.NoError(t, err)
				assert.Equal(t, int32(i+1), req.Opaque, "a fresh opaque per call")
				assert.Equal(t, req.Opaque, resp.Opaque)
				assert.True(t, resp.IsResponse())
				assert.Equal(t, protocol.Success, resp.ResponseCode())
				assert.Equal(t, "ok", resp.Remark)
				assert.Equal(t, "hello", string(resp.Body))
				assert.Equal(t, "v", resp.ExtFields["k"])
				assert.Equal(t, st.String(), resp.ExtFields["serialize"], "the server saw the request's encoding")
				assert.Equal(t, st, resp.Serialize, "the response comes back in the request's encoding")
			}
		})
	}
}

func TestNilHandler(t *testing.T) {
	checkGoroutines(t)
	srv := startServer(t, nil, remoting.ServerOptions{})
	c := dial(t, srv.addr, remoting.ClientOptions{})
	resp, err := c.Invoke(ctxTimeout(t, 3*time.Second), echoRequest("x"))
	require.NoError(t, err)
	assert.Equal(t, protocol.RequestCodeNotSupported, resp.ResponseCode())
}

// A slow request does not hold up the next one on the same connection.
func TestPipelining(t *testing.T) {
	checkGoroutines(t)
	h := newTestHandler()
	srv := startServer(t, h, remoting.ServerOptions{})
	c := dial(t, srv.addr, remoting.ClientOptions{})

	type result struct {
		resp *protocol.Command
		err  error
	}
	slow := make(chan result, 1)
	slowReq := protocol.NewRequest(codeBlock, nil, []byte("slow"))
	go func() {
		resp, err := c.Invoke(ctxTimeout(t, 5*time.Second), slowReq)
		slow <- result{resp, err}
	}()
	recv(t, h.entered, "the slow request")

	fastReq := echoRequest("fast")
	resp, err := c.Invoke(ctxTimeout(t, 2*time.Second), fastReq)
	require.NoError(t, err)
	assert.Equal(t, "fast", string(resp.Body))
	assert.Equal(t, fastReq.Opaque, resp.Opaque)
	select {
	case <-slow:
		t.Fatal("the slow request finished before it was released")
	default:
	}

	close(h.release)
	r := recv(t, slow, "the slow response")
	require.NoError(t, r.err)
	assert.Equal(t, "slow", string(r.resp.Body))
	assert.Equal(t, slowReq.Opaque, r.resp.Opaque)
	assert.NotEqual(t, slowReq.Opaque, fastReq.Opaque)
}

// Many goroutines share one connection; a handler that answers out of order makes sure that
// responses are matched by opaque.
func TestConcurrentInvokes(t *testing.T) {
	checkGoroutines(t)
	h := remoting.HandlerFunc(func(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
		time.Sleep(time.Duration(req.Opaque%4) * 100 * time.Microsecond)
		return echo(req)
	})
	srv := startServer(t, h, remoting.ServerOptions{})
	for _, st := range []protocol.SerializeType{protocol.JSON, protocol.RocketMQ} {
		c := dial(t, srv.addr, remoting.ClientOptions{Serialize: st})
		const goroutines, calls = 16, 100
		var wg sync.WaitGroup
		for i := range goroutines {
			wg.Go(func() {
				for j := range calls {
					resp, err := c.Invoke(ctxTimeout(t, 5*time.Second), echoRequest(body(i, j)))
					if !assert.NoError(t, err) {
						return
					}
					assert.Equal(t, body(i, j), string(resp.Body))
					assert.Equal(t, body(i, j), resp.ExtFields["k"])
				}
			})
		}
		wg.Wait()
	}
}

func TestInFlightBound(t *testing.T) {
	checkGoroutines(t)
	h := newTestHandler()
	srv := startServer(t, h, remoting.ServerOptions{MaxInFlightPerConn: 2})
	c := dial(t, srv.addr, remoting.ClientOptions{})

	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			resp, err := c.Invoke(ctxTimeout(t, 5*time.Second), protocol.NewRequest(codeBlock, nil, nil))
			if assert.NoError(t, err) {
				assert.Equal(t, protocol.Success, resp.ResponseCode())
			}
		})
	}
	recv(t, h.entered, "blocked request 1")
	recv(t, h.entered, "blocked request 2")

	// Refused at once: the two blocked requests hold their slots until released.
	resp, err := c.Invoke(ctxTimeout(t, 3*time.Second), protocol.NewRequest(codeBlock, nil, nil))
	require.NoError(t, err)
	assert.Equal(t, protocol.SystemBusy, resp.ResponseCode())
	assert.Equal(t, "too many requests in flight on this connection", resp.Remark)
	assert.Empty(t, h.entered, "the handler did not run for the refused request")

	close(h.release)
	wg.Wait()
	// A slot is freed just after its response is written, so the client may read the
	// response first: the next request may still be refused for a moment.
	resp = invokeServed(t, c, echoRequest("after"))
	assert.Equal(t, protocol.Success, resp.ResponseCode())
	assert.Equal(t, "after", string(resp.Body))
}

func TestHandlerPanic(t *testing.T) {
	checkGoroutines(t)
	srv := startServer(t, newTestHandler(), remoting.ServerOptions{})
	c := dial(t, srv.addr, remoting.ClientOptions{})
	resp, err := c.Invoke(ctxTimeout(t, 3*time.Second), protocol.NewRequest(codePanic, nil, nil))
	require.NoError(t, err)
	assert.Equal(t, protocol.SystemError, resp.ResponseCode())
	assert.Contains(t, resp.Remark, "boom")
	requireEcho(t, c, "still here")
}

func TestResponseTooLarge(t *testing.T) {
	checkGoroutines(t)
	srv := startServer(t, newTestHandler(), remoting.ServerOptions{})
	c := dial(t, srv.addr, remoting.ClientOptions{})
	resp, err := c.Invoke(ctxTimeout(t, 5*time.Second), protocol.NewRequest(codeHuge, nil, nil))
	require.NoError(t, err)
	assert.Equal(t, protocol.SystemError, resp.ResponseCode())
	assert.Contains(t, resp.Remark, protocol.ErrFrameTooLarge.Error())
	requireEcho(t, c, "still here")
}

// A broken frame (its length prefix or header length out of range, or cut short) closes its
// connection, and only that one. A frame that is whole but whose header cannot be read does
// not: see TestMalformedHeaderKeepsTheConnection.
func TestBrokenFrames(t *testing.T) {
	checkGoroutines(t)
	closed := make(chan error, 16)
	logs := &syncBuffer{}
	srv := startServer(t, newTestHandler(), remoting.ServerOptions{
		MaxFrameSize: 1 << 20,
		Logger:       slogTo(logs),
		OnConnClose:  func(c *remoting.Conn) { closed <- c.Err() },
	})
	good := dial(t, srv.addr, remoting.ClientOptions{})
	requireEcho(t, good, "before")

	cases := []struct {
		name      string
		input     []byte
		closeSend bool
		want      error
	}{
		{"http request", []byte("GET / HTTP/1.1\r\nHost: flowd\r\n\r\n"), false, protocol.ErrFrameTooLarge},
		{"oversize length", rawFrame(protocol.MaxFrameSize+1, 0, "x"), false, protocol.ErrFrameTooLarge},
		{"over MaxFrameSize option", rawFrame(2<<20, 0, "x"), false, protocol.ErrFrameTooLarge},
		{"negative length", rawFrame(0xFFFFFFFF, 0, ""), false, protocol.ErrMalformedFrame},
		{"length shorter than header mark", rawFrame(2, 0, ""), false, protocol.ErrMalformedFrame},
		{"header longer than frame", rawFrame(8, 0xFF, "abcd"), false, protocol.ErrMalformedFrame},
		{"truncated frame", rawFrame(100, 0, "0123456789"), true, io.ErrUnexpectedEOF},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nc, err := net.Dial("tcp", srv.addr)
			require.NoError(t, err)
			defer nc.Close()
			_, err = nc.Write(tc.input)
			require.NoError(t, err)
			if tc.closeSend {
				require.NoError(t, nc.(*net.TCPConn).CloseWrite())
			}

			require.NoError(t, nc.SetReadDeadline(time.Now().Add(3*time.Second)))
			_, err = io.Copy(io.Discard, nc)
			var ne net.Error
			require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server did not close the connection")

			cause := recv(t, closed, "OnConnClose")
			require.ErrorIs(t, cause, remoting.ErrConnClosed)
			require.ErrorIs(t, cause, tc.want)
			assert.Contains(t, cause.Error(), nc.LocalAddr().String(), "the error names the peer")

			requireEcho(t, good, tc.name)
		})
	}
	assert.Contains(t, logs.String(), "closing connection: broken frame")
	assert.Nil(t, good.Err())
}

// A response to a oneway request is dropped: the next frame the peer sees answers its next
// request.
func TestOnewayResponseDropped(t *testing.T) {
	checkGoroutines(t)
	h := newTestHandler()
	srv := startServer(t, h, remoting.ServerOptions{})
	nc, err := net.Dial("tcp", srv.addr)
	require.NoError(t, err)
	defer nc.Close()

	oneway := echoRequest("oneway")
	oneway.Opaque, oneway.Flag = 7, protocol.FlagOneway
	_, err = nc.Write(encode(t, oneway))
	require.NoError(t, err)
	got := recv(t, h.oneway, "the oneway request")
	assert.Equal(t, "oneway", string(got.Body))

	req := echoRequest("twoway")
	req.Opaque = 8
	_, err = nc.Write(encode(t, req))
	require.NoError(t, err)
	require.NoError(t, nc.SetReadDeadline(time.Now().Add(3*time.Second)))
	resp, err := protocol.ReadFrame(bufio.NewReader(nc), 0)
	require.NoError(t, err)
	assert.Equal(t, int32(8), resp.Opaque)
	assert.Equal(t, "twoway", string(resp.Body))
}

func TestIdleTimeout(t *testing.T) {
	checkGoroutines(t)
	const idle = 150 * time.Millisecond
	h := newTestHandler()
	closed := make(chan *remoting.Conn, 4)
	srv := startServer(t, h, remoting.ServerOptions{
		IdleTimeout: idle,
		OnConnClose: func(c *remoting.Conn) { closed <- c },
	})

	// A connection with a request in flight is not idle, however long the request takes.
	busy := dial(t, srv.addr, remoting.ClientOptions{})
	slow := make(chan error, 1)
	go func() {
		_, err := busy.Invoke(ctxTimeout(t, 5*time.Second), protocol.NewRequest(codeBlock, nil, nil))
		slow <- err
	}()
	recv(t, h.entered, "the slow request")

	// A silent one is closed, never before IdleTimeout. Twice in a row: by the time the
	// second is closed, the busy connection has had a request in flight for more than two
	// idle timeouts and many sweeps.
	for range 2 {
		start := time.Now()
		silent, err := net.Dial("tcp", srv.addr)
		require.NoError(t, err)
		defer silent.Close()
		require.NoError(t, silent.SetReadDeadline(time.Now().Add(10*time.Second)))
		n, err := silent.Read(make([]byte, 1))
		assert.Zero(t, n)
		require.ErrorIs(t, err, io.EOF)
		assert.GreaterOrEqual(t, time.Since(start), idle, "closed only after the idle timeout")
		c := recv(t, closed, "OnConnClose of the silent connection")
		require.ErrorIs(t, c.Err(), remoting.ErrConnClosed)
		assert.Contains(t, c.Err().Error(), "idle")
	}
	require.NoError(t, busy.Err(), "the busy connection is still open")
	close(h.release)
	require.NoError(t, recv(t, slow, "the slow response"))

	// Once its request is done, the busy connection goes idle too.
	recv(t, busy.Done(), "the busy connection to close once idle")
	recv(t, closed, "OnConnClose of the busy connection")
}

func TestShutdownGraceful(t *testing.T) {
	checkGoroutines(t)
	h := newTestHandler()
	var closes atomic.Int32
	srv := startServer(t, h, remoting.ServerOptions{OnConnClose: func(*remoting.Conn) { closes.Add(1) }})
	c := dial(t, srv.addr, remoting.ClientOptions{})

	type result struct {
		resp *protocol.Command
		err  error
	}
	slow := make(chan result, 1)
	go func() {
		resp, err := c.Invoke(ctxTimeout(t, 5*time.Second), protocol.NewRequest(codeBlock, nil, []byte("slow")))
		slow <- result{resp, err}
	}()
	recv(t, h.entered, "the slow request")

	shutdown := make(chan error, 1)
	go func() { shutdown <- srv.Shutdown(ctxTimeout(t, 5*time.Second)) }()
	srv.requireServed(t)

	_, err := net.DialTimeout("tcp", srv.addr, time.Second)
	require.Error(t, err, "new connections are refused")

	resp, err := c.Invoke(ctxTimeout(t, 3*time.Second), echoRequest("late"))
	require.NoError(t, err, "the open connection still answers")
	assert.Equal(t, protocol.SystemBusy, resp.ResponseCode())
	assert.Equal(t, "server is shutting down", resp.Remark)

	select {
	case err := <-shutdown:
		t.Fatalf("Shutdown returned %v with a request in flight", err)
	default:
	}
	close(h.release)
	r := recv(t, slow, "the slow response")
	require.NoError(t, r.err)
	assert.Equal(t, "slow", string(r.resp.Body))
	require.NoError(t, recv(t, shutdown, "Shutdown"))
	assert.Equal(t, int32(1), closes.Load(), "OnConnClose ran before Shutdown returned")
	recv(t, c.Done(), "the client side to see the close")
	require.ErrorIs(t, c.Err(), remoting.ErrConnClosed)
	require.ErrorIs(t, c.Err(), io.EOF)

	require.ErrorIs(t, srv.Serve(mustListen(t)), remoting.ErrServerClosed, "Serve after Shutdown")
}

func TestShutdownDeadline(t *testing.T) {
	checkGoroutines(t)
	handlerDone := make(chan error, 1)
	entered := make(chan struct{})
	h := remoting.HandlerFunc(func(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
		close(entered)
		<-ctx.Done()
		handlerDone <- context.Cause(ctx)
		return nil
	})
	srv := startServer(t, h, remoting.ServerOptions{})
	c := dial(t, srv.addr, remoting.ClientOptions{})
	invokeErr := make(chan error, 1)
	go func() {
		_, err := c.Invoke(ctxTimeout(t, 5*time.Second), echoRequest("stuck"))
		invokeErr <- err
	}()
	recv(t, entered, "the handler")

	err := srv.Shutdown(ctxTimeout(t, 100*time.Millisecond))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, recv(t, handlerDone, "the handler's context to end"), remoting.ErrConnClosed)
	require.ErrorIs(t, recv(t, invokeErr, "the pending call to fail"), remoting.ErrConnClosed)
}

// The broker calls its clients: a request expecting a response, and a oneway notification.
func TestServerToClient(t *testing.T) {
	for _, st := range []protocol.SerializeType{protocol.JSON, protocol.RocketMQ} {
		t.Run(st.String(), func(t *testing.T) {
			checkGoroutines(t)
			conns := make(chan *remoting.Conn, 1)
			srv := startServer(t, remoting.HandlerFunc(func(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
				conns <- c
				return protocol.NewResponse(req, protocol.Success, "")
			}), remoting.ServerOptions{})

			notified := make(chan *protocol.Command, 1)
			client := remoting.HandlerFunc(func(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
				switch req.RequestCode() {
				case protocol.GetConsumerRunningInfo:
					resp := protocol.NewResponse(req, protocol.Success, "")
					resp.Body = []byte("running info of " + req.ExtFields["clientId"] + " in " + req.Serialize.String())
					return resp
				case protocol.NotifyConsumerIDsChanged:
					notified <- req
					return protocol.NewResponse(req, protocol.Success, "") // dropped: oneway
				}
				return nil
			})
			c := dial(t, srv.addr, remoting.ClientOptions{Handler: client, Serialize: st})
			_, err := c.Invoke(ctxTimeout(t, 3*time.Second), protocol.NewRequest(protocol.HeartBeat, map[string]string{"clientID": "c1"}, nil))
			require.NoError(t, err)
			sc := recv(t, conns, "the server side of the connection")
			assert.Equal(t, c.LocalAddr().String(), sc.RemoteAddr().String())

			resp, err := sc.Invoke(ctxTimeout(t, 3*time.Second),
				protocol.NewRequest(protocol.GetConsumerRunningInfo, map[string]string{"consumerGroup": "g", "clientId": "c1"}, nil))
			require.NoError(t, err)
			assert.Equal(t, protocol.Success, resp.ResponseCode())
			assert.Equal(t, "running info of c1 in "+st.String(), string(resp.Body), "the server speaks the client's encoding")

			require.NoError(t, sc.InvokeOneway(ctxTimeout(t, 3*time.Second),
				protocol.NewRequest(protocol.NotifyConsumerIDsChanged, map[string]string{"consumerGroup": "g"}, nil)))
			n := recv(t, notified, "the notification")
			assert.True(t, n.IsOneway())
			assert.Equal(t, "g", n.ExtFields["consumerGroup"])

			// The dropped oneway response did not disturb anything.
			_, err = c.Invoke(ctxTimeout(t, 3*time.Second), protocol.NewRequest(protocol.HeartBeat, nil, nil))
			require.NoError(t, err)
			recv(t, conns, "the second heartbeat")
		})
	}
}

func TestPendingCallsFailOnClose(t *testing.T) {
	checkGoroutines(t)
	h := newTestHandler()
	srv := startServer(t, h, remoting.ServerOptions{})
	c := dial(t, srv.addr, remoting.ClientOptions{})
	pending := make(chan error, 1)
	go func() {
		_, err := c.Invoke(ctxTimeout(t, 5*time.Second), protocol.NewRequest(codeBlock, nil, nil))
		pending <- err
	}()
	recv(t, h.entered, "the blocked request")

	require.NoError(t, srv.Close())
	err := recv(t, pending, "the pending call")
	require.ErrorIs(t, err, remoting.ErrConnClosed)
	assert.Contains(t, err.Error(), srv.addr)
	assert.Contains(t, err.Error(), "invoke REQUEST_CODE_1001")

	_, err = c.Invoke(ctxTimeout(t, 3*time.Second), echoRequest("after"))
	require.ErrorIs(t, err, remoting.ErrConnClosed)
	require.ErrorIs(t, c.InvokeOneway(ctxTimeout(t, 3*time.Second), echoRequest("after")), remoting.ErrConnClosed)
}

func TestInvokeContext(t *testing.T) {
	checkGoroutines(t)
	h := newTestHandler()
	srv := startServer(t, h, remoting.ServerOptions{})
	c := dial(t, srv.addr, remoting.ClientOptions{})

	// The call's context ends while the server is still serving it.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	failed := make(chan error, 1)
	go func() {
		_, err := c.Invoke(ctx, protocol.NewRequest(codeBlock, nil, nil))
		failed <- err
	}()
	recv(t, h.entered, "the blocked request")
	cancel()
	err := recv(t, failed, "the abandoned call")
	require.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), srv.addr)
	close(h.release) // its late response is dropped

	requireEcho(t, c, "after")
	require.NoError(t, c.Err())

	cancelled, cancelNow := context.WithCancel(context.Background())
	cancelNow()
	_, err = c.Invoke(cancelled, echoRequest("x"))
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, c.InvokeOneway(cancelled, echoRequest("x")), context.Canceled)
}

func TestListenAndServe(t *testing.T) {
	checkGoroutines(t)
	srv := remoting.NewServer(newTestHandler(), remoting.ServerOptions{Logger: quietLogger()})
	assert.Nil(t, srv.Addr())
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe("127.0.0.1:0") }()
	require.Eventually(t, func() bool { return srv.Addr() != nil }, 3*time.Second, time.Millisecond)
	c := dial(t, srv.Addr().String(), remoting.ClientOptions{})
	requireEcho(t, c, "hi")
	require.NoError(t, srv.Shutdown(ctxTimeout(t, 3*time.Second)))
	require.ErrorIs(t, recv(t, served, "ListenAndServe"), remoting.ErrServerClosed)
	require.ErrorIs(t, srv.ListenAndServe("127.0.0.1:0"), remoting.ErrServerClosed)
}

func mustListen(t *testing.T) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return ln
}

// OnConnClose runs only once every Handler call on the connection has returned, so that a
// client's departure cannot be overtaken by a request it sent before leaving.
func TestOnConnCloseAfterHandlers(t *testing.T) {
	checkGoroutines(t)
	var returned atomic.Bool
	entered := make(chan struct{})
	h := remoting.HandlerFunc(func(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
		close(entered)
		<-ctx.Done()
		time.Sleep(50 * time.Millisecond) // a handler finishing its work after the close
		returned.Store(true)
		return nil
	})
	sawReturned := make(chan bool, 1)
	srv := startServer(t, h, remoting.ServerOptions{OnConnClose: func(*remoting.Conn) { sawReturned <- returned.Load() }})
	c := dial(t, srv.addr, remoting.ClientOptions{})
	require.NoError(t, c.InvokeOneway(ctxTimeout(t, 3*time.Second), echoRequest("x")))
	recv(t, entered, "the handler")
	require.NoError(t, c.Close())
	assert.True(t, recv(t, sawReturned, "OnConnClose"), "OnConnClose ran while a handler was still running")
}
