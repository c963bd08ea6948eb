//go:build !race

// rocketmq-client-go races on its own state (its Shutdown against an in-flight rebalance, its
// orderly consumer's process queue), which the race detector reports against whichever test
// is running. The interop tests therefore run without -race: .ci/run runs them in a pass of
// their own. flowd's side of every path they cover is race-tested by the tests that use
// flowd's transport and clients.

package producer_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/producer"
)

// TestInteropRocketMQPushConsumerReads: what flowd's producer sends (single, async, batch,
// compressed, tagged), rocketmq-client-go's push consumer receives intact.
func TestInteropRocketMQPushConsumerReads(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "to-rmq", 4)
	p := newProducer(t, b)
	ctx := context.Background()
	want := map[string]bool{}
	ids := map[string]string{}
	for i := range 10 {
		body := fmt.Sprint("sync-", i)
		res, err := p.Send(ctx, &producer.Message{Topic: "to-rmq", Body: []byte(body), Tags: "a", Keys: []string{fmt.Sprint("k", i)}, Properties: map[string]string{"color": "red"}})
		require.NoError(t, err)
		want[body], ids[body] = true, res.MsgID
	}
	big := strings.Repeat("zzzz ", 4000)
	_, err := p.Send(ctx, &producer.Message{Topic: "to-rmq", Body: []byte(big), Tags: "big"})
	require.NoError(t, err)
	want[big] = true
	var batch []*producer.Message
	for i := range 5 {
		body := fmt.Sprint("batch-", i)
		batch = append(batch, &producer.Message{Topic: "to-rmq", Body: []byte(body), Tags: "b"})
		want[body] = true
	}
	_, err = p.SendBatch(ctx, batch...)
	require.NoError(t, err)

	var mu sync.Mutex
	got := map[string]*primitive.MessageExt{}
	c, err := rocketmq.NewPushConsumer(
		rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver([]string{b.NamesrvAddr()})),
		rmqconsumer.WithGroupName("rmq-readers"),
		rmqconsumer.WithInstance(fmt.Sprint(t.Name(), seq.Add(1))),
		rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset),
	)
	require.NoError(t, err)
	require.NoError(t, c.Subscribe("to-rmq", rmqconsumer.MessageSelector{Type: rmqconsumer.TAG, Expression: "*"},
		func(ctx context.Context, ms ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
			mu.Lock()
			defer mu.Unlock()
			for _, m := range ms {
				got[string(m.Body)] = m
			}
			return rmqconsumer.ConsumeSuccess, nil
		}))
	require.NoError(t, c.Start())
	defer c.Shutdown()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == len(want)
	}, 20*time.Second, 20*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for body := range want {
		require.Contains(t, got, body)
	}
	m := got["sync-3"]
	assert.Equal(t, "a", m.GetTags())
	assert.Equal(t, "k3", m.GetKeys())
	assert.Equal(t, "red", m.GetProperty("color"))
	assert.Equal(t, ids["sync-3"], m.MsgId, "the Go client reads our UNIQ_KEY as the message id")
	assert.Equal(t, "big", got[big].GetTags())
	assert.Equal(t, "b", got["batch-2"].GetTags())
}
