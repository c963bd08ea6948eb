package broker

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// A parked pull keeps what it needs to answer and wake, not the request's decoded header map:
// with thousands of consumers' pulls parked for up to 30 s each, that map was most of a
// parked pull's memory.
func TestParkedPullDropsItsRequestHeaderMap(t *testing.T) {
	b, err := New(Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", NamesrvListen: "off",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() { assert.NoError(t, b.Shutdown(context.Background())) })
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "park", ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermRead | protocol.PermWrite}))

	req := protocol.NewRequestWith(protocol.PullMessage, &protocol.PullMessageRequestHeader{
		ConsumerGroup: "g", Topic: "park", QueueID: 0, QueueOffset: 0, MaxMsgNums: 32,
		SysFlag: protocol.PullFlagSubscription | protocol.PullFlagSuspend, SuspendTimeoutMillis: 20_000,
		Subscription: "*", ExpressionType: "TAG",
	}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	answered := make(chan *protocol.Command, 1)
	go func() { answered <- b.processPull(ctx, nil, req) }()
	require.Eventually(t, func() bool { return b.WaitingPulls() == 1 }, 5*time.Second, time.Millisecond)
	assert.Nil(t, req.ExtFields, "the parked pull let its request's header map go")

	cancel() // the connection closed: the pull is still answered, as the request it was
	resp := <-answered
	assert.Equal(t, req.Opaque, resp.Opaque)
	assert.True(t, resp.IsResponse())
}
