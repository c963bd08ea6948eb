package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/protocol"
)

// setMember is one member of a two-member replica set for the tests: broker id 0 (the
// master) or 2, routes naming the master's address as 0 and the replica's as 2, and the
// master suggesting the replica for old messages (broker.ReplicaReads).
type setMember struct {
	id                   int64
	replica              atomic.Bool // takes no sends
	masterAddr, replAddr atomic.Pointer[string]
}

func (m *setMember) Writable() error {
	if m.replica.Load() {
		return fmt.Errorf("member %d: %w", m.id, broker.ErrNotMaster)
	}
	return nil
}
func (m *setMember) Sync() bool                                   { return false }
func (m *setMember) Await(_ int64, _ time.Time, done func(error)) { done(nil) }
func (m *setMember) BrokerID() int64                              { return m.id }
func (m *setMember) ReadReplica() (int64, bool)                   { return 2, !m.replica.Load() }
func (m *setMember) BrokerAddrs(self string) map[int64]string {
	out := map[int64]string{}
	if a := m.masterAddr.Load(); a != nil {
		out[0] = *a
	}
	if a := m.replAddr.Load(); a != nil {
		out[2] = *a
	}
	return out
}

// TestConsumerFollowsTheSuggestionAndFallsBackToTheReplica: two brokers holding the same
// queue, one the master (reached through a proxy), one its replica (broker id 2), with
// replica reads on and a small memory budget. The consumer reads the history mostly from
// the replica, as the master suggests, and goes back to the master once caught up; when
// the master cannot be reached, it reads from the replica what is sent there next. Every
// message once, in order. Hand-over locks are off: with them, a consumer that lost its
// master's connection hands out none of that broker's queues until it locked them again at
// a master (docs/cluster.md, "Reads from replicas", limits).
func TestConsumerFollowsTheSuggestionAndFallsBackToTheReplica(t *testing.T) {
	const topic, history, fresh = "rr", 60, 10
	mRole, rRole := &setMember{id: 0}, &setMember{id: 2}
	cfg := func(role *setMember) func(*broker.Config) {
		return func(c *broker.Config) {
			c.Replication, c.ReplicaReads, c.Store.MemoryBudget = role, true, 16<<10
		}
	}
	m, px := startBrokerBehindProxyWith(t, cfg(mRole))
	r := startBroker(t, cfg(rRole))
	mAddr, rAddr := px.addr(), r.Addr()
	for _, role := range []*setMember{mRole, rRole} {
		role.masterAddr.Store(&mAddr)
		role.replAddr.Store(&rAddr)
	}
	ctx := context.Background()
	pad := strings.Repeat("x", 1<<10)
	tc := broker.TopicConfig{Name: topic, ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermRead | protocol.PermWrite}
	for _, b := range []*broker.Broker{m, r} {
		require.NoError(t, b.CreateTopic(tc))
		for i := range history {
			_, err := b.Send(ctx, protocol.Message{Topic: topic, Body: fmt.Appendf(nil, "%04d%s", i, pad)}, 0)
			require.NoError(t, err)
		}
	}
	// A send returns before its message is in the consume queue; a pull the replica gets
	// before then is sent back to the master, and the whole history is read in less time.
	for _, b := range []*broker.Broker{m, r} {
		require.Eventually(t, func() bool {
			qr, err := b.ReadQueue(ctx, topic, 0, 0, 1)
			return err == nil && qr.Max == history
		}, wait, time.Millisecond, "the history in both brokers' consume queue")
	}
	rRole.replica.Store(true)

	c, err := consumer.NewLitePull("rr-group", consumer.WithClientOptions(client.WithNameServers(m.NamesrvAddr()), client.WithLogger(quiet())),
		consumer.WithConsumeFrom(consumer.ConsumeFromFirst), consumer.WithPollTimeout(100*time.Millisecond),
		consumer.WithHandoverLocks(false), consumer.WithBrokerSuspend(500*time.Millisecond), consumer.WithPullDelays(20*time.Millisecond, 20*time.Millisecond, 50*time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, c.Subscribe(topic, "*"))
	sctx, cancel := context.WithTimeout(ctx, wait)
	require.NoError(t, c.Start(sctx))
	cancel()
	t.Cleanup(func() { c.Close(context.Background()) })

	var mu sync.Mutex
	var got []string
	go func() {
		for {
			ms, err := c.Poll(context.Background())
			if errors.Is(err, consumer.ErrNotRunning) || c.State() != consumer.Running {
				return
			}
			mu.Lock()
			for _, msg := range ms {
				got = append(got, string(msg.Body[:4]))
			}
			mu.Unlock()
		}
	}()
	received := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(got)
	}
	stats := func() map[int64]consumer.ReadStat {
		out := map[int64]consumer.ReadStat{}
		for _, s := range c.ReadStats() {
			out[s.BrokerID] = s
		}
		return out
	}

	require.Eventually(t, func() bool { return received() == history }, wait, 5*time.Millisecond)
	st := stats()
	require.Greater(t, st[2].Messages, st[0].Messages, "the history mostly from the replica: %v", st)
	mark := st[0].Pulls
	require.Eventually(t, func() bool { return stats()[0].Pulls > mark+1 }, wait, 5*time.Millisecond, "caught up: back at the master")

	// The master is cut off; the replica takes the next sends (as once promoted).
	px.refuse(true)
	px.cutClientSide()
	rRole.replica.Store(false)
	before := stats()
	for i := history; i < history+fresh; i++ {
		_, err := r.Send(ctx, protocol.Message{Topic: topic, Body: fmt.Appendf(nil, "%04d%s", i, pad)}, 0)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return received() == history+fresh }, wait, 5*time.Millisecond, "the fresh messages from the replica")
	after := stats()
	require.Equal(t, int64(fresh), after[2].Messages-before[2].Messages, "%v then %v", before, after)

	mu.Lock()
	defer mu.Unlock()
	for i, b := range got {
		require.Equal(t, fmt.Sprintf("%04d", i), b, "message %d: once each, in order", i)
	}
}
