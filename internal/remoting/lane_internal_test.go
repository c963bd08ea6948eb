package remoting

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// asyncDone is an AsyncReceiver that passes the error on.
type asyncDone chan error

func (d asyncDone) InvokeDone(_ *protocol.Command, err error) { d <- err }

// Calls answered in the order they were made leave their deadline lane as they are
// answered: the lane holds the calls still pending, not every call of the last timeout.
func TestDeadlineLaneHoldsOnlyPendingCalls(t *testing.T) {
	srv := NewServer(HandlerFunc(func(_ context.Context, _ *Conn, req *protocol.Command) *protocol.Command {
		return protocol.NewResponse(req, protocol.Success, "")
	}), ServerOptions{Logger: slog.New(slog.DiscardHandler)})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		assert.NoError(t, srv.Shutdown(ctx))
	})
	c, err := Dial(context.Background(), ln.Addr().String(), ClientOptions{Serialize: protocol.RocketMQ})
	require.NoError(t, err)
	defer c.Close()

	const rounds, inFlight = 50, 8
	for range rounds {
		done := make(asyncDone, inFlight)
		for range inFlight {
			require.NoError(t, c.InvokeAsyncRaw(context.Background(), protocol.NewRequest(protocol.HeartBeat, nil, nil), time.Hour, done))
		}
		for range inFlight {
			require.NoError(t, <-done)
		}
	}
	c.pmu.Lock()
	defer c.pmu.Unlock()
	require.Len(t, c.lanes, 1, "one timeout, one lane")
	l := c.lanes[0]
	assert.Zero(t, len(l.q)-l.head, "answered calls left in the lane")
	assert.LessOrEqual(t, cap(l.q), 4*inFlight, "the lane grew with every call")
	assert.Empty(t, c.pending)
}

// tagged is an AsyncReceiver that reports which call ended, and how.
type tagged struct {
	name string
	out  chan<- taggedEnd
}

type taggedEnd struct {
	name string
	err  error
}

func (r tagged) InvokeDone(_ *protocol.Command, err error) { r.out <- taggedEnd{r.name, err} }

// A finished call goes back to its connection's pool while its old lane entry waits behind
// an older pending call; reused for a later call, it must not hold up the expiry of the
// calls queued between its two entries. Without the entries' generation, the old entry of a
// reused call read as that later, still pending call, and the expiry stopped there: a call
// made before it expired only at its deadline, after it.
func TestDeadlineLaneSkipsReusedCalls(t *testing.T) {
	srv := NewServer(HandlerFunc(func(_ context.Context, _ *Conn, req *protocol.Command) *protocol.Command {
		if req.RequestCode() == protocol.HeartBeat {
			return protocol.NewResponse(req, protocol.Success, "")
		}
		return nil // never answered: only the deadline ends the call
	}), ServerOptions{Logger: slog.New(slog.DiscardHandler)})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		assert.NoError(t, srv.Shutdown(ctx))
	})
	c, err := Dial(context.Background(), ln.Addr().String(), ClientOptions{Serialize: protocol.RocketMQ})
	require.NoError(t, err)
	defer c.Close()

	const timeout = 300 * time.Millisecond
	ends := make(chan taggedEnd, 64)
	unanswered := func(name string) {
		require.NoError(t, c.InvokeAsyncRaw(context.Background(), protocol.NewRequest(protocol.GetRouteInfoByTopic, nil, nil), timeout, tagged{name, ends}))
	}
	unanswered("first") // holds the lane's head: the answered calls' entries stay behind it
	const answered = 20
	done := make(asyncDone, answered)
	for range answered {
		require.NoError(t, c.InvokeAsyncRaw(context.Background(), protocol.NewRequest(protocol.HeartBeat, nil, nil), timeout, done))
	}
	for range answered {
		require.NoError(t, <-done)
	}
	unanswered("early") // reuses a pooled call, very likely one of the answered ones
	time.Sleep(timeout / 2)
	unanswered("late") // reuses another, whose old entry is before early's
	var order []string
	for range 3 {
		e := <-ends
		require.ErrorIs(t, e.err, context.DeadlineExceeded, e.name)
		order = append(order, e.name)
	}
	assert.Equal(t, []string{"first", "early", "late"}, order, "calls expire in the order of their deadlines")
}
