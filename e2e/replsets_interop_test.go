//go:build !race

// rocketmq-client-go races on its own state: run without -race, in .ci/run's interop pass.

package e2e

import (
	"context"
	"maps"
	"testing"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// Two replica sets of two members and rocketmq-client-go, unmodified: a producer that knows
// only one replica's name service sends to the queues of both broker names, each stored by
// that set's master, and a push consumer that knows only the other set's replica receives
// every message.
func TestRocketMQClientsSendToEveryReplicaSet(t *testing.T) {
	rlog.SetLogLevel("fatal")
	sets := startReplicaSets(t, 2, "rs-a", "rs-b")
	a1, a2, b1, b2 := sets["rs-a"][0], sets["rs-a"][1], sets["rs-b"][0], sets["rs-b"][1]
	const topic = "sets-rmq"
	createTopicAt(t, a1.broker, topic, 2)
	want := map[string]map[int64]string{"rs-a": {0: a1.broker, 2: a2.broker}, "rs-b": {0: b1.broker, 2: b2.broker}}
	require.Eventually(t, func() bool { return maps.EqualFunc(routeOf(a2.namesrv, topic), want, maps.Equal) }, wait, tick,
		"rs-a-2 routes both sets: %v", routeOf(a2.namesrv, topic))

	got := newBodyCounts()
	pc, err := rocketmq.NewPushConsumer(
		rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver([]string{b2.namesrv})),
		rmqconsumer.WithGroupName("sets-pushers"),
		rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset),
	)
	require.NoError(t, err)
	require.NoError(t, pc.Subscribe(topic, rmqconsumer.MessageSelector{}, func(_ context.Context, ms ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
		for _, m := range ms {
			got.add("pusher", string(m.Body))
		}
		return rmqconsumer.ConsumeSuccess, nil
	}))
	require.NoError(t, pc.Start())
	t.Cleanup(func() { _ = pc.Shutdown() })

	p := rmqProducer(t, a2.namesrv, "sets-rmq-producer")
	sends := bodies("rmq", 12)
	spread, stored := map[string]int{}, map[string]int{}
	for _, body := range sends {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		res, err := p.SendSync(ctx, primitive.NewMessage(topic, []byte(body)))
		cancel()
		require.NoError(t, err)
		require.Equal(t, primitive.SendOK, res.Status)
		spread[res.MessageQueue.BrokerName]++
		host, _, err := protocol.ParseOffsetMsgID(res.OffsetMsgID)
		require.NoError(t, err)
		stored[host.String()]++
	}
	assert.Equal(t, map[string]int{"rs-a": 6, "rs-b": 6}, spread, "round robin over both sets' queues")
	assert.Equal(t, map[string]int{a1.broker: 6, b1.broker: 6}, stored, "each stored by its set's master")
	require.Eventually(t, func() bool { return got.has(sends) }, wait, tick, "the push consumer receives every message")
}
