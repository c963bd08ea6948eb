//go:build !race

package broker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rocketmq-client-go's push consumer subscribes with MessageSelector{Type: SQL92}; flowd
// evaluates it on the messages' properties and delivers only the matches.
func TestRocketMQPushConsumerWithASQL92Selector(t *testing.T) {
	b := startBroker(t, nil)
	p := newProducer(t, b)
	const topic = "interop-sql"
	for i := range 30 {
		m := primitive.NewMessage(topic, []byte(fmt.Sprintf("m-%d", i))).WithTag([]string{"a", "b", "c"}[i%3])
		m.WithProperty("n", fmt.Sprint(i))
		res, err := p.SendSync(context.Background(), m)
		require.NoError(t, err)
		require.Equal(t, primitive.SendOK, res.Status)
	}

	r := newReceived()
	c, err := rocketmq.NewPushConsumer(
		rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver([]string{b.NamesrvAddr()})),
		rmqconsumer.WithGroupName("sql-readers"),
		rmqconsumer.WithInstance(instance(t)),
		rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset),
	)
	require.NoError(t, err)
	require.NoError(t, c.Subscribe(topic, rmqconsumer.MessageSelector{Type: rmqconsumer.SQL92, Expression: "TAGS = 'a' AND n >= 15"},
		func(ctx context.Context, ms ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
			r.add(ms...)
			return rmqconsumer.ConsumeSuccess, nil
		}))
	require.NoError(t, c.Start())
	t.Cleanup(func() { c.Shutdown() })

	r.waitFor(t, 5, 20*time.Second) // n = 15, 18, 21, 24, 27
	r.mu.Lock()
	defer r.mu.Unlock()
	var bodies []string
	for body, m := range r.msgs {
		bodies = append(bodies, body)
		assert.Equal(t, "a", m.GetTags())
	}
	assert.ElementsMatch(t, []string{"m-15", "m-18", "m-21", "m-24", "m-27"}, bodies)
}
