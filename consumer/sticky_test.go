package consumer_test

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/consumer/allocate"
	"github.com/flowd-io/flowd/protocol"
)

// gatedStrategy wraps a strategy; once armed, the next Allocate reports on entered and waits
// for open to be closed. It holds a member's rebalance at a chosen point, so that the member
// misses the group states that pass meanwhile.
type gatedStrategy struct {
	allocate.Strategy
	armed   atomic.Bool
	entered chan struct{}
	open    chan struct{}
}

func newGated(s allocate.Strategy) *gatedStrategy {
	return &gatedStrategy{Strategy: s, entered: make(chan struct{}, 1), open: make(chan struct{})}
}

func (g *gatedStrategy) Allocate(ctx context.Context, req allocate.Request) ([]protocol.MessageQueue, error) {
	if g.armed.CompareAndSwap(true, false) {
		g.entered <- struct{}{}
		select {
		case <-g.open:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Strategy.Allocate(ctx, req)
}

// TestStickyGroupAgreesWhateverEachMemberSaw: 11 queues, 4 members with a sticky strategy,
// the two lowest members leave one after the other. One survivor rebalances after each leave;
// the other is busy and rebalances only once both have left. Allocating from their own
// memories, they would disagree (one queue owned by nobody, another wanted by both, for
// good). Allocating from the group's lock table on the broker, which both read alike, every
// queue ends with exactly one reader.
func TestStickyGroupAgreesWhateverEachMemberSaw(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "sticky-agree", 11)
	const group = "sticky-agree-group"
	gates := map[*consumer.LitePull]*gatedStrategy{}
	var cs []*consumer.LitePull
	var logBuf syncBuf
	for i := range 4 {
		g := newGated(allocate.Sticky(allocate.Averagely()))
		lg := slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug})).With("member", i)
		c := newConsumer(t, b, group, consumer.WithAllocateStrategy(g), consumer.WithRebalanceInterval(time.Hour), consumer.WithClientOptions(client.WithLogger(lg)))
		require.NoError(t, c.Subscribe("sticky-agree", "*"))
		gates[c] = g
		cs = append(cs, c)
	}
	slices.SortFunc(cs, func(x, y *consumer.LitePull) int {
		switch {
		case x.ClientID() < y.ClientID():
			return -1
		case x.ClientID() > y.ClientID():
			return 1
		}
		return 0
	})
	for _, c := range cs {
		require.NoError(t, c.Start(context.Background()))
	}
	// Every queue read by exactly one of members.
	exactlyOnce := func(members ...*consumer.LitePull) bool {
		seen := map[consumer.MessageQueue]int{}
		for _, c := range members {
			for _, mq := range c.ActiveQueues() {
				seen[mq]++
			}
		}
		for _, mq := range queues {
			if seen[mq] != 1 {
				return false
			}
		}
		return len(seen) == len(queues)
	}
	require.Eventually(t, func() bool { return exactlyOnce(cs...) }, wait, 5*time.Millisecond)

	first, second, watcher, busy := cs[0], cs[1], cs[2], cs[3]
	gate := gates[busy]
	// The first member leaving is a change of inputs every member reacts to (a notice with
	// nothing changed may be answered from the member's last computation): the busy member
	// starts allocating for three members and is held there.
	gate.armed.Store(true)
	require.NoError(t, first.Close(context.Background()))
	select {
	case <-gate.entered:
	case <-time.After(wait):
		t.Fatal("the busy member did not rebalance")
	}
	require.Eventually(t, func() bool { return len(watcher.OwnedQueues()) == 4 }, wait, 5*time.Millisecond,
		"the watcher rebalanced among three members")
	require.NoError(t, second.Close(context.Background()))
	close(gate.open)

	if !assert.Eventually(t, func() bool {
		return exactlyOnce(watcher, busy) && len(watcher.ActiveQueues())+len(busy.ActiveQueues()) == len(queues)
	}, wait, 5*time.Millisecond, "every queue is read by exactly one survivor") {
		t.Logf("ids %s %s %s %s; watcher %v busy %v locks %v", first.ClientID(), second.ClientID(), watcher.ClientID(), busy.ClientID(), watcher.OwnedQueues(), busy.OwnedQueues(), b.LockedQueues(group))
		t.Log(logBuf.String())
		t.FailNow()
	}
	require.ElementsMatch(t, []int{5, 6}, []int{len(watcher.ActiveQueues()), len(busy.ActiveQueues())}, "balanced")
}

// TestSettlingEndsWhenAMemberDoesNotLock: a member that reads without hand-over locks keeps the
// group's lock table from ever matching the assignment. The members that lock stop re-reading
// it on their lock-retry timer after a while (the periodic rebalance remains), rather than
// asking the broker twice a second for good.
func TestSettlingEndsWhenAMemberDoesNotLock(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "settle", 4)
	const group = "settle-group"
	locking := newConsumer(t, b, group, consumer.WithRebalanceInterval(time.Hour))
	require.NoError(t, locking.Subscribe("settle", "*"))
	require.NoError(t, locking.Start(context.Background()))
	plain := newConsumer(t, b, group, consumer.WithHandoverLocks(false), consumer.WithRebalanceInterval(time.Hour))
	require.NoError(t, plain.Subscribe("settle", "*"))
	require.NoError(t, plain.Start(context.Background()))
	require.Eventually(t, func() bool { return len(locking.ActiveQueues()) == 2 && len(plain.ActiveQueues()) == 2 }, wait, 5*time.Millisecond)
	require.Eventually(t, func() bool { return !locking.Settling() }, wait, 5*time.Millisecond)
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestFailedRebalanceIsRetriedSoon: a rebalance that cannot ask the broker for the group's
// members or lock table keeps the current assignment, and is tried again on the lock-retry
// timer, not only at the next periodic rebalance.
func TestFailedRebalanceIsRetriedSoon(t *testing.T) {
	b, px := startBrokerBehindProxy(t)
	createTopic(t, b, "retry-soon", 2)
	px.refuse(true) // the name service is reached directly; the broker is not, for now
	c := newConsumer(t, b, "retry-soon-group", consumer.WithRebalanceInterval(time.Hour), consumer.WithLockRetryInterval(300*time.Millisecond))
	require.NoError(t, c.Subscribe("retry-soon", "*"))
	require.NoError(t, c.Start(context.Background()))
	require.Eventually(t, c.Settling, wait, 5*time.Millisecond, "a rebalance failed")
	px.refuse(false)
	require.Eventually(t, func() bool { return len(c.ActiveQueues()) == 2 }, wait, 5*time.Millisecond)
}
