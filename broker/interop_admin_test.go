//go:build !race

package broker_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	rmqadmin "github.com/apache/rocketmq-client-go/v2/admin"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	rmqproducer "github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

func TestRocketMQAdminCreatesListsAndDeletesTopics(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) { c.Cluster = "adm-cluster" })
	a, err := rmqadmin.NewAdmin(rmqadmin.WithResolver(primitive.NewPassthroughResolver([]string{b.NamesrvAddr()})))
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	ctx := context.Background()

	require.NoError(t, a.CreateTopic(ctx, rmqadmin.WithTopicCreate("adm-topic"), rmqadmin.WithBrokerAddrCreate(b.Addr()),
		rmqadmin.WithReadQueueNums(3), rmqadmin.WithWriteQueueNums(3)))
	queues, err := b.TopicQueues("adm-topic")
	require.NoError(t, err, "the admin client created the topic")
	assert.Len(t, queues, 3)

	list, err := a.FetchAllTopicList(ctx)
	require.NoError(t, err)
	assert.Contains(t, list.TopicList, "adm-topic")
	assert.Contains(t, list.TopicList, protocol.ReplyTopic("adm-cluster"))

	mqs, err := a.FetchPublishMessageQueues(ctx, "adm-topic")
	require.NoError(t, err)
	assert.Len(t, mqs, 3)
	clusters, err := a.FetchClusterList("adm-topic")
	require.NoError(t, err)
	assert.Equal(t, []string{"adm-cluster"}, clusters)

	// Subscription groups: one created by a consumer's heartbeat, one by the admin request.
	c := newRawClient(t, b, nil)
	c.consumerHeartbeat("adm-client", "adm-group", "adm-topic")
	groups, err := a.GetAllSubscriptionGroup(ctx, b.Addr(), 3*time.Second)
	require.NoError(t, err)
	require.Contains(t, groups.SubscriptionGroupTable, "adm-group")
	assert.Equal(t, "adm-group", groups.SubscriptionGroupTable["adm-group"].GroupName)
	assert.True(t, groups.SubscriptionGroupTable["adm-group"].ConsumeEnable)

	require.NoError(t, a.DeleteTopic(ctx, rmqadmin.WithTopicDelete("adm-topic"), rmqadmin.WithBrokerAddrDelete(b.Addr()),
		rmqadmin.WithNameSrvAddr([]string{b.NamesrvAddr()})))
	_, err = b.TopicQueues("adm-topic")
	assert.ErrorIs(t, err, broker.ErrNotFound)
	list, err = a.FetchAllTopicList(ctx)
	require.NoError(t, err)
	assert.NotContains(t, list.TopicList, "adm-topic")
}

// replier starts a push consumer of topic that answers every request with "re:<body>",
// sending the reply with a RocketMQ producer as RocketMQ's request-reply examples do.
func replier(t *testing.T, b *testBroker, topic string) {
	t.Helper()
	ns := primitive.NewPassthroughResolver([]string{b.NamesrvAddr()})
	p, err := rocketmq.NewProducer(rmqproducer.WithNsResolver(ns), rmqproducer.WithGroupName("repliers"),
		rmqproducer.WithInstanceName(instance(t)), rmqproducer.WithRetry(2))
	require.NoError(t, err)
	require.NoError(t, p.Start())
	t.Cleanup(func() { _ = p.Shutdown() })
	c, err := rocketmq.NewPushConsumer(rmqconsumer.WithNsResolver(ns), rmqconsumer.WithGroupName("responders"),
		rmqconsumer.WithInstance(instance(t)), rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset))
	require.NoError(t, err)
	require.NoError(t, c.Subscribe(topic, rmqconsumer.MessageSelector{}, func(ctx context.Context, ms ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
		for _, m := range ms {
			reply, err := rmqconsumer.CreateReplyMessage(m, nil)
			if err != nil {
				return rmqconsumer.ConsumeRetryLater, err
			}
			reply.Body = []byte("re:" + string(m.Body))
			if _, err := p.SendSync(ctx, reply); err != nil {
				return rmqconsumer.ConsumeRetryLater, err
			}
		}
		return rmqconsumer.ConsumeSuccess, nil
	}))
	require.NoError(t, c.Start())
	t.Cleanup(func() { _ = c.Shutdown() })
}

func TestRocketMQRequestReplyThroughFlowd(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.createTopic("rr-service", 2)
	replier(t, b, "rr-service")

	p, err := rocketmq.NewProducer(rmqproducer.WithNsResolver(primitive.NewPassthroughResolver([]string{b.NamesrvAddr()})),
		rmqproducer.WithGroupName("requesters"), rmqproducer.WithInstanceName(instance(t)), rmqproducer.WithRetry(2))
	require.NoError(t, err)
	require.NoError(t, p.Start())
	t.Cleanup(func() { _ = p.Shutdown() })

	for i := range 3 {
		body := fmt.Sprintf("q%d", i)
		reply, err := p.Request(context.Background(), 15*time.Second, primitive.NewMessage("rr-service", []byte(body)))
		require.NoError(t, err, body)
		assert.Equal(t, "re:"+body, string(reply.Body))
		assert.NotEmpty(t, reply.GetProperty(protocol.PropertyCorrelationID))
	}

	// rocketmq-client-go runs an async request's callback twice (once for the reply, once
	// more when it drops the request from its table), so replies are counted distinct.
	got := make(chan string, 16)
	for i := range 3 {
		body := fmt.Sprintf("async%d", i)
		err := p.RequestAsync(context.Background(), 15*time.Second, func(_ context.Context, m *primitive.Message, err error) {
			if err != nil {
				got <- "error: " + err.Error()
				return
			}
			got <- string(m.Body)
		}, primitive.NewMessage("rr-service", []byte(body)))
		require.NoError(t, err)
	}
	var replies []string
	for len(replies) < 3 {
		select {
		case r := <-got:
			if !slices.Contains(replies, r) {
				replies = append(replies, r)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("only %d async replies: %v", len(replies), replies)
		}
	}
	slices.Sort(replies)
	assert.Equal(t, []string{"re:async0", "re:async1", "re:async2"}, replies)
}
