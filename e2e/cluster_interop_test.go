//go:build !race

// rocketmq-client-go races on its own state; like the packages' interop tests, these run
// without -race, in .ci/run's interop pass.

package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	rmqproducer "github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
)

// rmqProducer starts a rocketmq-client-go producer that knows only namesrv.
func rmqProducer(t *testing.T, namesrv, instance string) rocketmq.Producer {
	t.Helper()
	p, err := rocketmq.NewProducer(
		rmqproducer.WithNsResolver(primitive.NewPassthroughResolver([]string{namesrv})),
		rmqproducer.WithGroupName("e2e-rmq-producers"),
		rmqproducer.WithInstanceName(instance),
		rmqproducer.WithRetry(2),
		rmqproducer.WithSendMsgTimeout(3*time.Second),
	)
	require.NoError(t, err)
	require.NoError(t, p.Start())
	t.Cleanup(func() { _ = p.Shutdown() })
	return p
}

// members counts the group's members on the node's broker (group describe).
func members(t *testing.T, n *node, group string) int {
	t.Helper()
	var r control.GroupDescribeReply
	if err := n.ctlJSON(&r, "group", "describe", group); err != nil {
		return 0
	}
	return len(r.Members)
}

// Three `flowd serve` nodes and rocketmq-client-go, unmodified: a topic created on node A is
// routed by node C's name service within a second; a producer that knows only node B's name
// service spreads its sends over the queues of all three brokers, and a push-consumer group of
// three members that knows only node C's receives each exactly once. Then node B is killed
// with SIGKILL while a producer keeps sending: every route drops it within 10 s, the sends go
// on to A and C, every send A or C acknowledged reads back, and B rejoins on restart with
// its messages.
func TestRocketMQInteropThreeNodeCluster(t *testing.T) {
	rlog.SetLogLevel("fatal")
	all := []string{"broker-1", "broker-2", "broker-3"}
	nodes := startCluster(t, all...)
	a, b, c := nodes[0], nodes[1], nodes[2]
	awaitJoined(t, nodes, all...)

	const topic, group = "orders", "pushers"
	a.ctl("topic", "create", topic, "--queues", "2")
	took := routed(t, c.namesrv, topic, wait, all...)
	t.Logf("topic created on %s routed by %s to every broker %v after the create's reply", a.broker, c.broker, took.Round(time.Millisecond))

	got := newBodyCounts()
	for i := range 3 {
		name := fmt.Sprintf("pusher-%d", i)
		pc, err := rocketmq.NewPushConsumer(
			rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver([]string{c.namesrv})),
			rmqconsumer.WithGroupName(group),
			rmqconsumer.WithInstance(name),
			rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset),
		)
		require.NoError(t, err)
		require.NoError(t, pc.Subscribe(topic, rmqconsumer.MessageSelector{}, func(_ context.Context, ms ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
			for _, m := range ms {
				got.add(name, string(m.Body))
			}
			return rmqconsumer.ConsumeSuccess, nil
		}))
		require.NoError(t, pc.Start())
		t.Cleanup(func() { _ = pc.Shutdown() })
	}
	// Steady state: every broker knows the three members (each rebalances when a broker
	// tells it the membership changed, and at start).
	for _, n := range nodes {
		require.Eventually(t, func() bool { return members(t, n, group) == 3 }, wait, 100*time.Millisecond, "%s knows the three members", n.broker)
	}
	time.Sleep(2 * time.Second) // the members' rebalances on the last change; not an assertion

	p := rmqProducer(t, b.namesrv, "producer-b")
	sends := bodies("push", 60)
	spread := map[string]int{}
	for _, body := range sends {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		res, err := p.SendSync(ctx, primitive.NewMessage(topic, []byte(body)))
		cancel()
		require.NoError(t, err)
		require.Equal(t, primitive.SendOK, res.Status)
		spread[res.MessageQueue.BrokerName]++
	}
	assert.Equal(t, map[string]int{"broker-1": 20, "broker-2": 20, "broker-3": 20}, spread, "round robin over the six queues")
	require.Eventually(t, func() bool { return got.has(sends) }, wait, tick, "the push group receives every message")
	time.Sleep(time.Second) // a late duplicate would arrive meanwhile; not an assertion
	assert.Empty(t, got.duplicates(), "no message twice in steady state")
	assert.Len(t, got.receivers("push"), 3, "each member has queues")

	// B crashes while a producer on A keeps sending.
	const survive = "survive"
	a.ctl("topic", "create", survive, "--queues", "2")
	for _, n := range nodes {
		routed(t, n.namesrv, survive, wait, all...)
	}
	pa := rmqProducer(t, a.namesrv, "producer-a")
	var mu sync.Mutex
	acked := map[string]string{} // body → broker
	stopSending := make(chan struct{})
	sending := make(chan struct{})
	go func() {
		defer close(sending)
		for i := 0; ; i++ {
			select {
			case <-stopSending:
				return
			default:
			}
			body := fmt.Sprintf("s-%04d", i)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			res, err := pa.SendSync(ctx, primitive.NewMessage(survive, []byte(body)))
			cancel()
			if err == nil && res.Status == primitive.SendOK {
				mu.Lock()
				acked[body] = res.MessageQueue.BrokerName
				mu.Unlock()
			}
			time.Sleep(10 * time.Millisecond) // a steady trickle, not a benchmark
		}
	}()
	time.Sleep(time.Second)
	b.kill()
	killed := time.Now()
	// Detection takes the registry's TTL (6 s) and a watch; the bound is the harness's wait:
	// on a loaded machine the heartbeats and the watch run late, and how
	// long it took is a figure to log, not a pass mark.
	for _, n := range []*node{a, c} {
		routed(t, n.namesrv, survive, wait-time.Since(killed), "broker-1", "broker-3")
	}
	gone := time.Since(killed)
	t.Logf("SIGKILLed %s left every route after %v", b.broker, gone.Round(time.Millisecond))
	mu.Lock()
	before := len(acked)
	mu.Unlock()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(acked) >= before+20 }, wait, tick, "sends go on to A and C")
	close(stopSending)
	<-sending

	var onSurvivors, all2 []string
	for body, br := range acked {
		all2 = append(all2, body)
		if br != "broker-2" {
			onSurvivors = append(onSurvivors, body)
		}
	}
	t.Logf("%d sends acknowledged, %d of them by A or C", len(acked), len(onSurvivors))
	readAll(t, c.namesrv, survive, onSurvivors)

	b.restart(t)
	for _, n := range nodes {
		routed(t, n.namesrv, survive, wait, all...)
	}
	readAll(t, a.namesrv, survive, all2)
}
