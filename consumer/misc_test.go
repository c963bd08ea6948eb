package consumer_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/protocol"
)

func TestTopicCreatedAfterSubscribe(t *testing.T) {
	b := startBroker(t, nil)
	c := newConsumer(t, b, "late-group", consumer.WithTopicMetadataCheckInterval(100*time.Millisecond),
		consumer.WithRebalanceInterval(time.Minute), consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
	require.NoError(t, c.Subscribe("late-topic", "*"))
	require.NoError(t, c.Start(context.Background()))
	assert.Empty(t, c.Assignment())
	createTopic(t, b, "late-topic", 2)
	require.Eventually(t, func() bool { return len(c.ActiveQueues()) == 2 }, wait, 10*time.Millisecond)
}

// A subscribed topic that does not exist yet is asked for again on a short backoff: once it
// is created it is read without waiting for a metadata check, a rebalance or a route refresh.
func TestTopicCreatedAfterStartIsReadPromptly(t *testing.T) {
	b := startBroker(t, nil)
	c := newConsumer(t, b, "prompt-group", consumer.WithTopicMetadataCheckInterval(time.Hour),
		consumer.WithRebalanceInterval(time.Hour), consumer.WithClientOptions(client.WithRouteRefreshInterval(time.Hour)),
		consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
	require.NoError(t, c.Subscribe("prompt-topic", "*"))
	require.NoError(t, c.Start(context.Background()))
	// The consumer has looked for the topic and settled without it.
	require.Eventually(t, func() bool { return c.Rebalances() > 0 && !c.Settling() }, wait, time.Millisecond)
	assert.Empty(t, c.Assignment())
	createTopic(t, b, "prompt-topic", 2)
	require.Eventually(t, func() bool { return len(c.ActiveQueues()) == 2 }, wait, 10*time.Millisecond)
}

func TestResetOffsetAndRunningInfo(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "reset", 1)
	p := newProducer(t, b)
	sent := produceTo(t, p, queues[0], "r", 10, nil)
	c := newConsumer(t, b, "reset-group", consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
	require.NoError(t, c.Subscribe("reset", "*"))
	require.NoError(t, c.Start(context.Background()))
	require.Equal(t, sent, bodies(pollN(t, c, 10, wait)))

	c.Hooks().ResetOffset("reset", map[protocol.MessageQueue]int64{queues[0]: 6})
	require.Equal(t, sent[6:], bodies(pollN(t, c, 4, wait)))

	info := c.Hooks().RunningInfo()
	assert.Equal(t, "CLUSTERING", info.Properties["messageModel"])
	assert.Equal(t, "AVG", info.Properties["allocateMessageQueueStrategy"])
	require.Len(t, info.SubscriptionSet, 2, "the topic, and the group's retry topic (as RocketMQ's clustering consumers)")
	assert.Equal(t, "%RETRY%reset-group", info.SubscriptionSet[0].Topic)
	assert.Equal(t, "reset", info.SubscriptionSet[1].Topic)
	pq := info.MQTable[queues[0]]
	assert.EqualValues(t, 10, pq.CommitOffset)
	assert.True(t, pq.Locked)
	_, err := info.Encode()
	require.NoError(t, err)
}

func TestNoGoroutineLeak(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "leak", 4)
	p := newProducer(t, b)
	produceTo(t, p, queues[0], "warm-up", 1, nil) // the producer's connections are not the consumer's
	// A goroutine of the warm-up that has not ended yet only makes the check more lenient.
	before := runtime.NumGoroutine()
	for range 3 {
		c, err := consumer.NewLitePull("leak-group", fastOpts(b)...)
		require.NoError(t, err)
		require.NoError(t, c.Subscribe("leak", "*"))
		require.NoError(t, c.Start(context.Background()))
		require.Eventually(t, func() bool { return len(c.ActiveQueues()) == 4 }, wait, 10*time.Millisecond)
		produceTo(t, p, queues[0], "x", 3, nil)
		pollN(t, c, 3, wait)
		require.NoError(t, c.Close(context.Background()))
	}
	ok := assert.Eventually(t, func() bool { return runtime.NumGoroutine() <= before+2 }, wait, 20*time.Millisecond,
		"goroutines: before %d, now %d", before, runtime.NumGoroutine())
	if !ok {
		buf := make([]byte, 1<<20)
		t.Logf("%s", buf[:runtime.Stack(buf, true)])
	}
}

// TestManySeeksDoNotPileUpParkedPulls: a pull parked by the broker cannot be withdrawn, and a
// connection with 256 requests in flight is refused everything. Seeking an idle queue over and
// over must not leave a parked pull behind each time.
func TestManySeeksDoNotPileUpParkedPulls(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "seeks", 1)
	p := newProducer(t, b)
	produceTo(t, p, queues[0], "old", 1, nil)
	c := newConsumer(t, b, "seeks-group", consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
	require.NoError(t, c.Assign(queues))
	require.NoError(t, c.Start(context.Background()))
	require.Len(t, pollN(t, c, 1, wait), 1)
	ctx := context.Background()
	for range 300 {
		require.NoError(t, c.SeekToEnd(ctx, queues[0]))
		time.Sleep(100 * time.Microsecond)
	}
	produceTo(t, p, queues[0], "new", 1, nil)
	got := pollN(t, c, 1, wait)
	require.Len(t, got, 1)
	assert.Equal(t, "new-0", string(got[0].Body))
	require.NoError(t, c.Commit(ctx), "the connection still takes requests")
}

// TestNewQueueOfExistingGroupStartsAtFirstMessage: a topic gains queues while a group reads
// it, and messages land in the new queues before the group's rebalance reaches them. The
// group has no stored offset for those queues (the broker answers QUERY_NOT_FOUND), but it is
// not new to the topic: with ConsumeFromLast it must start them at their first message, not
// at their max offset, or it skips what was written into them.
func TestNewQueueOfExistingGroupStartsAtFirstMessage(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "grow", 2)
	const group = "grow-group"
	c := newConsumer(t, b, group, consumer.WithTopicMetadataCheckInterval(time.Hour),
		consumer.WithClientOptions(client.WithRouteRefreshInterval(time.Hour)), consumer.WithRebalanceInterval(time.Hour))
	require.NoError(t, c.Subscribe("grow", "*"))
	require.NoError(t, c.Start(context.Background()))
	require.Eventually(t, func() bool { return len(c.ActiveQueues()) == 2 }, wait, 5*time.Millisecond)
	require.NoError(t, c.Commit(context.Background()))

	queues := createTopic(t, b, "grow", 4)
	require.Equal(t, int64(-1), brokerOffset(t, b, group, queues[2]))
	p := newProducer(t, b)
	early := append(produceTo(t, p, queues[2], "early-2", 2, nil), produceTo(t, p, queues[3], "early-3", 2, nil)...)

	// The store dispatches asynchronously: wait until the new queues' max offsets count the
	// messages, or a start at the max offset would not skip them.
	require.Eventually(t, func() bool { return b.StoreMax("grow", 2) == 2 && b.StoreMax("grow", 3) == 2 }, wait, time.Millisecond)

	got, err := c.FetchMessageQueues(context.Background(), "grow") // the consumer learns of the new queues
	require.NoError(t, err)
	require.Len(t, got, 4)
	assert.Equal(t, sorted(early), sortedBodies(pollN(t, c, len(early), wait)))
}
