//go:build !race

// rocketmq-client-go races on its own state, which the race detector reports against
// whichever test is running, so this interop test runs without -race (as the broker's do).

package control_test

import (
	"context"
	"sync"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
)

func init() {
	// The RocketMQ client logs every connection at info level through a global logger.
	rlog.SetLogLevel("fatal")
}

// A live RocketMQ push consumer is told about a reset made with explicit offsets
// (RESET_CONSUMER_OFFSET) and consumes again from there without restarting.
func TestGroupResetOffsetRewindsALiveRocketMQConsumer(t *testing.T) {
	e := start(t, nil)
	e.ok("topic.create", `{"topic":"orders","queues":1}`, nil)
	p := newProducer(t, e.b)
	send(t, e.b, p, "orders", 5)

	var mu sync.Mutex
	deliveries := map[string]int{}
	c, err := rocketmq.NewPushConsumer(
		rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver([]string{e.b.NamesrvAddr()})),
		rmqconsumer.WithGroupName("rmq-billing"),
		rmqconsumer.WithInstance(uniqueName(t)),
		rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset),
	)
	require.NoError(t, err)
	require.NoError(t, c.Subscribe("orders", rmqconsumer.MessageSelector{}, func(_ context.Context, ms ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range ms {
			deliveries[string(m.Body)]++
		}
		return rmqconsumer.ConsumeSuccess, nil
	}))
	require.NoError(t, c.Start())
	t.Cleanup(func() { c.Shutdown() })
	count := func(body string) int {
		mu.Lock()
		defer mu.Unlock()
		return deliveries[body]
	}
	require.Eventually(t, func() bool { return count("m-4") == 1 }, 20*time.Second, 10*time.Millisecond)

	var r control.ResetReply
	e.ok("group.reset_offset", `{"group":"rmq-billing","topic":"orders","offsets":{"0":3}}`, &r)
	assert.Equal(t, 1, r.Members)
	assert.Empty(t, r.Warning)
	require.Eventually(t, func() bool { return count("m-3") == 2 && count("m-4") == 2 }, 20*time.Second, 10*time.Millisecond,
		"the messages from offset 3 on are delivered again")
	assert.Equal(t, 1, count("m-2"), "messages before the reset offset are not")
}
