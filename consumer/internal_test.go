package consumer

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/protocol"
)

// newUnstarted returns a consumer that is never started: its name server (loopback) is
// never dialed by these tests.
func newUnstarted(t *testing.T, opts ...Option) *LitePull {
	t.Helper()
	all := append([]Option{WithClientOptions(client.WithNameServers("127.0.0.1:1"), client.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))}, opts...)
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
	l.applyPull(q, 0, true, 0, nil, &pullResult{code: protocol.Success, next: 10, msgs: []*Message{{QueueOffset: 9, Body: []byte("x")}}, bytes: 1}, nil)
	for i := range 1000 {
		l.applyPull(q, 0, true, 0, nil, &pullResult{code: protocol.PullRetryImmediately, next: int64(11 + i)}, nil)
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
	l.applyPull(q, 0, true, 0, nil, &pullResult{code: protocol.Success, next: 1012, msgs: []*Message{{QueueOffset: 1011}}}, nil)
	l.applyPull(q, 0, true, 0, nil, &pullResult{code: protocol.PullRetryImmediately, next: 1500}, nil)
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

// storedBody encodes messages with these bodies as a pull response body carries them.
func storedBody(t *testing.T, topic string, bodies ...string) []byte {
	t.Helper()
	var out []byte
	for i, body := range bodies {
		m := &protocol.MessageExt{
			Message:     protocol.Message{Topic: topic, Body: []byte(body), Properties: map[string]string{protocol.PropertyTags: "tag", protocol.PropertyUniqueKey: body}},
			QueueOffset: int64(i),
		}
		var err error
		out, err = protocol.AppendStored(out, m)
		require.NoError(t, err)
	}
	return out
}

// TestDecodePullVerifiesCRCOnlyWhenAsked: a body damaged after it was stored fails the pull
// with the verify option, and is handed out as it came without it (RocketMQ's client does
// not check either).
func TestDecodePullVerifiesCRCOnlyWhenAsked(t *testing.T) {
	mq := MessageQueue{Topic: "t", BrokerName: "b", QueueID: 0}
	body := storedBody(t, "t", "first", "second")
	i := bytesIndex(body, "second")
	require.Positive(t, i)
	body[i] = 'S' // same length, different CRC

	_, _, err := decodePull(body, mq, nil, 0, true, protocol.MaxFrameSize)
	require.ErrorIs(t, err, protocol.ErrMalformedMessage)
	assert.ErrorContains(t, err, "message 1")
	assert.ErrorContains(t, err, "CRC")

	msgs, n, err := decodePull(body, mq, nil, 0, false, protocol.MaxFrameSize)
	require.NoError(t, err)
	require.Len(t, msgs, 2)
	assert.Equal(t, "first", string(msgs[0].Body))
	assert.Equal(t, "Second", string(msgs[1].Body))
	assert.EqualValues(t, len("first")+len("second"), n)

	// A layout error is caught whatever the option.
	body[4] ^= 0xFF // first message's magic code
	_, _, err = decodePull(body, mq, nil, 0, false, protocol.MaxFrameSize)
	require.ErrorIs(t, err, protocol.ErrMalformedMessage)
}

// TestDecodePullReusesNoMessageState: messages decoded one after the other into one
// MessageExt keep their own properties, bodies and ids.
func TestDecodePullReusesNoMessageState(t *testing.T) {
	mq := MessageQueue{Topic: "t", BrokerName: "b", QueueID: 0}
	msgs, _, err := decodePull(storedBody(t, "t", "a", "b", "c"), mq, nil, 1, true, protocol.MaxFrameSize)
	require.NoError(t, err)
	require.Len(t, msgs, 2, "the message before the pull offset is left out")
	for i, want := range []string{"b", "c"} {
		assert.Equal(t, want, string(msgs[i].Body))
		assert.Equal(t, want, msgs[i].MsgID)
		assert.Equal(t, want, msgs[i].Properties()[protocol.PropertyUniqueKey])
		assert.Equal(t, "tag", msgs[i].Tags)
		assert.EqualValues(t, i+1, msgs[i].QueueOffset)
	}
}

func bytesIndex(b []byte, s string) int { return strings.Index(string(b), s) }

// TestLazyPropertiesReadAsDecoded: the map built on first use holds what the producer set,
// Tags, Keys, MsgID and the retry topic are read from the block as a decoded map reads them
// (the last of duplicate keys wins), concurrent first calls agree, and later calls return the
// same map.
func TestLazyPropertiesReadAsDecoded(t *testing.T) {
	mq := MessageQueue{Topic: "%RETRY%g", BrokerName: "b", QueueID: 0}
	raw := "TAGS\x01old\x02KEYS\x01k1  k2\x02UNIQ_KEY\x01id-1\x02RETRY_TOPIC\x01orders\x02region\x01eu\x02TAGS\x01new\x02"
	enc, err := protocol.AppendStored(nil, &protocol.MessageExt{Message: protocol.Message{Topic: mq.Topic, Body: []byte("x")}, RawProperties: []byte(raw)})
	require.NoError(t, err)
	want, err := protocol.DecodeProperties([]byte(raw))
	require.NoError(t, err)

	msgs, _, err := decodePull(enc, mq, newSubscription("orders", TagSelector("new")), 0, false, protocol.MaxFrameSize)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	m := msgs[0]
	assert.Equal(t, want[protocol.PropertyTags], m.Tags)
	assert.Equal(t, []string{"k1", "k2"}, m.Keys)
	assert.Equal(t, "id-1", m.MsgID)
	assert.Equal(t, "orders", m.Topic)

	var wg sync.WaitGroup
	got := make([]map[string]string, 4)
	for i := range got {
		wg.Go(func() { got[i] = m.Properties() })
	}
	wg.Wait()
	for _, g := range got {
		assert.Equal(t, want, g)
	}
	m.Properties()["added"] = "1"
	assert.Equal(t, "1", m.Property("added"), "the map is built once and kept")
	assert.Equal(t, "eu", m.Property("region"))

	// The tag re-check reads the block too: the first TAGS pair does not match.
	msgs, _, err = decodePull(enc, mq, newSubscription("orders", TagSelector("old")), 0, false, protocol.MaxFrameSize)
	require.NoError(t, err)
	assert.Empty(t, msgs)

	var none Message
	assert.Nil(t, none.Properties())
	assert.Empty(t, none.Property("x"))
}

// TestDecodePullSharesOneStringPerPull: the messages of a pull get their property blocks and
// offset message ids from one string, each its own part of it, whatever the tag re-check
// leaves out; a pull of 32 costs a few allocations, not some per message.
func TestDecodePullSharesOneStringPerPull(t *testing.T) {
	mq := MessageQueue{Topic: "t", BrokerName: "b", QueueID: 0}
	store := netip.MustParseAddrPort("10.0.0.7:10911")
	var enc []byte
	const n = 32
	for i := range n {
		props := map[string]string{protocol.PropertyTags: "keep", protocol.PropertyUniqueKey: fmt.Sprintf("id-%d", i)}
		switch {
		case i%5 == 0:
			props[protocol.PropertyTags] = "drop"
		case i%7 == 0:
			delete(props, protocol.PropertyUniqueKey) // MsgID is then the offset message id
		}
		var err error
		enc, err = protocol.AppendStored(enc, &protocol.MessageExt{
			Message:     protocol.Message{Topic: mq.Topic, Body: []byte(fmt.Sprint("body-", i)), Properties: props},
			QueueOffset: int64(i), CommitLogOffset: int64(1000 * i), StoreHost: store,
		})
		require.NoError(t, err)
	}
	sub := newSubscription(mq.Topic, TagSelector("keep"))
	msgs, _, err := decodePull(enc, mq, sub, 0, false, protocol.MaxFrameSize)
	require.NoError(t, err)
	var want []int
	for i := range n {
		if i%5 != 0 {
			want = append(want, i)
		}
	}
	require.Len(t, msgs, len(want))
	for k, i := range want {
		m := msgs[k]
		assert.Equal(t, fmt.Sprint("body-", i), string(m.Body))
		assert.EqualValues(t, i, m.QueueOffset)
		assert.Equal(t, "keep", m.Tags)
		assert.Equal(t, protocol.OffsetMsgID(store, int64(1000*i)), m.OffsetMsgID)
		wantID := fmt.Sprintf("id-%d", i)
		if i%7 == 0 {
			wantID = m.OffsetMsgID
		}
		assert.Equal(t, wantID, m.MsgID, i)
		assert.Equal(t, wantID == m.OffsetMsgID, m.Property(protocol.PropertyUniqueKey) == "", i)
	}

	allocs := testing.AllocsPerRun(20, func() {
		if _, _, err := decodePull(enc, mq, nil, 0, false, protocol.MaxFrameSize); err != nil {
			panic(err)
		}
	})
	t.Logf("allocations per pull of %d: %.0f", n, allocs)
	assert.LessOrEqual(t, allocs, 8.0, "allocations per message")
}
