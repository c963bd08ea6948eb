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

func newReceived() *received { return &received{msgs: map[string]*primitive.MessageExt{}, ch: make(chan struct{}, 1)} }

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
