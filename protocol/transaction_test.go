package protocol

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The fields as rocketmq-client-go writes them.
func TestEndTransactionHeaderReadsTheGoClientsFields(t *testing.T) {
	ext := map[string]string{
		"producerGroup": "g", "tranStateTableOffset": "12", "commitLogOffset": "3456", "commitOrRollback": "8",
		"fromTransactionCheck": "true", "msgId": "U1", "transactionId": "T1", "bname": "broker-a",
	}
	var h EndTransactionRequestHeader
	require.NoError(t, h.Decode(ext))
	assert.Equal(t, EndTransactionRequestHeader{ProducerGroup: "g", TranStateTableOffset: 12, CommitLogOffset: 3456, CommitOrRollback: MsgTransactionCommit,
		FromTransactionCheck: true, MsgID: "U1", TransactionID: "T1", BrokerName: "broker-a"}, h)
	assert.Equal(t, ext, h.Encode())

	delete(ext, "commitOrRollback")
	err := (&EndTransactionRequestHeader{}).Decode(ext)
	require.ErrorIs(t, err, ErrMissingField)
	assert.Equal(t, "END_TRANSACTION", EndTransaction.String())
	assert.Equal(t, "CHECK_TRANSACTION_STATE", CheckTransactionState.String())
}

func TestCheckTransactionStateHeaderRoundTrips(t *testing.T) {
	h := CheckTransactionStateRequestHeader{TranStateTableOffset: 7, CommitLogOffset: 99, MsgID: "U", TransactionID: "T", OffsetMsgID: "O"}
	var back CheckTransactionStateRequestHeader
	require.NoError(t, back.Decode(h.Encode()))
	assert.Equal(t, h, back)
	require.ErrorIs(t, back.Decode(map[string]string{"commitLogOffset": "1"}), ErrMissingField)
}
