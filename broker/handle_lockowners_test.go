package broker_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// TestLockOwnersAnswersTheGroupsLockTableOfOneTopic: GET_LOCK_OWNERS, flowd's extension,
// answers who holds which queue of the group's topic, other topics and groups left out.
func TestLockOwnersAnswersTheGroupsLockTableOfOneTopic(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	ctx := context.Background()
	q := func(topic string, id int) protocol.MessageQueue {
		return protocol.MessageQueue{Topic: topic, BrokerName: "broker-a", QueueID: id}
	}
	lock := func(group, client string, mqs ...protocol.MessageQueue) {
		body, err := protocol.MarshalBody(&protocol.LockBatchRequestBody{ConsumerGroup: group, ClientID: client, MQSet: mqs})
		require.NoError(t, err)
		require.Equal(t, protocol.Success, c.invoke(ctx, protocol.LockBatchMQ, nil, body).ResponseCode())
	}
	lock("g", "c1", q("t", 2), q("t", 0), q("other", 1))
	lock("g", "c2", q("t", 1), q("t", 0)) // q0 stays c1's
	lock("h", "c3", q("t", 3))

	owners := func(group, topic string) map[string][]protocol.MessageQueue {
		body, err := protocol.MarshalBody(&protocol.LockOwnersRequestBody{ConsumerGroup: group, Topic: topic})
		require.NoError(t, err)
		resp := c.invoke(ctx, protocol.GetLockOwners, nil, body)
		require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
		var out protocol.LockOwnersResponseBody
		require.NoError(t, protocol.UnmarshalBody(resp.Body, &out))
		require.NotNil(t, out.Owners)
		return out.Owners
	}
	assert.Equal(t, map[string][]protocol.MessageQueue{
		"c1": {q("t", 0), q("t", 2)},
		"c2": {q("t", 1)},
	}, owners("g", "t"))
	assert.Empty(t, owners("nobody", "t"))

	body, err := protocol.MarshalBody(&protocol.LockOwnersRequestBody{ConsumerGroup: "bad group", Topic: "t"})
	require.NoError(t, err)
	assert.Equal(t, protocol.InvalidParameter, c.invoke(ctx, protocol.GetLockOwners, nil, body).ResponseCode())
}
