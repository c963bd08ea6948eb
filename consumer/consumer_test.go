package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/protocol"
)

func TestStateStrings(t *testing.T) {
	assert.Equal(t, "CREATE_JUST", consumer.CreateJust.String())
	assert.Equal(t, "RUNNING", consumer.Running.String())
	assert.Equal(t, "START_FAILED", consumer.StartFailed.String())
	assert.Equal(t, "SHUTDOWN_ALREADY", consumer.ShutdownAlready.String())
	assert.Equal(t, "CLUSTERING", consumer.Clustering.String())
	assert.Equal(t, "BROADCASTING", consumer.Broadcasting.String())
	assert.Equal(t, "CONSUME_FROM_FIRST_OFFSET", consumer.ConsumeFromFirst.String())
}

func TestOptionValidation(t *testing.T) {
	ns := consumer.WithClientOptions(client.WithNameServers("127.0.0.1:1"))
	for name, opts := range map[string][]consumer.Option{
		"no name servers":       nil,
		"auto-commit too often": {ns, consumer.WithAutoCommitInterval(500 * time.Millisecond)},
		"suspend not below":     {ns, consumer.WithBrokerSuspend(5 * time.Second), consumer.WithSuspendedPullTimeout(5 * time.Second)},
		"batch too large":       {ns, consumer.WithPullBatchSize(2000)},
		"zero goroutines":       {ns, consumer.WithPullGoroutines(0)},
		"renew too slow":        {ns, consumer.WithLockLease(3 * time.Second), consumer.WithLockRenewInterval(2 * time.Second)},
		"nil strategy":          {ns, consumer.WithAllocateStrategy(nil)},
		"bad model":             {ns, consumer.WithMessageModel(7)},
	} {
		_, err := consumer.NewLitePull("g", opts...)
		assert.ErrorIs(t, err, consumer.ErrInvalidOption, name)
	}
	_, err := consumer.NewLitePull("", ns)
	assert.ErrorIs(t, err, consumer.ErrInvalidArgument)
}

func TestLifecycle(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "life", 2)
	c := newConsumer(t, b, "life-group")
	assert.Equal(t, consumer.CreateJust, c.State())
	_, err := c.Poll(context.Background())
	require.ErrorIs(t, err, consumer.ErrNotRunning)
	require.NoError(t, c.Subscribe("life", "*"))
	require.NoError(t, c.Start(context.Background()))
	assert.Equal(t, consumer.Running, c.State())
	require.ErrorIs(t, c.Start(context.Background()), consumer.ErrBadState)
	assert.Equal(t, consumer.Running, c.State(), "a second Start leaves the consumer running")
	assert.Contains(t, c.ClientID(), "@")
	assert.Equal(t, "life-group", c.Group())

	require.NoError(t, c.Close(context.Background()))
	assert.Equal(t, consumer.ShutdownAlready, c.State())
	_, err = c.Poll(context.Background())
	require.ErrorIs(t, err, consumer.ErrNotRunning)
	require.ErrorIs(t, c.Start(context.Background()), consumer.ErrBadState)
	require.NoError(t, c.Close(context.Background()), "shutting down twice is harmless")

	// The broker no longer lists it.
	a := admin(t, b)
	h := protocol.GetConsumerListByGroupRequestHeader{ConsumerGroup: "life-group"}
	resp, err := a.InvokeOK(context.Background(), b.Addr(), protocol.NewRequestWith(protocol.GetConsumerListByGroup, &h, nil))
	require.NoError(t, err)
	var body protocol.ConsumerListBody
	require.NoError(t, protocol.UnmarshalBody(resp.Body, &body))
	assert.Empty(t, body.ConsumerIDList)
}

func TestStartFailure(t *testing.T) {
	b := startBroker(t, nil)
	shared, err := client.New(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet()))
	require.NoError(t, err)
	defer shared.Close(context.Background())
	c1, err := consumer.NewLitePull("dup", consumer.WithClient(shared))
	require.NoError(t, err)
	require.NoError(t, c1.Start(context.Background()))
	defer c1.Close(context.Background())
	c2, err := consumer.NewLitePull("dup", consumer.WithClient(shared))
	require.NoError(t, err)
	err = c2.Start(context.Background())
	require.ErrorIs(t, err, client.ErrGroupRegistered)
	assert.Equal(t, consumer.StartFailed, c2.State())
	require.ErrorIs(t, c2.Start(context.Background()), consumer.ErrBadState)
	assert.Equal(t, c1.ClientID(), c2.ClientID(), "a shared client core means one client id")
}

func TestSubscribeAndAssignAreExclusive(t *testing.T) {
	b := startBroker(t, nil)
	c := newConsumer(t, b, "excl")
	require.NoError(t, c.Subscribe("t", "*"))
	require.ErrorIs(t, c.Assign([]consumer.MessageQueue{{Topic: "t", BrokerName: "broker-a"}}), consumer.ErrSubscribeAndAssign)
	require.NoError(t, c.Unsubscribe("t"))
	require.NoError(t, c.Assign([]consumer.MessageQueue{{Topic: "t", BrokerName: "broker-a"}}))
	require.ErrorIs(t, c.Subscribe("t", "*"), consumer.ErrSubscribeAndAssign)
	require.ErrorIs(t, c.Subscribe("", "*"), consumer.ErrInvalidArgument)
	require.ErrorIs(t, c.SubscribeSelector("t", nil), consumer.ErrInvalidArgument)
}

func TestSubscribePollMessageFields(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "fields", 4)
	p := newProducer(t, b)
	start := time.Now()
	sent := produce(t, p, "fields", "m", 40, func(i int, m *producer.Message) {
		m.Tags = []string{"a", "b"}[i%2]
		m.Keys = []string{fmt.Sprintf("k%d", i), "common"}
		m.Properties = map[string]string{"color": "blue", "i": fmt.Sprint(i)}
	})
	big := strings.Repeat("x", 10<<10) // compressed by the producer
	res, err := p.Send(context.Background(), &producer.Message{Topic: "fields", Body: []byte(big), Tags: "big"})
	require.NoError(t, err)

	c := newConsumer(t, b, "fields-group", consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
	require.NoError(t, c.Subscribe("fields", "*"))
	require.NoError(t, c.Start(context.Background()))
	got := pollN(t, c, 41, wait)
	require.Len(t, got, 41)
	assert.Equal(t, sorted(append(slices.Clone(sent), big)), sortedBodies(got))
	assert.Equal(t, queues, c.Assignment())

	perQueue := map[int][]int64{}
	for _, m := range got {
		assert.Equal(t, "fields", m.Topic)
		assert.Equal(t, m.Topic, m.Queue.Topic)
		perQueue[m.Queue.QueueID] = append(perQueue[m.Queue.QueueID], m.QueueOffset)
		assert.Len(t, m.MsgID, 32)
		assert.Equal(t, m.Properties()[protocol.PropertyUniqueKey], m.MsgID)
		assert.NotEqual(t, m.MsgID, m.OffsetMsgID)
		host, off, err := protocol.ParseOffsetMsgID(m.OffsetMsgID)
		require.NoError(t, err)
		assert.Equal(t, m.CommitLogOffset, off)
		assert.Equal(t, b.Addr(), host.String())
		assert.False(t, m.BornTimestamp.Before(start.Truncate(time.Millisecond)))
		assert.False(t, m.StoreTimestamp.Before(m.BornTimestamp.Add(-time.Second)))
		if string(m.Body) == big {
			assert.Equal(t, res.MsgID, m.MsgID)
			assert.Equal(t, "big", m.Tags)
			continue
		}
		var i int
		_, err = fmt.Sscanf(string(m.Body), "m-%d", &i)
		require.NoError(t, err)
		assert.Equal(t, []string{"a", "b"}[i%2], m.Tags)
		assert.Equal(t, []string{fmt.Sprintf("k%d", i), "common"}, m.Keys)
		assert.Equal(t, "blue", m.Property("color"))
		assert.Equal(t, fmt.Sprint(i), m.Property("i"))
	}
	for qid, offs := range perQueue {
		assert.True(t, slices.IsSorted(offs), "queue %d in order", qid)
		for i, off := range offs {
			assert.EqualValues(t, i, off, "queue %d has no gap", qid)
		}
	}
	// Nothing more.
	assert.Empty(t, pollFor(t, c, 300*time.Millisecond))
}

func TestTagFilterRechecksCollisions(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "tags", 2)
	p := newProducer(t, b)
	// "Aa" and "BB" have the same Java hash code: the broker cannot tell them apart.
	require.Equal(t, protocol.TagsCode("Aa"), protocol.TagsCode("BB"))
	produce(t, p, "tags", "m", 30, func(i int, m *producer.Message) { m.Tags = []string{"Aa", "BB", "c"}[i%3] })

	c := newConsumer(t, b, "tags-group", consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
	require.NoError(t, c.Subscribe("tags", " Aa || c ||"))
	require.NoError(t, c.Start(context.Background()))
	got := pollN(t, c, 20, wait)
	require.Len(t, got, 20)
	for _, m := range got {
		assert.Contains(t, []string{"Aa", "c"}, m.Tags)
	}
	// The offsets move past the filtered messages too, once they are pulled: up to 15 per
	// queue, with nothing more handed out.
	var extra []*consumer.Message
	committed := func() []int64 {
		require.NoError(t, c.Commit(context.Background()))
		var offs []int64
		for _, mq := range c.Assignment() {
			off, err := c.Committed(context.Background(), mq)
			require.NoError(t, err)
			offs = append(offs, off)
		}
		return offs
	}
	for deadline := time.Now().Add(wait); !slices.Equal(committed(), []int64{15, 15}); {
		require.True(t, time.Now().Before(deadline), "committed offsets %v, want 15 each", committed())
		extra = append(extra, pollFor(t, c, 50*time.Millisecond)...)
	}
	assert.Empty(t, extra)
}

func TestCommitAndCommitted(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "commit", 2)
	p := newProducer(t, b)
	produceTo(t, p, queues[0], "a", 10, nil)
	// The store makes messages readable asynchronously: with all ten readable, the first
	// pull brings a full batch of four.
	require.Eventually(t, func() bool { return b.StoreMax("commit", 0) == 10 }, wait, time.Millisecond)
	c := newConsumer(t, b, "commit-group", consumer.WithConsumeFrom(consumer.ConsumeFromFirst), consumer.WithAutoCommit(false), consumer.WithPullBatchSize(4))
	require.NoError(t, c.Subscribe("commit", "*"))
	require.NoError(t, c.Start(context.Background()))
	ctx := context.Background()

	off, err := c.Committed(ctx, queues[0])
	require.NoError(t, err)
	assert.EqualValues(t, -1, off, "nothing committed yet")
	got := pollN(t, c, 4, wait)
	require.Len(t, got, 4)
	require.NoError(t, c.Commit(ctx))
	assert.EqualValues(t, 4, brokerOffset(t, b, "commit-group", queues[0]))

	// A commit never moves the offset back, unless a seek went back first.
	require.NoError(t, c.CommitOffsets(ctx, map[consumer.MessageQueue]int64{queues[0]: 2}))
	assert.EqualValues(t, 4, brokerOffset(t, b, "commit-group", queues[0]))
	require.NoError(t, c.Seek(ctx, queues[0], 2))
	require.NoError(t, c.CommitOffsets(ctx, map[consumer.MessageQueue]int64{queues[0]: 2}))
	off, err = c.Committed(ctx, queues[0])
	require.NoError(t, err)
	assert.EqualValues(t, 2, off)
	err = c.CommitOffsets(ctx, map[consumer.MessageQueue]int64{{Topic: "other", BrokerName: "broker-a"}: 1})
	require.ErrorIs(t, err, consumer.ErrNotAssigned)

	// Without auto-commit, polling does not commit: not the pulls of the six, nor the pull of
	// one more message, sent after them.
	pollN(t, c, 6, wait)
	produceTo(t, p, queues[0], "b", 1, nil)
	require.Len(t, pollN(t, c, 1, wait), 1)
	assert.EqualValues(t, 2, brokerOffset(t, b, "commit-group", queues[0]))
}

// TestConcurrentCommitsOnlyMoveForward commits increasing offsets of one queue from many
// goroutines at once: whatever order the calls run in, the broker ends at the highest.
func TestConcurrentCommitsOnlyMoveForward(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "monotonic", 1)
	const n = 64
	produceTo(t, newProducer(t, b), queues[0], "m", n, nil)
	c := newConsumer(t, b, "monotonic-group", consumer.WithConsumeFrom(consumer.ConsumeFromFirst), consumer.WithAutoCommit(false))
	require.NoError(t, c.Subscribe("monotonic", "*"))
	require.NoError(t, c.Start(context.Background()))
	require.Eventually(t, func() bool { return len(c.ActiveQueues()) == 1 }, wait, time.Millisecond)
	ctx := context.Background()
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := 1; i <= n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			assert.NoError(t, c.CommitOffsets(ctx, map[consumer.MessageQueue]int64{queues[0]: int64(i)}))
		}()
	}
	close(start)
	wg.Wait()
	assert.EqualValues(t, n, brokerOffset(t, b, "monotonic-group", queues[0]))
	// Commit (of what Poll handed out: nothing yet) does not move it back either.
	require.NoError(t, c.Commit(ctx))
	assert.EqualValues(t, n, brokerOffset(t, b, "monotonic-group", queues[0]))
}

func TestAutoCommit(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "auto", 1)
	p := newProducer(t, b)
	produceTo(t, p, queues[0], "a", 25, nil)
	c := newConsumer(t, b, "auto-group", consumer.WithConsumeFrom(consumer.ConsumeFromFirst),
		consumer.WithAutoCommitInterval(time.Second))
	require.NoError(t, c.Subscribe("auto", "*"))
	require.NoError(t, c.Start(context.Background()))
	got := pollN(t, c, 25, wait)
	require.Len(t, got, 25)
	// Committed by the timer: nothing else commits while the consumer runs.
	require.Eventually(t, func() bool { return brokerOffset(t, b, "auto-group", queues[0]) == 25 }, wait, 50*time.Millisecond)
}

func TestCommittedOffsetsSurviveRestart(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "restart", 2)
	p := newProducer(t, b)
	sent := append(produceTo(t, p, queues[0], "a", 20, nil), produceTo(t, p, queues[1], "b", 20, nil)...)

	c1 := newConsumer(t, b, "restart-group", consumer.WithConsumeFrom(consumer.ConsumeFromFirst), consumer.WithPullBatchSize(5))
	require.NoError(t, c1.Subscribe("restart", "*"))
	require.NoError(t, c1.Start(context.Background()))
	first := pollN(t, c1, 15, wait)
	require.GreaterOrEqual(t, len(first), 15)
	require.NoError(t, c1.Close(context.Background())) // commits what was polled

	c2 := newConsumer(t, b, "restart-group", consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
	require.NoError(t, c2.Subscribe("restart", "*"))
	require.NoError(t, c2.Start(context.Background()))
	rest := pollN(t, c2, len(sent)-len(first), wait)
	assert.Equal(t, sorted(sent), sorted(append(bodies(first), bodies(rest)...)), "every message exactly once across the restart")
	assert.Empty(t, pollFor(t, c2, 200*time.Millisecond))
}

func TestConsumeFrom(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "from", 1)
	p := newProducer(t, b)
	early := produceTo(t, p, queues[0], "early", 5, nil)
	time.Sleep(30 * time.Millisecond)
	mark := time.Now()
	time.Sleep(30 * time.Millisecond)
	late := produceTo(t, p, queues[0], "late", 5, nil)

	start := func(group string, opts ...consumer.Option) *consumer.LitePull {
		c := newConsumer(t, b, group, opts...)
		require.NoError(t, c.Subscribe("from", "*"))
		require.NoError(t, c.Start(context.Background()))
		return c
	}
	first := start("from-first", consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
	assert.Equal(t, sorted(append(slices.Clone(early), late...)), sortedBodies(pollN(t, first, 10, wait)))

	ts := start("from-ts", consumer.WithConsumeFrom(consumer.ConsumeFromTimestamp), consumer.WithConsumeTimestamp(mark))
	assert.Equal(t, sorted(late), sortedBodies(pollN(t, ts, 5, wait)))

	last := start("from-last") // the default
	require.Eventually(t, func() bool { return len(last.ActiveQueues()) == 1 }, wait, 10*time.Millisecond)
	assert.Empty(t, pollFor(t, last, 200*time.Millisecond))
	newer := produceTo(t, p, queues[0], "newer", 3, nil)
	assert.Equal(t, newer, bodies(pollN(t, last, 3, wait)))

	// A stored offset wins over consume-from.
	require.NoError(t, first.Close(context.Background()))
	again := start("from-first", consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
	assert.Equal(t, newer, bodies(pollN(t, again, 3, wait)))

	// The default timestamp is 30 minutes ago: everything here.
	dflt := start("from-ts-default", consumer.WithConsumeFrom(consumer.ConsumeFromTimestamp))
	assert.Len(t, pollN(t, dflt, 13, wait), 13)
}

func TestSeek(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "seek", 2)
	p := newProducer(t, b)
	sent := produceTo(t, p, queues[0], "s", 20, nil)
	c := newConsumer(t, b, "seek-group", consumer.WithConsumeFrom(consumer.ConsumeFromFirst), consumer.WithPullBatchSize(5))
	require.NoError(t, c.Assign(queues[:1]))
	require.NoError(t, c.Start(context.Background()))
	ctx := context.Background()

	got := pollN(t, c, 20, wait)
	require.Equal(t, sent, bodies(got))

	require.NoError(t, c.Seek(ctx, queues[0], 7))
	got = pollN(t, c, 13, wait)
	require.Equal(t, sent[7:], bodies(got), "seek then poll restarts at the offset")

	require.NoError(t, c.SeekToBegin(ctx, queues[0]))
	got = pollN(t, c, 5, wait)
	require.Equal(t, sent[:5], bodies(got))

	require.NoError(t, c.SeekToEnd(ctx, queues[0]))
	assert.Empty(t, pollFor(t, c, 200*time.Millisecond))

	require.ErrorIs(t, c.Seek(ctx, queues[0], 21), consumer.ErrOffsetOutOfRange)
	require.ErrorIs(t, c.Seek(ctx, queues[0], -1), consumer.ErrOffsetOutOfRange)
	require.NoError(t, c.Seek(ctx, queues[0], 20), "the max offset itself is allowed")
	require.ErrorIs(t, c.Seek(ctx, queues[1], 0), consumer.ErrNotAssigned)
	require.ErrorIs(t, c.SeekToBegin(ctx, queues[1]), consumer.ErrNotAssigned)

	// Seek drops cached messages: cache some, seek, and see the seek position first.
	require.NoError(t, c.Seek(ctx, queues[0], 0))
	require.Eventually(t, func() bool { return c.CachedCount(queues[0]) > 0 }, wait, 10*time.Millisecond)
	require.NoError(t, c.Seek(ctx, queues[0], 15))
	got = pollN(t, c, 5, wait)
	require.Equal(t, sent[15:], bodies(got))

	off, err := c.OffsetForTimestamp(ctx, queues[0], time.Now().Add(-time.Hour))
	require.NoError(t, err)
	assert.EqualValues(t, 0, off)
	off, err = c.OffsetForTimestamp(ctx, queues[0], time.Now().Add(time.Hour))
	require.NoError(t, err)
	assert.EqualValues(t, 20, off)
}

func TestPauseResume(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "pause", 2)
	p := newProducer(t, b)
	c := newConsumer(t, b, "pause-group", consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
	require.NoError(t, c.Assign(queues))
	require.NoError(t, c.Start(context.Background()))
	c.Pause(queues[0])
	a := produceTo(t, p, queues[0], "a", 5, nil)
	bb := produceTo(t, p, queues[1], "b", 5, nil)
	got := pollN(t, c, 5, wait)
	got = append(got, pollFor(t, c, 200*time.Millisecond)...)
	assert.Equal(t, bb, bodies(got), "only the unpaused queue")
	c.Resume(queues[0])
	got = pollN(t, c, 5, wait)
	assert.Equal(t, a, bodies(got))
}

func TestAssignChanges(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "assign", 3)
	p := newProducer(t, b)
	var mu sync.Mutex
	var calls [][]consumer.MessageQueue
	c := newConsumer(t, b, "assign-group", consumer.WithConsumeFrom(consumer.ConsumeFromFirst),
		consumer.WithQueueListener(func(topic string, qs []consumer.MessageQueue) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, qs)
		}))
	require.NoError(t, c.Assign(queues[:2]))
	require.NoError(t, c.Start(context.Background()))
	for i, q := range queues {
		produceTo(t, p, q, fmt.Sprint("q", i), 3, nil)
	}
	got := pollN(t, c, 6, wait)
	assert.Len(t, got, 6)
	require.NoError(t, c.Assign(queues[2:]))
	got = pollN(t, c, 3, wait)
	assert.Equal(t, []string{"q2-0", "q2-1", "q2-2"}, bodies(got))
	assert.Equal(t, queues[2:], c.Assignment())
	// Assign does not use the group's stored offsets of other queues... but commits its own.
	assert.EqualValues(t, 3, brokerOffset(t, b, "assign-group", queues[0]), "a queue unassigned is committed")
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(calls) == 2
	}, wait, 10*time.Millisecond)
	mu.Lock()
	assert.Equal(t, [][]consumer.MessageQueue{queues[:2], queues[2:]}, calls)
	mu.Unlock()
}

func TestFetchQueuesAndListeners(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "meta", 2)
	c := newConsumer(t, b, "meta-group", consumer.WithTopicMetadataCheckInterval(100*time.Millisecond))
	require.NoError(t, c.Subscribe("meta", "*"))
	changed := make(chan []consumer.MessageQueue, 4)
	ctx := context.Background()
	require.NoError(t, c.Start(ctx))
	_, err := c.FetchMessageQueues(ctx, "no-such-topic")
	require.ErrorIs(t, err, consumer.ErrTopicNotExist)
	got, err := c.FetchMessageQueues(ctx, "meta")
	require.NoError(t, err)
	assert.Equal(t, queues, got)
	require.NoError(t, c.RegisterTopicMessageQueueChangeListener(ctx, "meta", func(topic string, qs []consumer.MessageQueue) {
		changed <- qs
	}))
	require.Eventually(t, func() bool { return len(c.ActiveQueues()) == 2 }, wait, 10*time.Millisecond)

	grown := createTopic(t, b, "meta", 3)
	select {
	case qs := <-changed:
		assert.Equal(t, grown, qs)
	case <-time.After(wait):
		t.Fatal("no queue-change notification")
	}
	require.Eventually(t, func() bool { return len(c.ActiveQueues()) == 3 }, wait, 10*time.Millisecond,
		"a changed queue set triggers a rebalance")
}

func TestUnsubscribeReleases(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "u1", 2)
	createTopic(t, b, "u2", 2)
	c := newConsumer(t, b, "unsub-group")
	require.NoError(t, c.Subscribe("u1", "*"))
	require.NoError(t, c.Subscribe("u2", "*"))
	require.NoError(t, c.Start(context.Background()))
	require.Eventually(t, func() bool { return len(c.ActiveQueues()) == 4 }, wait, 10*time.Millisecond)
	require.NoError(t, c.Unsubscribe("u1"))
	require.Eventually(t, func() bool {
		a := c.Assignment()
		return len(a) == 2 && a[0].Topic == "u2"
	}, wait, 10*time.Millisecond)
}

func TestFlowControlBoundsTheCache(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "flow", 1)
	p := newProducer(t, b)
	var batch []*producer.Message
	for i := range 500 {
		batch = append(batch, &producer.Message{Topic: "flow", Body: []byte(fmt.Sprint("f", i)), ShardingKey: "0"})
		if len(batch) == 100 {
			_, err := p.SendBatch(context.Background(), batch...)
			require.NoError(t, err)
			batch = nil
		}
	}
	c := newConsumer(t, b, "flow-group", consumer.WithConsumeFrom(consumer.ConsumeFromFirst),
		consumer.WithPullThresholdForQueue(50), consumer.WithPullBatchSize(10))
	require.NoError(t, c.Subscribe("flow", "*"))
	require.NoError(t, c.Start(context.Background()))
	require.Eventually(t, func() bool { return c.CachedCount(queues[0]) >= 50 }, wait, 10*time.Millisecond)
	for range 10 {
		time.Sleep(50 * time.Millisecond) // sampling, not synchronization
		assert.LessOrEqual(t, c.CachedCount(queues[0]), 60, "threshold + one batch")
	}
	// Polling makes room, and everything arrives in order.
	got := pollN(t, c, 500, wait)
	require.Len(t, got, 500)
	for i, m := range got {
		require.EqualValues(t, i, m.QueueOffset)
	}
}

func TestFlowControlSizeAndSpan(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "flow2", 1)
	p := newProducer(t, b)
	produceTo(t, p, queues[0], strings.Repeat("x", 1000), 200, nil)
	bySize := newConsumer(t, b, "size-group", consumer.WithConsumeFrom(consumer.ConsumeFromFirst),
		consumer.WithPullThresholdSizeForQueue(20_000), consumer.WithPullBatchSize(5))
	require.NoError(t, bySize.Subscribe("flow2", "*"))
	require.NoError(t, bySize.Start(context.Background()))
	bySpan := newConsumer(t, b, "span-group", consumer.WithConsumeFrom(consumer.ConsumeFromFirst),
		consumer.WithConsumeMaxSpan(30), consumer.WithPullBatchSize(5))
	require.NoError(t, bySpan.Subscribe("flow2", "*"))
	require.NoError(t, bySpan.Start(context.Background()))
	byAll := newConsumer(t, b, "all-group", consumer.WithConsumeFrom(consumer.ConsumeFromFirst),
		consumer.WithPullThresholdForAll(40), consumer.WithPullBatchSize(5))
	require.NoError(t, byAll.Subscribe("flow2", "*"))
	require.NoError(t, byAll.Start(context.Background()))
	// Each fills its cache up to its threshold, and stays there while nobody polls.
	require.Eventually(t, func() bool {
		return bySize.CachedCount(queues[0]) >= 20 && bySpan.CachedCount(queues[0]) >= 30 && byAll.CachedCount(queues[0]) >= 40
	}, wait, 10*time.Millisecond)
	for range 5 {
		assert.LessOrEqual(t, bySize.CachedCount(queues[0]), 25, "about 20 KB of 1 KB bodies, plus a batch")
		assert.LessOrEqual(t, bySpan.CachedCount(queues[0]), 40, "span 30 plus a batch")
		assert.LessOrEqual(t, byAll.CachedCount(queues[0]), 50, "40 plus a batch")
		time.Sleep(50 * time.Millisecond) // sampling, not synchronization
	}
}

func TestBroadcasting(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "bcast", 4)
	p := newProducer(t, b)
	dir1, dir2 := t.TempDir(), t.TempDir()
	start := func(dir string) *consumer.LitePull {
		c := newConsumer(t, b, "bcast-group", consumer.WithMessageModel(consumer.Broadcasting),
			consumer.WithOffsetStoreDir(dir), consumer.WithConsumeFrom(consumer.ConsumeFromFirst),
			consumer.WithAutoCommitInterval(time.Second))
		require.NoError(t, c.Subscribe("bcast", "*"))
		require.NoError(t, c.Start(context.Background()))
		return c
	}
	c1, c2 := start(dir1), start(dir2)
	sent := produce(t, p, "bcast", "b", 40, nil)
	assert.Equal(t, sorted(sent), sortedBodies(pollN(t, c1, 40, wait)))
	assert.Equal(t, sorted(sent), sortedBodies(pollN(t, c2, 40, wait)))
	assert.Len(t, c1.Assignment(), 4, "broadcasting takes every queue")
	assert.Len(t, c2.Assignment(), 4)

	// Offsets live in the local file and survive a restart.
	require.NoError(t, c1.Close(context.Background()))
	assert.FileExists(t, dir1+"/bcast-group/offsets.json")
	more := produce(t, p, "bcast", "more", 8, nil)
	c1 = start(dir1)
	assert.Equal(t, sorted(more), sortedBodies(pollN(t, c1, 8, wait)))
	assert.Empty(t, pollFor(t, c1, 200*time.Millisecond))
	off, err := c1.Committed(context.Background(), c1.Assignment()[0])
	require.NoError(t, err)
	assert.GreaterOrEqual(t, off, int64(10))
	// Nothing went to the broker.
	assert.EqualValues(t, -1, brokerOffset(t, b, "bcast-group", c1.Assignment()[0]))
}

func TestPollHonoursContext(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "ctx", 1)
	// A poll timeout of an hour: a Poll that did not honour its context would hang.
	c := newConsumer(t, b, "ctx-group", consumer.WithPollTimeout(time.Hour))
	require.NoError(t, c.Subscribe("ctx", "*"))
	require.NoError(t, c.Start(context.Background()))
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	msgs, err := c.Poll(ctx)
	assert.Nil(t, msgs)
	require.True(t, errors.Is(err, context.DeadlineExceeded))

	// Close wakes a waiting Poll. (Should the Poll start only after Close, it fails
	// at once with the same error: the test holds either way.)
	done := make(chan error, 1)
	go func() {
		_, err := c.Poll(context.Background())
		done <- err
	}()
	time.Sleep(50 * time.Millisecond) // most likely waiting by now
	require.NoError(t, c.Close(context.Background()))
	select {
	case err := <-done:
		require.ErrorIs(t, err, consumer.ErrNotRunning)
	case <-time.After(wait):
		t.Fatal("Poll not woken by Close")
	}
}

// TestStartHonoursItsContext: Start with a context that has ended fails with the context's
// error, leaves the consumer in StartFailed, and leaves nothing behind: no member in the
// group, no registration in a shared client core (the group can start there again), no
// goroutine.
func TestStartHonoursItsContext(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "start-ctx", 2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	before := runtime.NumGoroutine()

	own, err := consumer.NewLitePull("start-ctx-group", fastOpts(b)...)
	require.NoError(t, err)
	require.NoError(t, own.Subscribe("start-ctx", "*"))
	require.ErrorIs(t, own.Start(ctx), context.Canceled)
	assert.Equal(t, consumer.StartFailed, own.State())
	assert.Empty(t, b.GroupMembers("start-ctx-group"))
	// +1: Eventually runs the condition on a goroutine of its own.
	if !assert.Eventually(t, func() bool { return runtime.NumGoroutine() <= before+1 }, wait, 5*time.Millisecond, "goroutines left running") {
		buf := make([]byte, 1<<20)
		t.Logf("before %d, now %d:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
	}

	shared, err := client.New(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet()))
	require.NoError(t, err)
	defer shared.Close(context.Background())
	c1, err := consumer.NewLitePull("start-ctx-group", consumer.WithClient(shared))
	require.NoError(t, err)
	require.NoError(t, c1.Subscribe("start-ctx", "*"))
	require.ErrorIs(t, c1.Start(ctx), context.Canceled)
	assert.Empty(t, b.GroupMembers("start-ctx-group"))
	c2, err := consumer.NewLitePull("start-ctx-group", consumer.WithClient(shared))
	require.NoError(t, err)
	require.NoError(t, c2.Subscribe("start-ctx", "*"))
	require.NoError(t, c2.Start(context.Background()), "the failed start left no registration behind")
	require.NoError(t, c2.Close(context.Background()))
}

// A SQL92 selector is evaluated by the broker on the messages' properties: only matching
// messages reach the consumer.
func TestSQLSelectorTakesMatchingMessagesOnly(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "sqlsel", 2)
	p := newProducer(t, b)
	produce(t, p, "sqlsel", "m", 40, func(i int, m *producer.Message) {
		m.Properties = map[string]string{"n": strconv.Itoa(i)}
		if i%4 == 0 {
			m.Tags = "even4"
		}
	})

	c := newConsumer(t, b, "sqlsel-group", consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
	require.NoError(t, c.SubscribeSelector("sqlsel", consumer.SQLSelector("n >= 20 AND TAGS = 'even4'")))
	require.NoError(t, c.Start(context.Background()))
	got := pollN(t, c, 5, wait)
	var ns []int
	for _, m := range got {
		n, err := strconv.Atoi(m.Properties()["n"])
		require.NoError(t, err)
		ns = append(ns, n)
	}
	slices.Sort(ns)
	assert.Equal(t, []int{20, 24, 28, 32, 36}, ns)
	assert.Empty(t, pollFor(t, c, 200*time.Millisecond), "nothing else matches")
}
