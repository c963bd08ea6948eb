package broker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

func TestSendAndReadQueue(t *testing.T) {
	b := startBroker(t, nil)
	ctx := context.Background()
	require.NoError(t, b.CreateTopic(broker.TopicConfig{Name: "orders", ReadQueueNums: 2, WriteQueueNums: 2, Perm: protocol.PermRead | protocol.PermWrite}))

	var sent []broker.SendResult
	for _, body := range []string{"a", "b", "c"} {
		r, err := b.Send(ctx, protocol.Message{Topic: "orders", Body: []byte(body), Properties: map[string]string{"region": "eu"}}, 1)
		require.NoError(t, err)
		sent = append(sent, r)
	}
	assert.Equal(t, []int64{0, 1, 2}, []int64{sent[0].QueueOffset, sent[1].QueueOffset, sent[2].QueueOffset})
	assert.Len(t, sent[0].UniqKey, 32)
	require.Eventually(t, func() bool { return b.StoreMax("orders", 1) == 3 }, 10*time.Second, 5*time.Millisecond)

	m, err := b.MessageByID(sent[1].MsgID)
	require.NoError(t, err)
	assert.Equal(t, "b", string(m.Body))
	assert.Equal(t, sent[1].UniqKey, m.Properties[protocol.PropertyUniqueKey])
	assert.Equal(t, "eu", m.Properties["region"])
	assert.NotEmpty(t, m.Properties[protocol.PropertyCluster], "stamped as a producer's send is")

	rd, err := b.ReadQueue(ctx, "orders", 1, 1, 5)
	require.NoError(t, err)
	require.Len(t, rd.Messages, 2)
	assert.Equal(t, "b", string(rd.Messages[0].Body))
	assert.Equal(t, int64(3), rd.Next)
	assert.Equal(t, int64(3), rd.Max)

	off, err := b.OffsetByTime("orders", 1, 0)
	require.NoError(t, err)
	assert.Equal(t, int64(0), off)

	_, err = b.ReadQueue(ctx, "orders", 2, 0, 1)
	assert.ErrorIs(t, err, broker.ErrNotFound)
	_, err = b.ReadQueue(ctx, "nope", 0, 0, 1)
	assert.ErrorIs(t, err, broker.ErrNotFound)
	_, err = b.Send(ctx, protocol.Message{Topic: "nope", Body: []byte("x")}, -1)
	assert.ErrorIs(t, err, broker.ErrNotFound)
	_, err = b.Send(ctx, protocol.Message{Topic: "orders"}, -1)
	assert.ErrorIs(t, err, broker.ErrBadMessage)
	_, err = b.Send(ctx, protocol.Message{Topic: "orders", Body: []byte("x"), Properties: map[string]string{protocol.PropertyDelayLevel: "2"}}, -1)
	assert.ErrorIs(t, err, broker.ErrBadMessage)
	_, err = b.Send(ctx, protocol.Message{Topic: broker.ScheduleTopic, Body: []byte("x")}, -1)
	assert.Error(t, err)
}
