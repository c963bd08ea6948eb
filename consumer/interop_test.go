//go:build !race

// rocketmq-client-go races on its own state (its Shutdown against an in-flight rebalance, its
// orderly consumer's process queue), which the race detector reports against whichever test
// is running. The interop tests therefore run without -race: .ci/run runs them in a pass of
// their own. flowd's side of every path they cover is race-tested by the tests that use
// flowd's transport and clients.

package consumer_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
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
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/consumer/allocate"
	"github.com/flowd-io/flowd/protocol"
)

func rmqProducer(t *testing.T, b *broker.Broker) rocketmq.Producer {
	t.Helper()
	p, err := rocketmq.NewProducer(
		rmqproducer.WithNsResolver(primitive.NewPassthroughResolver([]string{b.NamesrvAddr()})),
		rmqproducer.WithGroupName("rmq-producers"),
		rmqproducer.WithInstanceName(uniqueName(t)),
		rmqproducer.WithRetry(2),
	)
	require.NoError(t, err)
	require.NoError(t, p.Start())
	t.Cleanup(func() { p.Shutdown() })
	return p
}

// TestInteropReadsRocketMQProducer: what rocketmq-client-go's producer sends, flowd's
// consumer reads, tags, keys, properties and compressed bodies included.
func TestInteropReadsRocketMQProducer(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "from-rmq", 4)
	p := rmqProducer(t, b)
	ctx := context.Background()
	want := map[string]*primitive.Message{}
	for i := range 20 {
		body := fmt.Sprintf("sync-%d", i)
		m := primitive.NewMessage("from-rmq", []byte(body)).WithTag([]string{"a", "b"}[i%2]).WithKeys([]string{fmt.Sprint("k", i)})
		m.WithProperty("color", "green")
		res, err := p.SendSync(ctx, m)
		require.NoError(t, err)
		require.Equal(t, primitive.SendOK, res.Status)
		want[body] = m
	}
	big := strings.Repeat("compressible ", 1000) // the Go client compresses bodies over 4 KiB
	_, err := p.SendSync(ctx, primitive.NewMessage("from-rmq", []byte(big)).WithTag("big"))
	require.NoError(t, err)
	var batch []*primitive.Message
	for i := range 5 {
		batch = append(batch, primitive.NewMessage("from-rmq", []byte(fmt.Sprint("batch-", i))).WithTag("a"))
	}
	_, err = p.SendSync(ctx, batch...)
	require.NoError(t, err)

	c := newConsumer(t, b, "reads-rmq", consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
	require.NoError(t, c.Subscribe("from-rmq", "a || big"))
	require.NoError(t, c.Start(ctx))
	got := pollN(t, c, 16, wait)
	assert.Empty(t, pollFor(t, c, 200*time.Millisecond))
	require.Len(t, got, 16, "10 sync tagged a, 5 batch, 1 big")
	for _, m := range got {
		body := string(m.Body)
		switch {
		case body == big:
			assert.Equal(t, "big", m.Tags)
		case strings.HasPrefix(body, "batch-"):
			assert.Equal(t, "a", m.Tags)
		default:
			sent := want[body]
			require.NotNil(t, sent, body)
			assert.Equal(t, "a", m.Tags)
			assert.Equal(t, []string{sent.GetKeys()}, m.Keys)
			assert.Equal(t, "green", m.Property("color"))
			assert.Len(t, m.MsgID, 32, "the Go client's UNIQ_KEY")
		}
	}
}

// TestInteropMixedGroupSplitsQueues: a group of one flowd LitePull and one rocketmq-client-go
// push consumer shares the topic averagely: each reads its share and nothing else.
func TestInteropMixedGroupSplitsQueues(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "mixed", 8)
	const group = "mixed-group"

	var mu sync.Mutex
	goQueues := map[int]int{}
	goConsumer, err := rocketmq.NewPushConsumer(
		rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver([]string{b.NamesrvAddr()})),
		rmqconsumer.WithGroupName(group),
		rmqconsumer.WithInstance(uniqueName(t)),
	)
	require.NoError(t, err)
	require.NoError(t, goConsumer.Subscribe("mixed", rmqconsumer.MessageSelector{Type: rmqconsumer.TAG, Expression: "*"},
		func(ctx context.Context, ms ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
			mu.Lock()
			defer mu.Unlock()
			for _, m := range ms {
				if strings.HasPrefix(string(m.Body), "after-") {
					goQueues[m.Queue.QueueId]++
				}
			}
			return rmqconsumer.ConsumeSuccess, nil
		}))
	require.NoError(t, goConsumer.Start())
	// Shut it down before the flowd member leaves (deferred calls run before cleanups): the
	// Go client's Shutdown races with a rebalance that a notification starts (a data race
	// inside rocketmq-client-go).
	defer goConsumer.Shutdown()

	c := newConsumer(t, b, group, consumer.WithRebalanceInterval(time.Minute))
	require.NoError(t, c.Subscribe("mixed", "*"))
	require.NoError(t, c.Start(context.Background()))

	// flowd's member settles on its averagely share among the two members.
	var ids []string
	require.Eventually(t, func() bool {
		ids = groupMembers(t, b, group)
		return len(ids) == 2
	}, wait, 20*time.Millisecond)
	share, err := allocate.Averagely().Allocate(context.Background(), allocate.Request{Group: group, ClientID: c.ClientID(), Queues: queues, ClientIDs: ids})
	require.NoError(t, err)
	require.Len(t, share, 4)
	require.Eventually(t, func() bool { return slices.Equal(c.ActiveQueues(), share) }, wait, 10*time.Millisecond)
	// The Go client rebalances on the notification of our join: wait until its process
	// queues (which it reports in its running info) are the other half.
	goID := ids[0]
	if goID == c.ClientID() {
		goID = ids[1]
	}
	var goShare []int
	for _, q := range queues {
		if !slices.Contains(share, q) {
			goShare = append(goShare, q.QueueID)
		}
	}
	require.Eventually(t, func() bool {
		info, err := b.ConsumerRunningInfo(context.Background(), group, goID)
		if err != nil {
			return false
		}
		var held []int
		for q := range info.MQTable {
			held = append(held, q.QueueID)
		}
		slices.Sort(held)
		return slices.Equal(held, goShare)
	}, wait, 20*time.Millisecond, "the Go client gave up flowd's share")

	p := newProducer(t, b)
	for _, q := range queues {
		produceTo(t, p, q, fmt.Sprintf("after-q%d", q.QueueID), 5, nil)
	}
	flowdQueues := map[int]int{}
	got := pollN(t, c, 5*len(share), wait)
	got = append(got, pollFor(t, c, 200*time.Millisecond)...) // anything more would be a bug
	for _, m := range got {
		flowdQueues[m.Queue.QueueID]++
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, v := range goQueues {
			n += v
		}
		return n >= 20
	}, wait, 20*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	want := map[int]int{}
	for _, q := range share {
		want[q.QueueID] = 5
	}
	assert.Equal(t, want, flowdQueues, "flowd reads exactly its averagely share")
	for qid := range goQueues {
		assert.NotContains(t, flowdQueues, qid, "queue %d read by both members", qid)
	}
	all := slices.Sorted(maps.Keys(goQueues))
	all = append(all, slices.Sorted(maps.Keys(flowdQueues))...)
	slices.Sort(all)
	assert.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, all, "together they read every queue, each once")
}

func groupMembers(t *testing.T, b *broker.Broker, group string) []string {
	a := admin(t, b)
	h := protocol.GetConsumerListByGroupRequestHeader{ConsumerGroup: group}
	resp, err := a.InvokeOK(context.Background(), b.Addr(), protocol.NewRequestWith(protocol.GetConsumerListByGroup, &h, nil))
	require.NoError(t, err)
	var body protocol.ConsumerListBody
	require.NoError(t, protocol.UnmarshalBody(resp.Body, &body))
	slices.Sort(body.ConsumerIDList)
	return body.ConsumerIDList
}
