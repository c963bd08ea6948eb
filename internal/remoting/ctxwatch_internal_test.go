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

type watchTestKey struct{}

// Async calls made with one cancellable context share one watch on it: the connection holds
// one while any is pending and none once all are answered. Cancelling the context abandons
// exactly the calls made with it (or with a context sharing its Done), while a call of
// another context stays pending until answered.
func TestAsyncCallsShareOneContextWatch(t *testing.T) {
	release := make(chan struct{})
	var releaseOnce sync.Once
	open := func() { releaseOnce.Do(func() { close(release) }) }
	srv := NewServer(HandlerFunc(func(_ context.Context, _ *Conn, req *protocol.Command) *protocol.Command {
		<-release
		return protocol.NewResponse(req, protocol.Success, "")
	}), ServerOptions{Logger: slog.New(slog.DiscardHandler)})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		open()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		assert.NoError(t, srv.Shutdown(ctx))
	})
	c, err := Dial(context.Background(), ln.Addr().String(), ClientOptions{Serialize: protocol.RocketMQ})
	require.NoError(t, err)
	defer c.Close()
	watches := func() int {
		c.pmu.Lock()
		defer c.pmu.Unlock()
		return len(c.watches)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	valued := context.WithValue(ctx, watchTestKey{}, 1) // the same Done as ctx
	other, cancelOther := context.WithCancel(context.Background())
	defer cancelOther()
	const n = 20
	abandoned := make(asyncDone, n+1)
	for i := range n {
		cctx := ctx
		if i%2 == 1 {
			cctx = valued
		}
		require.NoError(t, c.InvokeAsyncRaw(cctx, protocol.NewRequest(protocol.HeartBeat, nil, nil), time.Hour, abandoned))
	}
	answered := make(asyncDone, 1)
	require.NoError(t, c.InvokeAsyncRaw(other, protocol.NewRequest(protocol.HeartBeat, nil, nil), time.Hour, answered))
	assert.Equal(t, 2, watches(), "one watch per context's Done, not per call")

	cancel()
	for range n {
		select {
		case err := <-abandoned:
			require.ErrorIs(t, err, context.Canceled)
		case <-time.After(5 * time.Second):
			t.Fatal("a call of the cancelled context was not abandoned")
		}
	}
	require.Eventually(t, func() bool { return watches() == 1 }, 5*time.Second, time.Millisecond, "the cancelled context's watch is gone")
	select {
	case err := <-answered:
		t.Fatalf("the other context's call ended: %v", err)
	default:
	}
	open()
	select {
	case err := <-answered:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the other context's call was not answered")
	}
	require.Eventually(t, func() bool { return watches() == 0 }, 5*time.Second, time.Millisecond, "no watch once nothing is pending")
	c.pmu.Lock()
	defer c.pmu.Unlock()
	assert.Empty(t, c.pending)
}
