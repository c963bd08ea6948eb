//go:build !race

package broker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	rmqproducer "github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
)

// txListener decides each local transaction by the message body, and answers check-backs
// with checkState.
type txListener struct {
	mu       sync.Mutex
	local    map[string]primitive.LocalTransactionState
	checked  []string
	executed []string
}

func (l *txListener) ExecuteLocalTransaction(m *primitive.Message) primitive.LocalTransactionState {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.executed = append(l.executed, string(m.Body))
	return l.local[string(m.Body)]
}

func (l *txListener) CheckLocalTransaction(m *primitive.MessageExt) primitive.LocalTransactionState {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.checked = append(l.checked, string(m.Body))
	return primitive.CommitMessageState
}

func (l *txListener) checks() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.checked...)
}

func TestRocketMQTransactionProducerCommitRollbackAndCheckBack(t *testing.T) {
	b := startBroker(t, func(cfg *broker.Config) {
		cfg.TransactionTimeout = 100 * time.Millisecond
		cfg.TransactionCheckInterval = 50 * time.Millisecond
	})
	c := newRawClient(t, b, nil)
	c.createTopic("tx-interop", 1)
	l := &txListener{local: map[string]primitive.LocalTransactionState{
		"commit":   primitive.CommitMessageState,
		"rollback": primitive.RollbackMessageState,
		"unknown":  primitive.UnkonwnState,
	}}
	p, err := rocketmq.NewTransactionProducer(l,
		rmqproducer.WithNsResolver(primitive.NewPassthroughResolver([]string{b.NamesrvAddr()})),
		rmqproducer.WithGroupName("tx-producers"),
		rmqproducer.WithInstanceName(instance(t)),
		rmqproducer.WithRetry(2),
	)
	require.NoError(t, err)
	require.NoError(t, p.Start())
	t.Cleanup(func() { _ = p.Shutdown() })

	for _, body := range []string{"commit", "rollback", "unknown"} {
		res, err := p.SendMessageInTransaction(context.Background(), primitive.NewMessage("tx-interop", []byte(body)))
		require.NoError(t, err, body)
		require.Equal(t, primitive.SendOK, res.Status, body)
	}
	// The commit is delivered at once; the unknown one after the broker checked it back.
	require.Eventually(t, func() bool { return b.StoreMax("tx-interop", 0) == 2 }, 20*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return b.PendingTransactions() == 0 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, []string{"unknown"}, l.checks()[:1], "only the unknown transaction is checked back")
	for _, body := range l.checks() {
		assert.Equal(t, "unknown", body)
	}
	assert.ElementsMatch(t, []string{"commit", "unknown"}, c.pullBodies("raw-group", "tx-interop", 0))
}
