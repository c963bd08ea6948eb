package remoting_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// Request codes of the test handler.
const (
	codeEcho  protocol.RequestCode = 1000 // answers with the request's body and ext field "k"
	codeBlock protocol.RequestCode = 1001 // reports itself on entered, then waits for release or ctx
	codePanic protocol.RequestCode = 1002
	codeHuge  protocol.RequestCode = 1003 // answers with a body larger than any frame
)

// testHandler serves the codes above.
type testHandler struct {
	entered chan *protocol.Command
	release chan struct{}
	oneway  chan *protocol.Command // oneway requests, after they have been served
}

func newTestHandler() *testHandler {
	return &testHandler{
		entered: make(chan *protocol.Command, 64),
		release: make(chan struct{}),
		oneway:  make(chan *protocol.Command, 64),
	}
}

func (h *testHandler) ServeRemoting(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
	if req.IsOneway() {
		defer func() { h.oneway <- req }()
	}
	switch req.RequestCode() {
	case codeEcho:
		return echo(req)
	case codeBlock:
		h.entered <- req
		select {
		case <-h.release:
			return echo(req)
		case <-ctx.Done():
			return nil
		}
	case codePanic:
		panic("boom")
	case codeHuge:
		resp := protocol.NewResponse(req, protocol.Success, "")
		resp.Body = make([]byte, protocol.MaxFrameSize+1)
		return resp
	}
	return protocol.NewResponse(req, protocol.RequestCodeNotSupported, "")
}

func echo(req *protocol.Command) *protocol.Command {
	resp := protocol.NewResponse(req, protocol.Success, "ok")
	resp.Body = req.Body
	resp.ExtFields["k"] = req.ExtFields["k"]
	resp.ExtFields["serialize"] = req.Serialize.String()
	return resp
}

func echoRequest(body string) *protocol.Command {
	return protocol.NewRequest(codeEcho, map[string]string{"k": body}, []byte(body))
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// checkGoroutines fails the test if, once every later cleanup has run, the number of
// goroutines does not settle back to what it was when checkGoroutines was called. Call it
// first so that its cleanup runs last.
func checkGoroutines(t *testing.T) {
	t.Helper()
	base := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(3 * time.Second)
		for runtime.NumGoroutine() > base {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				n := runtime.Stack(buf, true)
				t.Errorf("goroutines leaked: %d running, %d before the test\n%s", runtime.NumGoroutine(), base, buf[:n])
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}

// testServer is a Server serving a 127.0.0.1 port on its own goroutine.
type testServer struct {
	*remoting.Server
	addr     string
	served   chan struct{} // closed when Serve has returned
	serveErr error
}

func startServer(t *testing.T, h remoting.Handler, opts remoting.ServerOptions) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return serveOn(t, ln, h, opts)
}

func serveOn(t *testing.T, ln net.Listener, h remoting.Handler, opts remoting.ServerOptions) *testServer {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quietLogger()
	}
	s := &testServer{Server: remoting.NewServer(h, opts), addr: ln.Addr().String(), served: make(chan struct{})}
	go func() {
		s.serveErr = s.Serve(ln)
		close(s.served)
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, s.Shutdown(ctx))
		s.requireServed(t)
	})
	return s
}

func (s *testServer) requireServed(t *testing.T) {
	t.Helper()
	select {
	case <-s.served:
		require.ErrorIs(t, s.serveErr, remoting.ErrServerClosed)
	case <-time.After(3 * time.Second):
		t.Fatal("Serve did not return")
	}
}

func dial(t *testing.T, addr string, opts remoting.ClientOptions) *remoting.Conn {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quietLogger()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := remoting.Dial(ctx, addr, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// requireEcho invokes an echo on c and checks the answer.
func requireEcho(t *testing.T, c *remoting.Conn, body string) {
	t.Helper()
	resp, err := c.Invoke(ctxTimeout(t, 3*time.Second), echoRequest(body))
	require.NoError(t, err)
	require.Equal(t, protocol.Success, resp.ResponseCode())
	require.Equal(t, body, string(resp.Body))
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(3 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// rawFrame builds a frame from a length, a header mark and the bytes after them.
func rawFrame(length, mark uint32, rest string) []byte {
	b := binary.BigEndian.AppendUint32(nil, length)
	b = binary.BigEndian.AppendUint32(b, mark)
	return append(b, rest...)
}

// encode returns cmd's frame.
func encode(t *testing.T, cmd *protocol.Command) []byte {
	t.Helper()
	b, err := cmd.AppendFrame(nil)
	require.NoError(t, err)
	return b
}

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func body(i, j int) string { return fmt.Sprintf("g%d-%s", i, strconv.Itoa(j)) }
