package broker_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

// readRole is a role that steers pulls (broker.ReplicaReads): the member's broker id and,
// on a master, the replica it suggests while that replica is in sync.
type readRole struct {
	*role
	id      int64
	replica int64
}

func (r *readRole) BrokerID() int64 { return r.id }

func (r *readRole) ReadReplica() (int64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.master == nil || len(r.master.InSync()) == 0 {
		return 0, false
	}
	return r.replica, true
}

// routedRole is a readRole whose routes (broker.ReplicaAddrs) name master as broker id 0,
// while it is set.
type routedRole struct {
	*readRole
	master atomic.Pointer[string]
}

func (r *routedRole) BrokerAddrs(self string) map[int64]string {
	out := map[int64]string{r.id: self}
	if m := r.master.Load(); m != nil {
		out[0] = *m
	}
	return out
}

// pullAt pulls queue 0 of topic at offset from addr, committing commit (when ≥ 0) for group g.
func pullAt(t *testing.T, addr, topic string, offset, commit int64) (*protocol.PullMessageResponseHeader, []*protocol.MessageExt) {
	t.Helper()
	h := pullHeader(topic, offset, 0, "*")
	h.ConsumerGroup = "g"
	if commit >= 0 {
		h.SysFlag |= protocol.PullFlagCommitOffset
		h.CommitOffset = commit
	}
	resp, err := newTransport(t).Invoke(context.Background(), addr, protocol.NewRequestWith(protocol.PullMessage, h, nil))
	require.NoError(t, err)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	var rh protocol.PullMessageResponseHeader
	require.NoError(t, resp.DecodeHeader(&rh))
	msgs, err := protocol.DecodeStoredAll(resp.Body)
	require.NoError(t, err)
	return &rh, msgs
}

// TestReplicaServesPullsAndTheMasterSuggestsItForOldMessages: a replica answers pulls from
// its own store; the master suggests the in-sync replica (suggestWhichBrokerId) for a pull
// of messages beyond its memory budget and itself (0) near the end; the replica suggests
// itself for old messages and the master once the consumer is near the end; a group's
// settings and an offset committed on the replica survive the master's snapshots.
func TestReplicaServesPullsAndTheMasterSuggestsItForOldMessages(t *testing.T) {
	const topic = "repl-reads"
	budget := func(c *broker.Config) { c.Store.MemoryBudget = 16 << 10; c.ReplicaReads = true }
	mRole := &readRole{role: &role{}, id: 1, replica: 2}
	rRole := &readRole{role: &role{}, id: 2}
	m := startBroker(t, func(c *broker.Config) { budget(c); c.Replication = mRole })
	r := startBroker(t, func(c *broker.Config) { budget(c); c.Replication = rRole })
	hm := mRole.become(t, m, 1)
	followBroker(t, r, hm.Addr().String())
	waitFor(t, "the replica in sync", func() bool { return len(hm.InSync()) == 1 })

	_, err := m.PutGroup(broker.GroupConfig{Name: "g", ConsumeEnable: true, RetryQueueNums: 1, RetryMaxTimes: 3, ConsumeOrderly: true})
	require.NoError(t, err)
	cl := newTransport(t)
	body := strings.Repeat("x", 1<<10)
	const n = 100 // 100 KiB: the first ones are beyond the 16 KiB budget
	for i := range n {
		resp, err := cl.Invoke(context.Background(), m.Addr(), syncSendRequest(topic, []byte(fmt.Sprintf("%03d%s", i, body))))
		require.NoError(t, err)
		require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	}
	// The topic table reaches the replica with the master's snapshots, which may come
	// after the messages are dispatched.
	waitFor(t, "the replica dispatched and knows the topic", func() bool {
		_, ok := r.Topic(topic)
		return ok && r.StoreMax(topic, 0) == n
	})

	h, msgs := pullAt(t, m.Addr(), topic, 0, -1)
	require.NotEmpty(t, msgs)
	require.Equal(t, int64(2), h.SuggestWhichBrokerID, "the master keeps a pull of old messages")
	h, _ = pullAt(t, m.Addr(), topic, n-2, -1)
	require.Equal(t, int64(0), h.SuggestWhichBrokerID, "the master sends a caught-up pull away")

	// The replica serves from its own store, and commits there.
	h, msgs = pullAt(t, r.Addr(), topic, 0, -1)
	require.NotEmpty(t, msgs)
	require.Equal(t, "000", string(msgs[0].Body[:3]))
	require.Equal(t, int64(2), h.SuggestWhichBrokerID, "the replica keeps the pull of old messages")
	h, msgs = pullAt(t, r.Addr(), topic, n-2, n-2)
	require.Len(t, msgs, 2)
	require.Equal(t, int64(0), h.SuggestWhichBrokerID, "the replica sends a caught-up consumer to the master")

	waitFor(t, "the group's settings reached the replica", func() bool {
		g, ok := r.Group("g")
		return ok && g.RetryMaxTimes == 3 && g.ConsumeOrderly
	})
	// The master knows no offset of g (or a lower one): the replica keeps its own.
	_, err = m.ResetOffsetsTo(context.Background(), "g", topic, map[int32]int64{0: 10})
	require.NoError(t, err)
	_, err = m.ResetOffsetsTo(context.Background(), "g2", topic, map[int32]int64{0: 5})
	require.NoError(t, err)
	waitFor(t, "a snapshot after the reset", func() bool {
		off, ok := r.CommittedOffset("g2", topic, 0)
		return ok && off == 5
	})
	off, ok := r.CommittedOffset("g", topic, 0)
	require.True(t, ok)
	require.Equal(t, int64(n-2), off, "the master's snapshot moved a replica's commit back")

	// With its replica gone, the master serves old messages itself.
	mRole.demote()
	mRole.become(t, m, 2)
	h, msgs = pullAt(t, m.Addr(), topic, 0, -1)
	require.NotEmpty(t, msgs)
	require.Equal(t, int64(0), h.SuggestWhichBrokerID)
}

// TestPromotedReplicaResumesPopWhereTheMasterWas: a pop group's consumed offset reaches the
// replica, so after a promotion a receive resumes there: what was acknowledged below it is
// not handed out again; what was in flight, or acknowledged above it, is (at least once).
func TestPromotedReplicaResumesPopWhereTheMasterWas(t *testing.T) {
	const topic = "repl-pop"
	mRole, rRole := &role{}, &role{}
	m := startBroker(t, func(c *broker.Config) { c.Replication = mRole })
	r := startBroker(t, func(c *broker.Config) { c.Replication = rRole })
	hm := mRole.become(t, m, 1)
	followBroker(t, r, hm.Addr().String())
	waitFor(t, "the replica in sync", func() bool { return len(hm.InSync()) == 1 })
	tc := broker.TopicConfig{Name: topic, ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermRead | protocol.PermWrite}
	require.NoError(t, m.CreateTopic(tc))
	ctx := context.Background()
	for i := range 10 {
		_, err := m.Send(ctx, protocol.Message{Topic: topic, Body: fmt.Appendf(nil, "p-%d", i)}, 0)
		require.NoError(t, err)
	}
	waitFor(t, "dispatched on both", func() bool { return m.StoreMax(topic, 0) == 10 && r.StoreMax(topic, 0) == 10 })
	pop := func(b *testBroker, n int) []broker.PoppedMessage {
		got, err := b.Pop(ctx, broker.PopRequest{Group: "pg", Topic: topic, QueueID: 0, MaxMessages: n, Invisible: time.Minute})
		require.NoError(t, err)
		return got
	}
	got := pop(m, 6)
	require.Len(t, got, 6)
	for _, pm := range got[:4] { // 0-3 acknowledged: consumed offset 4; 4 and 5 in flight
		require.NoError(t, m.PopAck(ctx, "pg", topic, pm.Handle))
	}
	waitFor(t, "the pop progress reached the replica", func() bool {
		off, ok := r.CommittedOffset("pg", topic, 0)
		return ok && off == 4
	})

	mRole.demote()
	rRole.become(t, r, 2)
	require.NoError(t, r.Promoted(ctx))
	got = pop(r, 32)
	var offs []int64
	for _, pm := range got {
		offs = append(offs, pm.Message.QueueOffset)
	}
	require.Equal(t, []int64{4, 5, 6, 7, 8, 9}, offs, "the promoted replica resumes at the consumed offset")
}

// replicaPull pulls queue 0 of topic at offset from addr for group g, suspending up to
// suspend (0: no long polling), and returns the answer's code and header.
func replicaPull(t *testing.T, addr, topic string, offset int64, suspend time.Duration) (protocol.ResponseCode, *protocol.PullMessageResponseHeader) {
	t.Helper()
	h := pullHeader(topic, offset, suspend, "*")
	h.ConsumerGroup = "g"
	resp, err := newTransport(t).Invoke(context.Background(), addr, protocol.NewRequestWith(protocol.PullMessage, h, nil))
	require.NoError(t, err)
	var rh protocol.PullMessageResponseHeader
	require.NoError(t, resp.DecodeHeader(&rh))
	return resp.ResponseCode(), &rh
}

// TestReplicaReadsGateAndTheReplicasCaughtUpAnswer: with Config.ReplicaReads off (the
// default) the master suggests itself even for history and a replica holds a caught-up
// pull as any broker does; with it on the replica answers a caught-up pull at once with
// PULL_RETRY_IMMEDIATELY at the same offset, suggesting the master. Either way a pull past
// the end of the replica's copy (an offset the master gave) is answered
// PULL_RETRY_IMMEDIATELY at that offset, not OFFSET_MOVED back to the queue's start; the
// master still corrects such an offset.
func TestReplicaReadsGateAndTheReplicasCaughtUpAnswer(t *testing.T) {
	const topic = "repl-gate"
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("replica_reads=%v", on), func(t *testing.T) {
			cfg := func(c *broker.Config) { c.Store.MemoryBudget = 16 << 10; c.ReplicaReads = on }
			mRole := &readRole{role: &role{}, id: 1, replica: 2}
			rRole := &routedRole{readRole: &readRole{role: &role{}, id: 2}}
			m := startBroker(t, func(c *broker.Config) { cfg(c); c.Replication = mRole })
			r := startBroker(t, func(c *broker.Config) { cfg(c); c.Replication = rRole })
			master := m.Addr()
			rRole.master.Store(&master)
			hm := mRole.become(t, m, 1)
			followBroker(t, r, hm.Addr().String())
			waitFor(t, "the replica in sync", func() bool { return len(hm.InSync()) == 1 })
			cl := newTransport(t)
			const n = 40 // 40 KiB: the first ones beyond the 16 KiB budget
			for i := range n {
				resp, err := cl.Invoke(context.Background(), m.Addr(), syncSendRequest(topic, []byte(fmt.Sprintf("%03d%s", i, strings.Repeat("x", 1<<10)))))
				require.NoError(t, err)
				require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
			}
			waitFor(t, "the replica dispatched and knows the topic", func() bool {
				_, ok := r.Topic(topic)
				return ok && r.StoreMax(topic, 0) == n
			})

			code, h := replicaPull(t, m.Addr(), topic, 0, 0)
			require.Equal(t, protocol.Success, code)
			want := int64(0)
			if on {
				want = 2
			}
			require.Equal(t, want, h.SuggestWhichBrokerID, "the master's suggestion for history")
			code, h = replicaPull(t, r.Addr(), topic, 0, 0)
			require.Equal(t, protocol.Success, code)
			require.Equal(t, want, h.SuggestWhichBrokerID, "the replica's suggestion for history")

			// Caught up at the replica, with long polling: held (gate off) until the
			// suspend time ends, or sent back to the master at once (gate on).
			code, h = replicaPull(t, r.Addr(), topic, n, 300*time.Millisecond)
			if on {
				require.Equal(t, protocol.PullRetryImmediately, code)
			} else {
				require.Equal(t, protocol.PullNotFound, code)
			}
			require.Equal(t, int64(n), h.NextBeginOffset)
			require.Equal(t, int64(0), h.SuggestWhichBrokerID)

			// Past the end of the replica's copy: the offset stands.
			code, h = replicaPull(t, r.Addr(), topic, n+5, 0)
			require.Equal(t, protocol.PullRetryImmediately, code)
			require.Equal(t, int64(n+5), h.NextBeginOffset)
			// The master corrects it (RocketMQ's rule: back to 0 while the queue has its head).
			code, h = replicaPull(t, m.Addr(), topic, n+5, 0)
			require.Equal(t, protocol.PullOffsetMoved, code)
			require.Equal(t, int64(0), h.NextBeginOffset)

			// While the replica's routes name no master (a lapsed lease), there is nowhere to
			// send the consumer: it is answered as by any broker, as the member promoted next
			// would answer it.
			rRole.master.Store(nil)
			code, _ = replicaPull(t, r.Addr(), topic, n, 300*time.Millisecond)
			require.Equal(t, protocol.PullNotFound, code)
			code, _ = replicaPull(t, r.Addr(), topic, n+5, 0)
			require.Equal(t, protocol.PullOffsetMoved, code)
		})
	}
}
