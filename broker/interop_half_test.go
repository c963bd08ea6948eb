//go:build !race

package broker_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	rmqproducer "github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/require"
)

// txListener counts the local transactions the client runs: it runs one only after the
// broker accepted the half message.
type txListener struct{ executed atomic.Int32 }

func (l *txListener) ExecuteLocalTransaction(*primitive.Message) primitive.LocalTransactionState {
	l.executed.Add(1)
	return primitive.CommitMessageState
}

func (l *txListener) CheckLocalTransaction(*primitive.MessageExt) primitive.LocalTransactionState {
	return primitive.CommitMessageState
}

func TestRocketMQTransactionProducerIsRefusedAndNothingIsDelivered(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.createTopic("tx-interop", 2)
	l := &txListener{}
	p, err := rocketmq.NewTransactionProducer(l,
		rmqproducer.WithNsResolver(primitive.NewPassthroughResolver([]string{b.NamesrvAddr()})),
		rmqproducer.WithGroupName("tx-producers"),
		rmqproducer.WithInstanceName(instance(t)),
		rmqproducer.WithRetry(2),
	)
	require.NoError(t, err)
	require.NoError(t, p.Start())
	t.Cleanup(func() { p.Shutdown() })

	_, err = p.SendMessageInTransaction(context.Background(), primitive.NewMessage("tx-interop", []byte("half")))
	require.Error(t, err)
	require.Contains(t, err.Error(), "transactional messages are not supported")
	require.Zero(t, l.executed.Load(), "no local transaction runs for a refused half message")
	for q := range int32(2) {
		require.Zero(t, b.StoreMax("tx-interop", q), "queue %d", q)
	}
	// Nothing reaches a reader either: a normal message is the first one stored.
	h := c.sendTo("tx-interop", 0, "normal")
	require.Zero(t, h.QueueOffset)
}
