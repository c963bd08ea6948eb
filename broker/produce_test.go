package broker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

func TestProduceRefusesWhatASendWould(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) { c.MaxMessageSize = 16 })
	require.NoError(t, b.CreateTopic(broker.TopicConfig{Name: "t", ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermRead | protocol.PermWrite}))
	ctx := context.Background()
	msg := func(topic, body string) broker.ProduceRequest {
		return broker.ProduceRequest{Message: protocol.Message{Topic: topic, Body: []byte(body)}, QueueID: -1}
	}
	_, err := b.Produce(ctx, msg("missing", "x"))
	require.ErrorIs(t, err, broker.ErrNotFound)
	_, err = b.Produce(ctx, msg("t", ""))
	require.ErrorIs(t, err, broker.ErrBadMessage)
	_, err = b.Produce(ctx, msg("t", strings.Repeat("x", 17)))
	require.ErrorIs(t, err, broker.ErrBadMessage)
	_, err = b.Produce(ctx, msg(protocol.TransactionHalfTopic, "x"))
	require.Error(t, err)
	r := msg("t", "x")
	r.QueueID = 5
	_, err = b.Produce(ctx, r)
	require.ErrorIs(t, err, broker.ErrNotFound)
	half := msg("t", "x")
	half.Half = true
	_, err = b.Produce(ctx, half)
	require.ErrorIs(t, err, broker.ErrBadMessage, "a half message needs its producer group")
}

func TestProduceHalfThenEndTransaction(t *testing.T) {
	b := startBroker(t, nil)
	require.NoError(t, b.CreateTopic(broker.TopicConfig{Name: "t", ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermRead | protocol.PermWrite}))
	ctx := context.Background()
	res, err := b.Produce(ctx, broker.ProduceRequest{
		Message: protocol.Message{Topic: "t", Body: []byte("tx"), Properties: map[string]string{protocol.PropertyUniqueKey: "U1"}},
		QueueID: -1, ProducerGroup: "pg", Half: true,
	})
	require.NoError(t, err)
	require.Equal(t, "U1", res.UniqKey)
	require.Equal(t, 1, b.PendingTransactions())
	end := broker.EndTransactionRequest{ProducerGroup: "pg", HalfOffset: res.HalfOffset, CommitLogOffset: res.CommitLogOffset, Outcome: broker.TransactionCommit}
	wrong := end
	wrong.ProducerGroup = "other"
	require.ErrorIs(t, b.EndTransaction(ctx, wrong), broker.ErrTransaction)
	require.NoError(t, b.EndTransaction(ctx, end))
	require.ErrorIs(t, b.EndTransaction(ctx, end), broker.ErrTransaction, "resolved once")
	require.Equal(t, 0, b.PendingTransactions())
	require.Eventually(t, func() bool {
		r, err := b.ReadQueue(ctx, "t", 0, 0, 10)
		return err == nil && len(r.Messages) == 1 && string(r.Messages[0].Body) == "tx"
	}, 5*time.Second, 10*time.Millisecond)
}
