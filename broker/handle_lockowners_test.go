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

// TestAllocatorMismatchOncePerChange: members report their allocator in the heartbeat; the
// lock-owners answer shows each member's, and the broker emits AllocatorMismatch when they
// start to differ, when the set of differing ones changes, and when they agree again, not at
// every heartbeat. A member that reports none (a RocketMQ client) is left out.
func TestAllocatorMismatchOncePerChange(t *testing.T) {
	b := startBroker(t, nil)
	events := make(chan broker.Event, 256)
	t.Cleanup(b.Subscribe(func(e broker.Event) { events <- e }))
	a, bb, rmq := newRawClient(t, b, nil), newRawClient(t, b, nil), newRawClient(t, b, nil)
	beat := func(c *rawClient, clientID, allocator string) { beatGroup(t, c, "g", clientID, allocator) }
	allocators := func() map[string]string {
		body, err := protocol.MarshalBody(&protocol.LockOwnersRequestBody{ConsumerGroup: "g", Topic: "t"})
		require.NoError(t, err)
		resp := a.invoke(context.Background(), protocol.GetLockOwners, nil, body)
		require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
		var out protocol.LockOwnersResponseBody
		require.NoError(t, protocol.UnmarshalBody(resp.Body, &out))
		return out.Allocators
	}
	// next returns the next AllocatorMismatch event, or the sentinel group's join.
	next := func() broker.Event {
		t.Helper()
		for {
			select {
			case e := <-events:
				if e.Type == broker.AllocatorMismatch || (e.Type == broker.MemberJoined && e.Group == "sentinel") {
					return e
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no AllocatorMismatch event")
			}
		}
	}

	beat(a, "c1", "WASM-x@1")
	beat(bb, "c2", "WASM-x@1")
	beat(rmq, "c3", "") // a RocketMQ client: says nothing
	beat(a, "c1", "WASM-x@1")
	assert.Equal(t, map[string]string{"c1": "WASM-x@1", "c2": "WASM-x@1", "c3": ""}, allocators())

	beat(bb, "c2", "WASM-x@2")
	e := next()
	assert.Equal(t, "g", e.Group)
	assert.Equal(t, map[string]string{"c1": "WASM-x@1", "c2": "WASM-x@2"}, e.Allocators)
	beat(bb, "c2", "WASM-x@2")
	beat(a, "c1", "WASM-x@1")
	assert.Equal(t, map[string]string{"c1": "WASM-x@1", "c2": "WASM-x@2", "c3": ""}, allocators())

	bb.cl.Close()
	e = next()
	assert.Equal(t, "agreed", e.Reason)
	assert.Equal(t, map[string]string{"c1": "WASM-x@1"}, e.Allocators)
	beat(a, "c1", "WASM-x@1")
	// Events come out in order: once the sentinel's join is out, so is any event before it.
	beatGroup(t, a, "sentinel", "c9", "")
	e = next()
	assert.Equal(t, broker.MemberJoined, e.Type, "one event per change, not per heartbeat: %+v", e)
}

func beatGroup(t *testing.T, c *rawClient, group, clientID, allocator string) {
	t.Helper()
	hb := protocol.HeartbeatData{ClientID: clientID, ConsumerDataSet: []protocol.ConsumerData{{
		GroupName: group, ConsumeType: protocol.ConsumeActively, MessageModel: protocol.Clustering,
		ConsumeFromWhere: protocol.ConsumeFromFirstOffset, Allocator: allocator,
	}}}
	body, err := hb.Encode()
	require.NoError(t, err)
	resp := c.invoke(context.Background(), protocol.HeartBeat, nil, body)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
}
