package clientcore

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// A pushed reply goes to the call waiting for its correlation id, once; replies nobody waits
// for are answered with success and dropped.
func TestPushedReplyGoesToTheWaitingRequest(t *testing.T) {
	c, err := New(Options{NameServers: []string{"127.0.0.1:1"}, Logger: quietLogger()})
	require.NoError(t, err)
	defer c.Close(context.Background())
	push := func(corr, body string) *protocol.Command {
		h := &protocol.ReplyMessageRequestHeader{
			ProducerGroup: "g", Topic: "c_REPLY_TOPIC", QueueID: 0, StoreTimestamp: 42,
			Properties: protocol.EncodeProperties(map[string]string{protocol.PropertyCorrelationID: corr}),
			BornHost:   "127.0.0.1:1", StoreHost: "127.0.0.1:2",
		}
		return c.serve(context.Background(), nil, protocol.NewRequestWith(protocol.PushReplyMessageToClient, h, []byte(body)))
	}
	replies, cancel := c.ExpectReply("corr-1")
	other, cancelOther := c.ExpectReply("corr-2")
	defer cancelOther()

	require.Equal(t, protocol.Success, push("corr-1", "answer").ResponseCode())
	require.Equal(t, protocol.Success, push("corr-1", "duplicate").ResponseCode())
	require.Equal(t, protocol.Success, push("nobody", "stray").ResponseCode())
	m := <-replies
	assert.Equal(t, "answer", string(m.Body))
	assert.Equal(t, "c_REPLY_TOPIC", m.Topic)
	assert.Equal(t, int64(42), m.StoreTimestamp)
	assert.Equal(t, "127.0.0.1:2", m.StoreHost.String())
	assert.Empty(t, replies, "the duplicate was dropped")
	assert.Empty(t, other, "another call's channel got nothing")
	cancel()

	// A cancelled call gets nothing, and a bad header is refused.
	_, cancel3 := c.ExpectReply("corr-3")
	cancel3()
	require.Equal(t, protocol.Success, push("corr-3", "late").ResponseCode())
	bad := protocol.NewRequest(protocol.PushReplyMessageToClient, map[string]string{}, nil)
	assert.Equal(t, protocol.InvalidParameter, c.serve(context.Background(), nil, bad).ResponseCode())
	c.mu.Lock()
	assert.Len(t, c.replies, 1, "only corr-2 is waiting")
	c.mu.Unlock()
}
