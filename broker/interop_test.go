//go:build !race

// rocketmq-client-go races on its own state (its Shutdown against an in-flight rebalance, its
// orderly consumer's process queue), which the race detector reports against whichever test
// is running. The interop tests therefore run without -race: .ci/run runs them in a pass of
// their own. flowd's side of every path they cover is race-tested by the tests that use
// flowd's transport and clients.

package broker_test

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
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
)

func newProducer(t *testing.T, b *testBroker) rocketmq.Producer {
	t.Helper()
	p, err := rocketmq.NewProducer(
		rmqproducer.WithNsResolver(primitive.NewPassthroughResolver([]string{b.NamesrvAddr()})),
		rmqproducer.WithGroupName("producers"),
		rmqproducer.WithInstanceName(instance(t)),
		rmqproducer.WithRetry(2),
	)
	require.NoError(t, err)
	require.NoError(t, p.Start())
	t.Cleanup(func() { p.Shutdown() })
	return p
}

type received struct {
	mu   sync.Mutex
	msgs map[string]*primitive.MessageExt // by body
	ch   chan struct{}
}

func newReceived() *received {
	return &received{msgs: map[string]*primitive.MessageExt{}, ch: make(chan struct{}, 1)}
}

func (r *received) add(ms ...*primitive.MessageExt) {
	r.mu.Lock()
	for _, m := range ms {
		r.msgs[string(m.Body)] = m
	}
	r.mu.Unlock()
	select {
	case r.ch <- struct{}{}:
	default:
	}
}

func (r *received) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

func (r *received) waitFor(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for r.len() < n {
		select {
		case <-r.ch:
		case <-deadline:
			r.mu.Lock()
			var got []string
			for k, m := range r.msgs {
				got = append(got, fmt.Sprintf("%s@q%d/%d", k, m.Queue.QueueId, m.QueueOffset))
			}
			r.mu.Unlock()
			t.Fatalf("received %d messages, want %d: %v", len(got), n, got)
		}
	}
}

func newPushConsumer(t *testing.T, b *testBroker, group, topic, expr string, r *received, opts ...rmqconsumer.Option) rocketmq.PushConsumer {
	t.Helper()
	all := append([]rmqconsumer.Option{
		rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver([]string{b.NamesrvAddr()})),
		rmqconsumer.WithGroupName(group),
		rmqconsumer.WithInstance(instance(t)),
		rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset),
	}, opts...)
	c, err := rocketmq.NewPushConsumer(all...)
	require.NoError(t, err)
	require.NoError(t, c.Subscribe(topic, rmqconsumer.MessageSelector{Type: rmqconsumer.TAG, Expression: expr},
		func(ctx context.Context, ms ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
			r.add(ms...)
			return rmqconsumer.ConsumeSuccess, nil
		}))
	require.NoError(t, c.Start())
	t.Cleanup(func() { c.Shutdown() })
	return c
}

func TestRocketMQClientSendsAndPushConsumerReceives(t *testing.T) {
	b := startBroker(t, nil)
	p := newProducer(t, b)
	ctx := context.Background()
	const topic = "interop"

	var sent []string
	for i := range 20 {
		body := fmt.Sprintf("sync-%d", i)
		m := primitive.NewMessage(topic, []byte(body)).WithTag([]string{"a", "b"}[i%2]).WithKeys([]string{fmt.Sprintf("k%d", i)})
		m.WithProperty("color", "blue")
		res, err := p.SendSync(ctx, m)
		require.NoError(t, err)
		require.Equal(t, primitive.SendOK, res.Status)
		sent = append(sent, body)
	}

	var wg sync.WaitGroup
	for i := range 10 {
		body := fmt.Sprintf("async-%d", i)
		wg.Add(1)
		err := p.SendAsync(ctx, func(ctx context.Context, res *primitive.SendResult, err error) {
			defer wg.Done()
			assert.NoError(t, err)
		}, primitive.NewMessage(topic, []byte(body)).WithTag("a"))
		require.NoError(t, err)
		sent = append(sent, body)
	}
	wg.Wait()

	var batch []*primitive.Message
	for i := range 10 {
		body := fmt.Sprintf("batch-%d", i)
		batch = append(batch, primitive.NewMessage(topic, []byte(body)).WithTag("b"))
		sent = append(sent, body)
	}
	res, err := p.SendSync(ctx, batch...)
	require.NoError(t, err)
	require.Equal(t, primitive.SendOK, res.Status)

	all := newReceived()
	newPushConsumer(t, b, "all-readers", topic, "*", all)
	all.waitFor(t, len(sent), 20*time.Second)
	for _, body := range sent {
		require.Contains(t, all.msgs, body)
	}
	m := all.msgs["sync-3"]
	assert.Equal(t, "b", m.GetTags())
	assert.Equal(t, "k3", m.GetKeys())
	assert.Equal(t, "blue", m.GetProperty("color"))
	assert.Equal(t, topic, m.Topic)

	onlyA := newReceived()
	newPushConsumer(t, b, "a-readers", topic, "a", onlyA)
	onlyA.waitFor(t, 20, 20*time.Second)
	time.Sleep(300 * time.Millisecond)
	onlyA.mu.Lock()
	defer onlyA.mu.Unlock()
	assert.Len(t, onlyA.msgs, 20, "10 sync with tag a and 10 async")
	for body, m := range onlyA.msgs {
		assert.Equal(t, "a", m.GetTags(), body)
	}
}

func sendN(t *testing.T, p rocketmq.Producer, topic, prefix string, n int) []string {
	t.Helper()
	var bodies []string
	for i := range n {
		body := fmt.Sprintf("%s-%d", prefix, i)
		res, err := p.SendSync(context.Background(), primitive.NewMessage(topic, []byte(body)))
		require.NoError(t, err)
		require.Equal(t, primitive.SendOK, res.Status)
		bodies = append(bodies, body)
	}
	return bodies
}

func TestRocketMQPullConsumerPollsEverything(t *testing.T) {
	b := startBroker(t, nil)
	p := newProducer(t, b)
	const topic = "polled"
	sent := sendN(t, p, topic, "m", 30)

	c, err := rocketmq.NewPullConsumer(
		rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver([]string{b.NamesrvAddr()})),
		rmqconsumer.WithGroupName("pollers"),
		rmqconsumer.WithInstance(instance(t)),
		rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset),
		rmqconsumer.WithPullBatchSize(8),
	)
	require.NoError(t, err)
	require.NoError(t, c.Subscribe(topic, rmqconsumer.MessageSelector{}))
	require.NoError(t, c.Start())
	t.Cleanup(func() { c.Shutdown() })

	got := map[string]bool{}
	deadline := time.Now().Add(20 * time.Second)
	for len(got) < len(sent) && time.Now().Before(deadline) {
		cr, err := c.Poll(context.Background(), time.Second)
		if err != nil {
			continue
		}
		for _, m := range cr.GetMsgList() {
			got[string(m.Body)] = true
		}
		c.ACK(context.Background(), cr, rmqconsumer.ConsumeSuccess)
	}
	for _, s := range sent {
		assert.True(t, got[s], s)
	}
}

func TestRocketMQCommittedOffsetsSurviveConsumerAndBrokerRestart(t *testing.T) {
	b := startBroker(t, nil)
	dir := b.cfg.DataDir
	p := newProducer(t, b)
	const topic, group = "durable", "durable-readers"
	first := sendN(t, p, topic, "first", 12)

	r1 := newReceived()
	c1 := newPushConsumer(t, b, group, topic, "*", r1)
	r1.waitFor(t, len(first), 20*time.Second)
	waitCommitted(t, b, group, topic, 4)
	require.NoError(t, c1.Shutdown())

	// A consumer restart reads only what came after.
	second := sendN(t, p, topic, "second", 8)
	r2 := newReceived()
	c2 := newPushConsumer(t, b, group, topic, "*", r2)
	r2.waitFor(t, len(second), 20*time.Second)
	waitCommitted(t, b, group, topic, 4)
	require.NoError(t, c2.Shutdown())
	time.Sleep(200 * time.Millisecond)
	assert.Len(t, r2.msgs, len(second))
	for _, s := range second {
		assert.Contains(t, r2.msgs, s)
	}

	// A broker restart keeps the committed offsets and the messages.
	b.stop(t)
	b2 := startBroker(t, func(c *broker.Config) { c.DataDir = dir })
	p2 := newProducer(t, b2)
	third := sendN(t, p2, topic, "third", 8)
	r3 := newReceived()
	newPushConsumer(t, b2, group, topic, "*", r3)
	r3.waitFor(t, len(third), 20*time.Second)
	time.Sleep(200 * time.Millisecond)
	r3.mu.Lock()
	defer r3.mu.Unlock()
	assert.Len(t, r3.msgs, len(third), "only messages after the committed offsets")
}

func TestRocketMQTwoPushConsumersSplitQueues(t *testing.T) {
	b := startBroker(t, nil)
	p := newProducer(t, b)
	const topic, group = "shared", "sharers"
	sendN(t, p, topic, "warm", 1) // creates the topic
	r1, r2 := newReceived(), newReceived()
	newPushConsumer(t, b, group, topic, "*", r1)
	newPushConsumer(t, b, group, topic, "*", r2)
	require.Eventually(t, func() bool { return len(b.GroupMembers(group)) == 2 }, 10*time.Second, 20*time.Millisecond)
	// The broker tells both members at once; wait until each reports two queues of its own
	// (a pull consumer without locks would otherwise briefly consume a queue with the other).
	require.Eventually(t, func() bool {
		owned := map[int]int{}
		for _, id := range b.GroupMembers(group) {
			info, err := b.ConsumerRunningInfo(context.Background(), group, id)
			if err != nil {
				return false
			}
			n := 0
			for mq := range info.MQTable {
				if mq.Topic == topic {
					owned[mq.QueueID]++
					n++
				}
			}
			if n != 2 {
				return false
			}
		}
		return len(owned) == 4
	}, 20*time.Second, 50*time.Millisecond, "the two consumers never split the queues")

	sent := sendN(t, p, topic, "m", 40)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		all := map[string]bool{}
		r1.mu.Lock()
		for k := range r1.msgs {
			all[k] = true
		}
		r1.mu.Unlock()
		r2.mu.Lock()
		for k := range r2.msgs {
			all[k] = true
		}
		r2.mu.Unlock()
		missing := 0
		for _, s := range sent {
			if !all[s] {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	queues := func(r *received) map[int]bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		qs := map[int]bool{}
		for body, m := range r.msgs {
			if body != "warm-0" {
				qs[m.Queue.QueueId] = true
			}
		}
		return qs
	}
	q1, q2 := queues(r1), queues(r2)
	assert.Len(t, q1, 2, "consumer 1 owns two of the four queues: %v", q1)
	assert.Len(t, q2, 2, "consumer 2 owns two of the four queues: %v", q2)
	for q := range q1 {
		assert.False(t, q2[q], "queue %d consumed by both", q)
	}
	assert.Equal(t, len(sent), len(r1.msgs)+len(r2.msgs)-boolInt(r1.msgs["warm-0"] != nil)-boolInt(r2.msgs["warm-0"] != nil))
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestRocketMQFailedConsumeGoesToRetryTopic(t *testing.T) {
	b := startBroker(t, nil)
	p := newProducer(t, b)
	const topic, group = "flaky", "retriers"
	sendN(t, p, topic, "m", 3)

	var mu sync.Mutex
	attempts := map[string][]int32{}
	done := make(chan struct{})
	c, err := rocketmq.NewPushConsumer(
		rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver([]string{b.NamesrvAddr()})),
		rmqconsumer.WithGroupName(group),
		rmqconsumer.WithInstance(instance(t)),
		rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset),
	)
	require.NoError(t, err)
	require.NoError(t, c.Subscribe(topic, rmqconsumer.MessageSelector{}, func(ctx context.Context, ms ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
		mu.Lock()
		defer mu.Unlock()
		result := rmqconsumer.ConsumeSuccess
		for _, m := range ms {
			body := string(m.Body)
			attempts[body] = append(attempts[body], m.ReconsumeTimes)
			if body == "m-1" && m.ReconsumeTimes < 2 {
				result = rmqconsumer.ConsumeRetryLater
			}
			if body == "m-1" && m.ReconsumeTimes == 2 {
				assert.Equal(t, topic, m.Topic, "a retried message shows its original topic")
				close(done)
			}
		}
		return result, nil
	}))
	require.NoError(t, c.Start())
	t.Cleanup(func() { c.Shutdown() })
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the failed message was not redelivered twice")
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []int32{0, 1, 2}, attempts["m-1"])
	assert.Equal(t, []int32{0}, attempts["m-0"])
	_, ok := b.Topic("%RETRY%" + group)
	assert.True(t, ok, "the retry topic exists")
}

func TestResetOffsetsRewindsLiveRocketMQConsumers(t *testing.T) {
	b := startBroker(t, nil)
	p := newProducer(t, b)
	const topic, group = "rewind", "rewinders"
	sent := sendN(t, p, topic, "m", 8)

	var mu sync.Mutex
	deliveries := map[string]int{}
	total := 0
	c, err := rocketmq.NewPushConsumer(
		rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver([]string{b.NamesrvAddr()})),
		rmqconsumer.WithGroupName(group),
		rmqconsumer.WithInstance(instance(t)),
		rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset),
	)
	require.NoError(t, err)
	require.NoError(t, c.Subscribe(topic, rmqconsumer.MessageSelector{}, func(ctx context.Context, ms ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range ms {
			deliveries[string(m.Body)]++
			total++
		}
		return rmqconsumer.ConsumeSuccess, nil
	}))
	require.NoError(t, c.Start())
	t.Cleanup(func() { c.Shutdown() })
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return total
	}
	require.Eventually(t, func() bool { return count() == len(sent) }, 20*time.Second, 10*time.Millisecond)

	members := b.GroupMembers(group)
	require.Len(t, members, 1)
	info, err := b.ConsumerRunningInfo(context.Background(), group, members[0])
	require.NoError(t, err)
	assert.NotEmpty(t, info.SubscriptionSet, "the client reports its subscriptions")

	table, err := b.ResetOffsets(context.Background(), group, topic, 0)
	require.NoError(t, err)
	assert.Len(t, table, 4)
	for mq, off := range table {
		assert.Equal(t, int64(0), off, mq.String())
	}
	require.Eventually(t, func() bool { return count() == 2*len(sent) }, 20*time.Second, 10*time.Millisecond, "every message is delivered again after the reset")
	mu.Lock()
	defer mu.Unlock()
	for _, s := range sent {
		assert.Equal(t, 2, deliveries[s], s)
	}
}

// waitCommitted waits until the group's committed offset of each of the topic's queues reaches
// the queue's end. The client commits with its pulls and every 5 s, so this is how long it
// takes a consumer that has consumed everything to say so.
func waitCommitted(t *testing.T, b *testBroker, group, topic string, queues int32) {
	t.Helper()
	for q := range queues {
		require.Eventually(t, func() bool {
			off, ok := b.CommittedOffset(group, topic, q)
			return ok && off == b.StoreMax(topic, q)
		}, 20*time.Second, 10*time.Millisecond, "queue %d's offset is committed", q)
	}
}
