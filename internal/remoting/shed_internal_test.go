package remoting

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// A connection that served a burst keeps request goroutines and its gathered write buffer
// only while it is busy: once it has been idle for a sweep of the server, both are let go,
// and the next request is served as before.
func TestIdleConnectionShedsWorkersAndWriteBuffer(t *testing.T) {
	const burst = 8
	gate := make(chan struct{})
	var entered sync.WaitGroup
	entered.Add(burst)
	h := HandlerFunc(func(ctx context.Context, c *Conn, req *protocol.Command) *protocol.Command {
		if string(req.Body) == "burst" {
			entered.Done()
			<-gate
		}
		return protocol.NewResponse(req, protocol.Success, "")
	})
	conns := make(chan *Conn, 1)
	// IdleTimeout 8 s: the sweeper looks every second and closes the connection only after
	// 8 idle seconds, well after it has shed.
	srv := NewServer(h, ServerOptions{IdleTimeout: 8 * time.Second, Logger: slog.New(slog.DiscardHandler),
		OnConnOpen: func(c *Conn) { conns <- c }})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		assert.NoError(t, srv.Shutdown(ctx))
	})

	client, err := Dial(context.Background(), ln.Addr().String(), ClientOptions{})
	require.NoError(t, err)
	defer client.Close()
	sc := <-conns

	var wg sync.WaitGroup
	for range burst {
		wg.Go(func() {
			_, err := client.Invoke(context.Background(), protocol.NewRequest(protocol.HeartBeat, nil, []byte("burst")))
			assert.NoError(t, err)
		})
	}
	entered.Wait() // every request of the burst is being served, each on its own goroutine
	close(gate)
	wg.Wait()

	require.Eventually(t, func() bool {
		sc.wmu.Lock()
		defer sc.wmu.Unlock()
		sc.qmu.Lock()
		defer sc.qmu.Unlock()
		return sc.idleWorkers.Load() == 0 && sc.wbuf == nil && sc.qspare == nil && sc.qbuf == nil
	}, 5*time.Second, 10*time.Millisecond, "an idle connection lets its waiting workers and write buffers go")

	_, err = client.Invoke(context.Background(), protocol.NewRequest(protocol.HeartBeat, nil, []byte("after")))
	require.NoError(t, err)
	assert.NoError(t, sc.Err(), "shedding does not close the connection")
}

// A connection whose only requests are deferred (long-polling pulls waiting, with no
// goroutine) is quiet too: it sheds its burst's workers, and stays open.
func TestQuietConnectionWithDeferredRequestsSheds(t *testing.T) {
	const burst = 8
	gate := make(chan struct{})
	var entered sync.WaitGroup
	entered.Add(burst)
	deferred := make(chan Deferred, 1)
	h := HandlerFunc(func(ctx context.Context, c *Conn, req *protocol.Command) *protocol.Command {
		switch string(req.Body) {
		case "burst":
			entered.Done()
			<-gate
		case "defer":
			d, ok := Defer(ctx, nil)
			if ok {
				deferred <- d
				return nil
			}
		}
		return protocol.NewResponse(req, protocol.Success, "")
	})
	conns := make(chan *Conn, 1)
	srv := NewServer(h, ServerOptions{IdleTimeout: 8 * time.Second, Logger: slog.New(slog.DiscardHandler),
		OnConnOpen: func(c *Conn) { conns <- c }})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		assert.NoError(t, srv.Shutdown(ctx))
	})
	client, err := Dial(context.Background(), ln.Addr().String(), ClientOptions{})
	require.NoError(t, err)
	defer client.Close()
	sc := <-conns

	answered := make(chan *protocol.Command, 1)
	go func() {
		resp, err := client.Invoke(context.Background(), protocol.NewRequest(protocol.PullMessage, nil, []byte("defer")))
		assert.NoError(t, err)
		answered <- resp
	}()
	d := <-deferred
	var wg sync.WaitGroup
	for range burst {
		wg.Go(func() {
			_, err := client.Invoke(context.Background(), protocol.NewRequest(protocol.HeartBeat, nil, []byte("burst")))
			assert.NoError(t, err)
		})
	}
	entered.Wait()
	close(gate)
	wg.Wait()

	require.Eventually(t, func() bool { return sc.idleWorkers.Load() == 0 }, 5*time.Second, 10*time.Millisecond,
		"a connection with only deferred requests lets its waiting workers go")
	assert.NoError(t, sc.Err(), "and is not closed as idle")
	require.True(t, d.Respond(protocol.NewResponse(&protocol.Command{}, protocol.Success, "later")))
	assert.Equal(t, "later", (<-answered).Remark)
}
