package broker

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// newTestBroker builds a broker on a fresh directory without serving it: the event and
// table tests call its methods directly.
func newTestBroker(t *testing.T, mod func(*Config)) *Broker {
	t.Helper()
	cfg := Config{
		DataDir: t.TempDir(), Listen: "127.0.0.1:0", NamesrvListen: "off",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	cfg.Store.SegmentSize = 8 << 20
	if mod != nil {
		mod(&cfg)
	}
	b, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, b.Shutdown(ctx))
	})
	return b
}

// A subscriber that cancels itself from inside its callback must not deadlock the broker
// (it did: emit held the bus's read lock while calling, cancel wanted the write lock).
func TestEventSubscriberCancelsInsideItsCallback(t *testing.T) {
	b := newTestBroker(t, nil)
	called := make(chan struct{})
	var cancel func()
	var once sync.Once
	ready := make(chan struct{})
	cancel = b.Subscribe(func(Event) {
		<-ready
		cancel()
		once.Do(func() { close(called) })
	})
	close(ready)
	ctx, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range int64(3) {
			b.commitOffset("g", "t", 0, i+1)
		}
	}()
	for _, ch := range []chan struct{}{called, done} {
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatal("deadlock: a subscriber cancelled inside its callback")
		}
	}
}

// The offset, group and consumer tables emit while they hold their own lock: a subscriber
// that reads those tables back from its callback must not deadlock, which holds only while
// emit queues events instead of running subscribers.
func TestEventSubscriberReadsTheTablesThatEmitted(t *testing.T) {
	b := newTestBroker(t, nil)
	seen := make(chan EventType, 16)
	defer b.Subscribe(func(e Event) {
		if _, err := b.DescribeGroup(e.Group); err != nil {
			t.Errorf("describe group %q after %s: %v", e.Group, e.Type, err)
		}
		seen <- e.Type
	})()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _, err := b.groups.createIfAbsent(GroupConfig{Name: "g", ConsumeEnable: true}, time.Now(), b.events)
		assert.NoError(t, err)
		b.consumers.heartbeat("g", "client-1", nil, "CONSUME_ACTIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET", "", nil, time.Now())
		b.commitOffset("g", "t", 0, 7)
		b.consumers.unregister("g", "client-1")
	}()
	want := []EventType{GroupCreated, MemberJoined, OffsetCommitted, MemberLeft}
	ctx, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("deadlock: a table emitting under its lock waited for a subscriber reading it")
	}
	for i, typ := range want {
		select {
		case got := <-seen:
			assert.Equal(t, typ, got, "event %d", i)
		case <-ctx.Done():
			t.Fatalf("deadlock: the subscriber's callback for %s did not return", typ)
		}
	}
}

// Concurrent commits of one queue: after each round of racing commits, the latest event
// for the queue carries the offset the table holds, and events arrive numbered without gaps.
func TestEventsFollowTheOrderOfStateChanges(t *testing.T) {
	b := newTestBroker(t, func(c *Config) { c.EventQueueSize = 1 << 20 })
	var mu sync.Mutex
	bySeq := map[uint64]Event{}
	var order []uint64
	defer b.Subscribe(func(e Event) {
		mu.Lock()
		bySeq[e.Seq] = e
		order = append(order, e.Seq)
		mu.Unlock()
	})()
	type round struct {
		seq   uint64
		final int64
	}
	const workers, rounds = 4, 2000
	var checks []round
	for r := range rounds {
		start := make(chan struct{})
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				<-start
				b.commitOffset("race", "t", 0, int64(r*workers+w+1))
			})
		}
		close(start)
		wg.Wait()
		final, ok := b.offsets.query("race", "t", 0)
		require.True(t, ok)
		checks = append(checks, round{b.events.lastSeq(), final})
	}
	last := b.events.lastSeq()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) > 0 && order[len(order)-1] == last
	}, 10*time.Second, time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(order); i++ {
		require.Equal(t, order[i-1]+1, order[i], "events out of order or lost")
	}
	for i, c := range checks {
		require.Equal(t, c.final, bySeq[c.seq].Offset, "round %d: the latest event is not the final state", i)
	}
	assert.Equal(t, "local", bySeq[1].Cluster)
	assert.Equal(t, "broker-a", bySeq[1].Broker)
	assert.Zero(t, b.EventsDropped())
}

// A subscriber that does not return never holds up commits: its queue fills, and what does
// not fit is dropped and counted.
func TestASlowSubscriberDoesNotBlockCommits(t *testing.T) {
	b := newTestBroker(t, func(c *Config) { c.EventQueueSize = 4 })
	release := make(chan struct{})
	defer close(release)
	defer b.Subscribe(func(Event) { <-release })()
	ctx, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range int64(100) {
			b.commitOffset("slow", "t", 0, i+1)
		}
	}()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("commits blocked on a slow subscriber")
	}
	// One event may be in the callback, four wait in the queue; the rest were dropped.
	assert.GreaterOrEqual(t, b.EventsDropped(), uint64(100-5))
}

func TestLockTableForgetsExpiredLocksAndEmptyGroups(t *testing.T) {
	lt := newLockTable(time.Minute)
	now := time.Now()
	q := func(id int) protocol.MessageQueue {
		return protocol.MessageQueue{Topic: "t", BrokerName: "b", QueueID: id}
	}
	lt.lock("g1", "c1", []protocol.MessageQueue{q(0), q(1)}, now)
	lt.lock("g2", "c2", []protocol.MessageQueue{q(0)}, now)
	groups, locks := lt.size()
	assert.Equal(t, 2, groups)
	assert.Equal(t, 3, locks)

	// A lock call drops its group's expired entries.
	lt.lock("g1", "c3", []protocol.MessageQueue{q(2)}, now.Add(2*time.Minute))
	groups, locks = lt.size()
	assert.Equal(t, 2, groups)
	assert.Equal(t, 2, locks, "g1's expired locks of q0 and q1 stayed")

	// The sweep drops the rest, and the groups with them.
	lt.sweep(now.Add(4 * time.Minute))
	groups, locks = lt.size()
	assert.Zero(t, groups)
	assert.Zero(t, locks)

	// A lock call that takes nothing leaves no empty group behind.
	lt.lock("g3", "c1", nil, now)
	groups, _ = lt.size()
	assert.Zero(t, groups)
}

func TestCreatedGroupsAreWrittenOnFlushOnly(t *testing.T) {
	b := newTestBroker(t, func(c *Config) { c.TableFlushInterval = time.Hour })
	for _, g := range []string{"a", "b", "c"} {
		_, created, err := b.groups.createIfAbsent(GroupConfig{Name: g}, time.Now(), nil)
		require.NoError(t, err)
		require.True(t, created)
	}
	again, err := openGroupTable(b.groups.path, 10)
	require.NoError(t, err)
	assert.Zero(t, again.len(), "a creation wrote the file")
	require.NoError(t, b.groups.flushIfDirty())
	again, err = openGroupTable(b.groups.path, 10)
	require.NoError(t, err)
	assert.Equal(t, 3, again.len())
}

// A deletion that fails half way must not leave the messages of a topic no longer listed
// (the next send re-creating the topic would bring them back): the messages go first.
func TestDeleteTopicRemovesMessagesBeforeTheConfig(t *testing.T) {
	b := newTestBroker(t, nil)
	_, err := b.topics.put(TopicConfig{Name: "half", ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermRead | protocol.PermWrite})
	require.NoError(t, err)
	_, err = b.store.Put(context.Background(), &protocol.MessageExt{Message: protocol.Message{Topic: "half", Body: []byte("m"), Properties: map[string]string{}}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.store.MaxOffset("half", 0) == 1 }, 5*time.Second, time.Millisecond)

	// The topic file cannot be replaced: a directory with content stands in its way.
	require.NoError(t, os.Remove(b.topics.path))
	require.NoError(t, os.MkdirAll(filepath.Join(b.topics.path, "x"), 0o755))
	t.Cleanup(func() { os.RemoveAll(b.topics.path) })
	req := protocol.NewRequestWith(protocol.DeleteTopicInBroker, &protocol.DeleteTopicRequestHeader{Topic: "half"}, nil)
	resp := b.processDeleteTopic(req)
	require.Equal(t, protocol.SystemError, resp.ResponseCode(), resp.Remark)
	assert.Zero(t, b.store.MaxOffset("half", 0), "the messages outlived a failed deletion")
}
