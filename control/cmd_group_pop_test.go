package control_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/control"
)

// A pop-consuming group (RocketMQ 5 consumers) shows its in-flight and acknowledged
// messages per queue, and its lag counts the unacknowledged ones.
func TestGroupDescribeShowsPopProgress(t *testing.T) {
	e := start(t, nil)
	e.ok("topic.create", `{"topic":"orders","queues":1}`, nil)
	p := newProducer(t, e.b)
	send(t, e.b, p, "orders", 5)
	ctx := context.Background()
	var popped []broker.PoppedMessage
	require.Eventually(t, func() bool {
		got, err := e.b.Pop(ctx, broker.PopRequest{Group: "pop-g", Topic: "orders", QueueID: -1, MaxMessages: 5 - len(popped),
			Invisible: time.Minute, ExpressionType: "TAG", Expression: "*", Wait: 100 * time.Millisecond})
		require.NoError(t, err)
		popped = append(popped, got...)
		return len(popped) == 5
	}, 10*time.Second, 10*time.Millisecond)
	for _, m := range popped[:2] {
		require.NoError(t, e.b.PopAck(ctx, "pop-g", "orders", m.Handle))
	}
	var d control.GroupDescribeReply
	e.ok("group.describe", `{"group":"pop-g"}`, &d)
	var q *control.GroupQueueView
	for i, t := range d.Topics {
		if t.Topic == "orders" {
			q = &d.Topics[i].Queues[0]
		}
	}
	require.NotNil(t, q, "%+v", d.Topics)
	require.NotNil(t, q.Pop)
	assert.Equal(t, 3, q.Pop.InFlight)
	assert.Equal(t, uint64(2), q.Pop.Acked)
	assert.Equal(t, q.MaxOffset-q.Pop.ConsumedOffset, q.Lag, "unacknowledged messages are lag")
	assert.GreaterOrEqual(t, q.Lag, int64(3))
	assert.Equal(t, q.Lag, d.Lag)
}
