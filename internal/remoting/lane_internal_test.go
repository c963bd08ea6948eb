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
