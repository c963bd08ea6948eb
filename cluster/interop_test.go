//go:build !race

// rocketmq-client-go races on its own state; like the broker's interop tests, this one runs
// without -race, in .ci/run's interop pass.

package cluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	rmqproducer "github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

// An unmodified RocketMQ producer that knows only broker A's name service sends to the
// queues of both brokers.
func TestRocketMQProducerSendsToEveryBroker(t *testing.T) {
	s := startNATS(t, false)
	a := startNode(t, s, "broker-a", nil)
	b := startNode(t, s, "broker-b", nil)
	require.NoError(t, b.b.CreateTopic(broker.TopicConfig{Name: "spread", ReadQueueNums: 2, WriteQueueNums: 2, Perm: protocol.PermRead | protocol.PermWrite}))
	require.Eventually(t, func() bool { return len(brokersOf(a.route(t, "spread"))) == 2 }, wait, 10*time.Millisecond)

	p, err := rocketmq.NewProducer(
		rmqproducer.WithNsResolver(primitive.NewPassthroughResolver([]string{a.b.NamesrvAddr()})),
		rmqproducer.WithGroupName("spreaders"),
		rmqproducer.WithInstanceName(t.Name()),
		rmqproducer.WithRetry(2),
	)
	require.NoError(t, err)
	require.NoError(t, p.Start())
	t.Cleanup(func() { _ = p.Shutdown() })

	sentTo := map[string]int{}
	for i := range 16 {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		res, err := p.SendSync(ctx, primitive.NewMessage("spread", []byte(fmt.Sprint("m", i))))
		cancel()
		require.NoError(t, err)
		require.Equal(t, primitive.SendOK, res.Status)
		sentTo[res.MessageQueue.BrokerName]++
	}
	assert.Equal(t, map[string]int{"broker-a": 8, "broker-b": 8}, sentTo, "round robin over the four queues of both brokers")
	stored := func(n *node) int64 { return n.b.StoreMax("spread", 0) + n.b.StoreMax("spread", 1) }
	// The consume queues are written by each store's dispatcher, behind the sends.
	require.Eventually(t, func() bool { return stored(a) == 8 && stored(b) == 8 }, wait, 10*time.Millisecond,
		"the messages landed on both brokers: A %d, B %d", stored(a), stored(b))
}
