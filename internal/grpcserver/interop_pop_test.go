//go:build !race

// Without -race, as the other tests of rocketmq-client-go (interop_test.go).

package grpcserver_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	rmqproducer "github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/require"
)

func TestInteropRocketMQProducerToGRPCConsumer(t *testing.T) {
	e := start(t, withNamesrv)
	e.topic(t, "interop-4to5", 2)
	p, err := rocketmq.NewProducer(
		rmqproducer.WithNsResolver(primitive.NewPassthroughResolver([]string{e.b.NamesrvAddr()})),
		rmqproducer.WithGroupName("p-4x"), rmqproducer.WithInstanceName(t.Name()),
	)
	require.NoError(t, err)
	require.NoError(t, p.Start())
	t.Cleanup(func() { _ = p.Shutdown() })
	sent := map[string]string{}
	for i := range 10 {
		m := primitive.NewMessage("interop-4to5", []byte("b"+strconv.Itoa(i))).WithTag("t" + strconv.Itoa(i%2)).WithKeys([]string{"k" + strconv.Itoa(i)})
		m.WithProperty("n", strconv.Itoa(i))
		r, err := p.SendSync(context.Background(), m)
		require.NoError(t, err)
		sent[r.MsgID] = strconv.Itoa(i)
	}
	got := e.receiveN(t, recv{group: "g5", topic: "interop-4to5"}, 10)
	for _, m := range got {
		i, found := sent[m.SystemProperties.MessageId]
		require.True(t, found, "the 4.x message id (UNIQ_KEY) is the 5.x message id")
		require.Equal(t, "b"+i, string(m.Body))
		n, _ := strconv.Atoi(i)
		require.Equal(t, "t"+strconv.Itoa(n%2), m.SystemProperties.GetTag())
		require.Equal(t, []string{"k" + i}, m.SystemProperties.Keys)
		require.Equal(t, i, m.UserProperties["n"])
	}
}
