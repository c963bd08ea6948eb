//go:build !race

// rocketmq-client-go races on its own state, which the race detector reports against
// whichever test is running (see broker/interop_test.go): these tests run in .ci/run's
// interop pass, without -race.

package grpcserver_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/stretchr/testify/require"
)

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
