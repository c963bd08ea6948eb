package metrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/metrics"
	"github.com/flowd-io/flowd/protocol"
)

// Pop receives are read at scrape time: in flight, acknowledged, and counted as messages out.
func TestPopMetrics(t *testing.T) {
	m := metrics.New(metrics.Options{DisableRuntimeMetrics: true})
	b := startBroker(t, m, nil)
	require.NoError(t, b.CreateTopic(broker.TopicConfig{Name: "popped", ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermRead | protocol.PermWrite}))
	ctx := context.Background()
	for range 3 {
		_, err := b.Send(ctx, protocol.Message{Topic: "popped", Body: []byte("x")}, 0)
		require.NoError(t, err)
	}
	var got []broker.PoppedMessage
	require.Eventually(t, func() bool {
		ms, err := b.Pop(ctx, broker.PopRequest{Group: "pg", Topic: "popped", QueueID: -1, MaxMessages: 32, Invisible: time.Minute})
		require.NoError(t, err)
		got = append(got, ms...)
		return len(got) == 3
	}, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, b.PopAck(ctx, "pg", "popped", got[0].Handle))

	v, ok := value(t, m.Registry(), "flowd_pop_in_flight")
	require.True(t, ok)
	assert.Equal(t, 2.0, v)
	v, _ = value(t, m.Registry(), "flowd_pop_acks_total")
	assert.Equal(t, 1.0, v)
	v, _ = value(t, m.Registry(), "flowd_messages_out_total", "topic", "popped")
	assert.Equal(t, 3.0, v)
}
