package consumer

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// newUnstarted returns a consumer that is never started: its name server (loopback) is
// never dialed by these tests.
func newUnstarted(t *testing.T, opts ...Option) *LitePull {
	t.Helper()
	all := append([]Option{WithNameServers("127.0.0.1:1"), WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)
	l, err := NewLitePull("internal", all...)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close(context.Background()) })
	return l
}

// addActive makes mq an owned queue being read, without a pull task.
func addActive(l *LitePull, mq MessageQueue) *queue {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := newQueue(mq, nil)
	q.active = true
	l.queues[mq] = q
	l.rebuildOrderLocked()
	return q
}

// TestFilteredRunsDoNotGrowTheCache: while nobody polls, a queue whose messages are all
// filtered out keeps answering pulls with offsets only; those must fold into one cache entry
// rather than pile up without bound (flow control counts messages, not offsets).
func TestFilteredRunsDoNotGrowTheCache(t *testing.T) {
	l := newUnstarted(t)
	mq := MessageQueue{Topic: "t", BrokerName: "b", QueueID: 0}
	q := addActive(l, mq)
	l.applyPull(q, 0, true, &pullResult{code: protocol.Success, next: 10, msgs: []*Message{{QueueOffset: 9, Body: []byte("x")}}, bytes: 1}, nil)
	for i := range 1000 {
		l.applyPull(q, 0, true, &pullResult{code: protocol.PullRetryImmediately, next: int64(11 + i)}, nil)
	}
	l.mu.Lock()
	assert.Len(t, q.cache, 2, "one batch of messages, one offset-only entry")
	msgs, got := l.takeLocked(time.Now())
	assert.Equal(t, q, got)
	assert.Len(t, msgs, 1)
	assert.EqualValues(t, 1010, q.consumeOffset, "polling the message moves past the filtered run")
	assert.Empty(t, q.cache)
	l.mu.Unlock()

	// Offsets after a batch of messages still wait for that batch to be handed out.
	l.applyPull(q, 0, true, &pullResult{code: protocol.Success, next: 1012, msgs: []*Message{{QueueOffset: 1011}}}, nil)
	l.applyPull(q, 0, true, &pullResult{code: protocol.PullRetryImmediately, next: 1500}, nil)
	l.mu.Lock()
	defer l.mu.Unlock()
	assert.EqualValues(t, 1010, q.consumeOffset)
	_, _ = l.takeLocked(time.Now())
	assert.EqualValues(t, 1500, q.consumeOffset)
}

// fakeStore records what is persisted, and fails when told to.
type fakeStore struct {
	mu        sync.Mutex
	fail      bool
	persisted []map[MessageQueue]int64
}

func (f *fakeStore) read(context.Context, MessageQueue) (int64, error) { return -1, nil }

func (f *fakeStore) persist(_ context.Context, offsets map[MessageQueue]int64) map[MessageQueue]error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(offsets) == 0 {
		return nil
	}
	if f.fail {
		failed := map[MessageQueue]error{}
		for mq := range offsets {
			failed[mq] = io.ErrUnexpectedEOF
		}
		return failed
	}
	f.persisted = append(f.persisted, maps.Clone(offsets))
	return nil
}

// TestHandoverExpiresWithItsLock: the final offset of a dropped queue whose commit failed is
// retried only while the lock it was read under is valid. After that the queue may have a new
// owner, whose committed offsets an old one must not overwrite, and a queue that comes back
// starts from the stored offset rather than from the stale one.
func TestHandoverExpiresWithItsLock(t *testing.T) {
	l := newUnstarted(t, WithHandoverLocks(false)) // no unlock requests in this test
	fs := &fakeStore{}
	l.store = fs
	past, future := time.Now().Add(-time.Second), time.Now().Add(time.Hour)
	lapsed := MessageQueue{Topic: "t", BrokerName: "b", QueueID: 1}
	valid := MessageQueue{Topic: "t", BrokerName: "b", QueueID: 2}
	unlocked := MessageQueue{Topic: "t", BrokerName: "b", QueueID: 3}

	l.handover[lapsed] = handover{offset: 5, until: past}
	l.handover[valid] = handover{offset: 7, until: future}
	l.handover[unlocked] = handover{offset: 9}
	l.retryHandovers(context.Background())
	assert.Equal(t, []map[MessageQueue]int64{{valid: 7, unlocked: 9}}, fs.persisted)
	assert.Empty(t, l.handover)

	l.handover[lapsed] = handover{offset: 5, until: past}
	l.handover[valid] = handover{offset: 7, until: future}
	l.reconcile(context.Background(), "t", []MessageQueue{lapsed, valid}, nil)
	l.mu.Lock()
	defer l.mu.Unlock()
	assert.EqualValues(t, -1, l.queues[lapsed].seekOffset, "the store is asked")
	assert.EqualValues(t, 7, l.queues[valid].seekOffset, "still ours: where it stood")
	assert.Empty(t, l.handover)
}

// TestReleaseRecordsTheLockValidity: a hand-over whose commit fails remembers until when the
// lock it was read under is valid.
func TestReleaseRecordsTheLockValidity(t *testing.T) {
	l := newUnstarted(t, WithHandoverLocks(false))
	l.store = &fakeStore{fail: true}
	mq := MessageQueue{Topic: "t", BrokerName: "b", QueueID: 0}
	q := addActive(l, mq)
	until := time.Now().Add(time.Hour)
	l.mu.Lock()
	q.consumeOffset = 42
	l.detachLocked(q)
	l.mu.Unlock()
	require.Error(t, l.release(context.Background(), []*queue{q}))
	assert.Equal(t, handover{offset: 42}, l.handover[mq], "read without a lock: no expiry")

	q = addActive(l, mq)
	l.mu.Lock()
	delete(l.handover, mq)
	q.consumeOffset, q.lockTried, q.locked, q.lockValidUntil = 43, true, true, until
	l.detachLocked(q)
	l.mu.Unlock()
	require.Error(t, l.release(context.Background(), []*queue{q}))
	assert.Equal(t, handover{offset: 43, until: until}, l.handover[mq])
}

// TestConnectionLostLapsesLocks: the client core reports a lost broker connection; the
// queues locked on that broker stop being handed out at once, and a lock answer that crossed
// the loss is not trusted.
func TestConnectionLostLapsesLocks(t *testing.T) {
	l := newUnstarted(t)
	a := MessageQueue{Topic: "t", BrokerName: "broker-a", QueueID: 0}
	b := MessageQueue{Topic: "t", BrokerName: "broker-b", QueueID: 0}
	now := time.Now()
	l.mu.Lock()
	l.mode = modeSubscribe
	l.mu.Unlock()
	for _, mq := range []MessageQueue{a, b} {
		q := addActive(l, mq)
		l.mu.Lock()
		q.lockTried, q.locked, q.lockValidUntil = true, true, now.Add(time.Hour)
		q.cache = []*batch{{msgs: []*Message{{QueueOffset: 0}}, next: 1}}
		q.count = 1
		l.cachedBatches++
		l.mu.Unlock()
	}
	l.mu.Lock()
	epoch := l.lockEpoch
	l.mu.Unlock()

	(*hooks)(l).ConnectionLost([]string{"broker-a"})

	l.mu.Lock()
	defer l.mu.Unlock()
	assert.False(t, l.consumableLocked(l.queues[a], now), "broker-a's lock is gone")
	assert.True(t, l.consumableLocked(l.queues[b], now))
	assert.True(t, l.renewNow)
	assert.True(t, l.needHeartbeat, "the broker dropped the member: rejoin")
	assert.NotEqual(t, epoch, l.lockEpoch)
	msgs, q := l.takeLocked(now)
	require.NotNil(t, q)
	assert.Equal(t, b, q.mq, "only broker-b's messages are handed out")
	assert.Len(t, msgs, 1)
	msgs, _ = l.takeLocked(now)
	assert.Nil(t, msgs)
}
