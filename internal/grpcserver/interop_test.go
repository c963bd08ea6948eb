package grpcserver_test

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

func withNamesrv(c *broker.Config) { c.NamesrvListen = "127.0.0.1:0" }

// sendTagged sends n messages over gRPC, as a 5.x producer does, with a tag, a key, a user
// property and the client's own message id.
func sendTagged(t *testing.T, e *env, topic string, n int) map[string]*pb.Message {
	t.Helper()
	sent := map[string]*pb.Message{}
	ctx := callCtx(t, "p-interop")
	for i := range n {
		id := "01" + strconv.Itoa(100000+i)
		m := message(topic, id, "body-"+strconv.Itoa(i))
		m.SystemProperties.Tag = strp("tag" + strconv.Itoa(i%2))
		m.SystemProperties.Keys = []string{"key-" + strconv.Itoa(i)}
		m.UserProperties = map[string]string{"n": strconv.Itoa(i)}
		resp, err := e.client.SendMessage(ctx, &pb.SendMessageRequest{Messages: []*pb.Message{m}})
		require.NoError(t, err)
		require.Equal(t, pb.Code_OK, resp.Status.Code, resp.Status.Message)
		sent[id] = m
	}
	return sent
}

func TestInteropGRPCProducerToRocketMQPushConsumer(t *testing.T) {
	rlog.SetLogLevel("fatal")
	e := start(t, withNamesrv)
	e.topic(t, "interop-5to4", 2)
	sent := sendTagged(t, e, "interop-5to4", 10)

	var mu sync.Mutex
	got := map[string]*primitive.MessageExt{}
	c, err := rocketmq.NewPushConsumer(
		rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver([]string{e.b.NamesrvAddr()})),
		rmqconsumer.WithGroupName("push-4x"),
		rmqconsumer.WithInstance(t.Name()),
		rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset),
	)
	require.NoError(t, err)
	require.NoError(t, c.Subscribe("interop-5to4", rmqconsumer.MessageSelector{Type: rmqconsumer.TAG, Expression: "*"},
		func(_ context.Context, ms ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
			mu.Lock()
			defer mu.Unlock()
			for _, m := range ms {
				got[m.MsgId] = m
			}
			return rmqconsumer.ConsumeSuccess, nil
		}))
	require.NoError(t, c.Start())
	t.Cleanup(func() { _ = c.Shutdown() })
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == len(sent) }, 30*time.Second, 50*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for id, m := range sent {
		r := got[id]
		require.NotNil(t, r, "the 4.x consumer sees the 5.x message id %s", id)
		require.Equal(t, string(m.Body), string(r.Body))
		require.Equal(t, m.SystemProperties.GetTag(), r.GetTags())
		require.Equal(t, m.SystemProperties.Keys[0], r.GetKeys())
		require.Equal(t, m.UserProperties["n"], r.GetProperty("n"))
	}
}

func TestInteropGRPCProducerToLitePullConsumer(t *testing.T) {
	e := start(t, withNamesrv)
	e.topic(t, "interop-5tolite", 2)
	sent := sendTagged(t, e, "interop-5tolite", 10)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := client.New(client.WithNameServers(e.b.NamesrvAddr()), client.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	require.NoError(t, err)
	defer cl.Close(context.Background())
	c, err := consumer.NewLitePull("lite", consumer.WithClient(cl), consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
	require.NoError(t, err)
	require.NoError(t, c.Subscribe("interop-5tolite", "tag1"))
	require.NoError(t, c.Start(ctx))
	defer c.Close(context.Background())
	got := map[string]*consumer.Message{}
	for len(got) < 5 && ctx.Err() == nil {
		msgs, err := c.Poll(ctx)
		require.NoError(t, err)
		for _, m := range msgs {
			got[m.MsgID] = m
		}
	}
	require.Len(t, got, 5, "the tag filter selects the tag1 half")
	for id, m := range got {
		s := sent[id]
		require.NotNil(t, s)
		require.Equal(t, "tag1", m.Tags)
		require.Equal(t, s.SystemProperties.Keys, m.Keys)
		require.Equal(t, s.UserProperties["n"], m.Property("n"))
		require.Equal(t, string(s.Body), string(m.Body))
	}
}
