package control_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/protocol"
)

// group.describe shows a pop group's progress per queue, and counts what is handed out and
// not acknowledged as lag.
func TestGroupDescribeShowsPopProgress(t *testing.T) {
	e := start(t, nil)
	e.ok("topic.create", `{"topic":"tasks","queues":1}`, nil)
	ctx := context.Background()
	for range 3 {
		_, err := e.b.Send(ctx, protocol.Message{Topic: "tasks", Body: []byte("t")}, 0)
		require.NoError(t, err)
	}
	var got []broker.PoppedMessage
	require.Eventually(t, func() bool {
		ms, err := e.b.Pop(ctx, broker.PopRequest{Group: "workers", Topic: "tasks", QueueID: -1, MaxMessages: 32, Invisible: time.Minute, ClientID: "w1"})
		require.NoError(t, err)
		got = append(got, ms...)
		return len(got) == 3
	}, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, e.b.PopAck(ctx, "workers", "tasks", got[0].Handle))

	var d control.GroupDescribeReply
	e.ok("group.describe", `{"group":"workers"}`, &d)
	require.Len(t, d.Topics, 1)
	require.Len(t, d.Topics[0].Queues, 1)
	q := d.Topics[0].Queues[0]
	require.NotNil(t, q.Pop)
	assert.Equal(t, control.PopQueueView{InFlight: 2, Acked: 1, ConsumedOffset: 1, Receiver: "w1"}, *q.Pop)
	assert.Equal(t, int64(2), q.Lag)
	assert.Equal(t, int64(2), d.Lag)
}
