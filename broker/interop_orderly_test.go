//go:build !race

// The orderly push consumer of rocketmq-client-go races on its own process queue (a tree map
// read by the consume goroutine while the pull goroutine writes it), which the race detector
// reports against the test. .ci/run runs this file without -race, with the other interop
// tests (see interop_test.go).

package broker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRocketMQOrderlyConsumerTakesQueueLocks(t *testing.T) {
	b := startBroker(t, nil)
	p := newProducer(t, b)
	const topic, group = "ordered", "orderly"
	sent := sendN(t, p, topic, "m", 20)
	r := newReceived()
	var mu sync.Mutex
	perQueue := map[int][]int64{}
	c, err := rocketmq.NewPushConsumer(
		rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver([]string{b.NamesrvAddr()})),
		rmqconsumer.WithGroupName(group),
		rmqconsumer.WithInstance(instance(t)),
		rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset),
		rmqconsumer.WithConsumerOrder(true),
	)
	require.NoError(t, err)
	require.NoError(t, c.Subscribe(topic, rmqconsumer.MessageSelector{}, func(ctx context.Context, ms ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
		mu.Lock()
		for _, m := range ms {
			perQueue[m.Queue.QueueId] = append(perQueue[m.Queue.QueueId], m.QueueOffset)
		}
		mu.Unlock()
		r.add(ms...)
		return rmqconsumer.ConsumeSuccess, nil
	}))
	require.NoError(t, c.Start())
	t.Cleanup(func() { c.Shutdown() })
	r.waitFor(t, len(sent), 20*time.Second)

	locked := 0
	for mq, owner := range b.LockedQueues(group) {
		if mq.Topic == topic {
			assert.Contains(t, owner, "@", "locked by a client id")
			locked++
		}
	}
	assert.Equal(t, 4, locked, "the orderly consumer locks every queue it consumes")
	mu.Lock()
	defer mu.Unlock()
	for q, offs := range perQueue {
		for i := 1; i < len(offs); i++ {
			assert.Less(t, offs[i-1], offs[i], "queue %d consumed in order", q)
		}
	}
}
