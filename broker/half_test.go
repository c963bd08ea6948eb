package broker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// Transactional half messages must never be delivered; flowd has no transactions, so it
// refuses them, single or batched, and stores nothing.
func TestHalfMessagesAreRefusedAndNeverStored(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.createTopic("tx", 1)

	single := func(sysFlag int32, props map[string]string) *protocol.Command {
		h := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: "tx", SysFlag: sysFlag, BornTimestamp: time.Now().UnixMilli(), Properties: protocol.EncodeProperties(props)}
		return c.invoke(context.Background(), protocol.SendMessage, h, []byte("half"))
	}
	batch := func(sysFlag int32, props map[string]string) *protocol.Command {
		body, err := protocol.EncodeBatch([]*protocol.Message{{Topic: "tx", Body: []byte("b0")}, {Topic: "tx", Body: []byte("b1"), Properties: props}})
		require.NoError(t, err)
		h := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: "tx", SysFlag: sysFlag, BornTimestamp: time.Now().UnixMilli(), Batch: true}
		resp, err := c.cl.Invoke(context.Background(), b.Addr(), protocol.NewRequest(protocol.SendBatchMessage, h.EncodeV2(), body))
		require.NoError(t, err)
		return resp
	}
	tran := map[string]string{protocol.PropertyTransactionPrepared: "true"}
	for name, resp := range map[string]*protocol.Command{
		"prepared sysFlag":            single(protocol.MsgTransactionPrepared, nil),
		"prepared property":           single(0, tran),
		"rolled back":                 single(protocol.MsgTransactionRollback, nil),
		"prepared batch":              batch(protocol.MsgTransactionPrepared, nil),
		"batch with a prepared entry": batch(0, tran),
	} {
		require.Equal(t, protocol.NoPermission, resp.ResponseCode(), name)
		require.Contains(t, resp.Remark, "transactional messages are not supported", name)
	}

	// Nothing was stored: the next normal message is the queue's first.
	h := c.sendTo("tx", 0, "normal")
	require.Equal(t, int64(0), h.QueueOffset)
	// A committed transaction type is a normal message (what END_TRANSACTION would store).
	resp := single(protocol.MsgTransactionCommit, nil)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)

	// A refused half message to a topic that does not exist does not create it either.
	h2 := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: "tx-new", DefaultTopic: protocol.AutoCreateTopicKey, DefaultTopicQueueNums: 4, SysFlag: protocol.MsgTransactionPrepared, BornTimestamp: 1}
	resp = c.invoke(context.Background(), protocol.SendMessage, h2, []byte("half"))
	require.Equal(t, protocol.NoPermission, resp.ResponseCode())
	_, exists := b.Topic("tx-new")
	require.False(t, exists)
}
