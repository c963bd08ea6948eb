package consumer_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/consumer/allocate"
	"github.com/flowd-io/flowd/protocol"
)

// avoidStrategy gives every queue to the first member that is not avoid (when there is one):
// a test decides which member a rebalance takes the queues from.
type avoidStrategy struct{ avoid atomic.Value }

func (*avoidStrategy) Name() string { return "AVOID" }

func (s *avoidStrategy) Allocate(_ context.Context, req allocate.Request) ([]protocol.MessageQueue, error) {
	owner := req.ClientIDs[0]
	for _, id := range req.ClientIDs {
		if id != s.avoid.Load() {
			owner = id
			break
		}
	}
	if req.ClientID != owner {
		return []protocol.MessageQueue{}, nil
	}
	return append([]protocol.MessageQueue(nil), req.Queues...), nil
}

// TestRevokeHookRunsBeforeTheHandOver: a rebalance takes a queue from a member that commits
// by hand. Its revoke function is called while it still holds the queue's lock and the new
// owner does not read it yet, and a commit made there is what the new owner starts from.
func TestRevokeHookRunsBeforeTheHandOver(t *testing.T) {
	b := startBroker(t, nil)
	mq := createTopic(t, b, "revoke", 1)[0]
	const group = "revoke-group"
	p := newProducer(t, b)
	sent := produceTo(t, p, mq, "m", 5, nil)

	strategy := &avoidStrategy{}
	strategy.avoid.Store("")
	type call struct {
		queues     []consumer.MessageQueue
		lockHolder string
		newReads   bool
		commitErr  error
	}
	calls := make(chan call, 4)
	var old, next *consumer.LitePull
	var nextReady atomic.Bool
	old = newConsumer(t, b, group, consumer.WithAllocateStrategy(strategy), consumer.WithAutoCommit(false),
		consumer.WithConsumeFrom(consumer.ConsumeFromFirst),
		consumer.WithOnQueuesRevoked(func(ctx context.Context, queues []consumer.MessageQueue) {
			if !slices.Contains(queues, mq) {
				return // the group's retry topic, also handed over
			}
			c := call{queues: queues, lockHolder: b.LockedQueues(group)[mq]}
			if nextReady.Load() {
				c.newReads = slices.Contains(next.ActiveQueues(), mq)
			}
			c.commitErr = old.CommitOffsets(ctx, map[consumer.MessageQueue]int64{mq: int64(len(sent))})
			calls <- c
		}))
	require.NoError(t, old.Subscribe("revoke", "*"))
	require.NoError(t, old.Start(context.Background()))
	require.Equal(t, sent, bodies(pollN(t, old, len(sent), wait)))
	require.Equal(t, int64(-1), brokerOffset(t, b, group, mq), "nothing committed yet")

	strategy.avoid.Store(old.ClientID())
	next = newConsumer(t, b, group, consumer.WithAllocateStrategy(strategy), consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
	nextReady.Store(true)
	require.NoError(t, next.Subscribe("revoke", "*"))
	require.NoError(t, next.Start(context.Background()))

	var got call
	select {
	case got = <-calls:
	case <-time.After(wait):
		t.Fatal("the revoke function was not called")
	}
	assert.Equal(t, []consumer.MessageQueue{mq}, got.queues)
	assert.Equal(t, old.ClientID(), got.lockHolder, "still locked by the old owner")
	assert.False(t, got.newReads, "the new owner does not read it yet")
	require.NoError(t, got.commitErr)

	require.Eventually(t, func() bool { return slices.Contains(next.ActiveQueues(), mq) }, wait, 5*time.Millisecond)
	assert.Equal(t, int64(len(sent)), brokerOffset(t, b, group, mq))
	later := produceTo(t, p, mq, "later", 2, nil)
	assert.Equal(t, later, bodies(pollN(t, next, len(later), wait)), "the new owner starts at the commit made in the hook")
}

// TestSendBackRedeliversThroughTheRetryTopic: a message sent back comes back through the
// group's retry topic, which the consumer reads along with its subscription, with its
// original topic and one more attempt counted; past the maximum number of attempts it goes to
// the dead-letter topic.
func TestSendBackRedeliversThroughTheRetryTopic(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) { c.DelayLevels = "100ms 200ms 300ms" })
	mq := createTopic(t, b, "retried", 1)[0]
	const group = "retry-group"
	p := newProducer(t, b)
	produceTo(t, p, mq, "fails", 1, nil)

	c := newConsumer(t, b, group, consumer.WithConsumeFrom(consumer.ConsumeFromFirst), consumer.WithMaxReconsumeTimes(1))
	require.NoError(t, c.Subscribe("retried", "*"))
	require.NoError(t, c.Start(context.Background()))
	first := pollN(t, c, 1, wait)
	require.Len(t, first, 1)
	require.NoError(t, c.SendBack(context.Background(), first[0], 1))

	again := pollN(t, c, 1, wait)
	require.Len(t, again, 1, "redelivered")
	m := again[0]
	assert.Equal(t, "fails-0", string(m.Body))
	assert.Equal(t, "retried", m.Topic, "the original topic")
	assert.Equal(t, "%RETRY%"+group, m.Queue.Topic)
	assert.Equal(t, int32(1), m.ReconsumeTimes)
	assert.Equal(t, first[0].MsgID, m.MsgID)

	// One attempt allowed: sent back again, it is dead-lettered, not retried.
	require.NoError(t, c.SendBack(context.Background(), m, 1))
	require.Eventually(t, func() bool { return b.StoreMax("%DLQ%"+group, 0) == 1 }, wait, 5*time.Millisecond)
	assert.Empty(t, pollFor(t, c, 300*time.Millisecond), "not redelivered")
}
