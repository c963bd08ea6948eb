//go:build !race

package producer_test

import (
	"context"
	"fmt"
	"testing"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	rmqproducer "github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/producer"
)

// TestRocketMQResponderAnswersFlowdRequests: flowd's Request, answered by a responder built
// from rocketmq-client-go's push consumer, CreateReplyMessage and producer.
func TestRocketMQResponderAnswersFlowdRequests(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "rmq-service", 2)
	ns := primitive.NewPassthroughResolver([]string{b.NamesrvAddr()})
	rp, err := rocketmq.NewProducer(rmqproducer.WithNsResolver(ns), rmqproducer.WithGroupName("rmq-repliers"),
		rmqproducer.WithInstanceName(fmt.Sprint("rmq-replier-", seq.Add(1))), rmqproducer.WithRetry(2))
	require.NoError(t, err)
	require.NoError(t, rp.Start())
	t.Cleanup(func() { _ = rp.Shutdown() })
	rc, err := rocketmq.NewPushConsumer(rmqconsumer.WithNsResolver(ns), rmqconsumer.WithGroupName("rmq-responders"),
		rmqconsumer.WithInstance(fmt.Sprint("rmq-responder-", seq.Add(1))), rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset))
	require.NoError(t, err)
	require.NoError(t, rc.Subscribe("rmq-service", rmqconsumer.MessageSelector{}, func(ctx context.Context, ms ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
		for _, m := range ms {
			reply, err := rmqconsumer.CreateReplyMessage(m, nil)
			if err != nil {
				return rmqconsumer.ConsumeRetryLater, err
			}
			reply.Body = []byte("re:" + string(m.Body))
			if _, err := rp.SendSync(ctx, reply); err != nil {
				return rmqconsumer.ConsumeRetryLater, err
			}
		}
		return rmqconsumer.ConsumeSuccess, nil
	}))
	require.NoError(t, rc.Start())
	t.Cleanup(func() { _ = rc.Shutdown() })

	p := newProducer(t, b)
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		body := fmt.Sprintf("q%d", i)
		reply, err := p.Request(ctx, &producer.Message{Topic: "rmq-service", Body: []byte(body)})
		cancel()
		require.NoError(t, err, body)
		assert.Equal(t, "re:"+body, string(reply.Body))
	}
}

// TestRocketMQRequestsAnsweredByFlowdReply: rocketmq-client-go's Request, answered by a flowd
// responder's Reply.
func TestRocketMQRequestsAnsweredByFlowdReply(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "flowd-service", 2)
	respond(t, b, "flowd-service")
	rp, err := rocketmq.NewProducer(rmqproducer.WithNsResolver(primitive.NewPassthroughResolver([]string{b.NamesrvAddr()})),
		rmqproducer.WithGroupName("rmq-requesters"), rmqproducer.WithInstanceName(fmt.Sprint("rmq-requester-", seq.Add(1))), rmqproducer.WithRetry(2))
	require.NoError(t, err)
	require.NoError(t, rp.Start())
	t.Cleanup(func() { _ = rp.Shutdown() })
	for i := range 3 {
		body := fmt.Sprintf("q%d", i)
		reply, err := rp.Request(context.Background(), wait, primitive.NewMessage("flowd-service", []byte(body)))
		require.NoError(t, err, body)
		assert.Equal(t, "re:"+body, string(reply.Body))
	}
}
