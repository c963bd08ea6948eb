package consumer_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
	for range 4 {
		g := newGated(allocate.Sticky(allocate.Averagely()))
		c := newConsumer(t, b, group, consumer.WithAllocateStrategy(g), consumer.WithRebalanceInterval(time.Hour))
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
	gate.armed.Store(true)
	busy.Hooks().NotifyConsumerIDsChanged()
	select {
	case <-gate.entered:
	case <-time.After(wait):
		t.Fatal("the busy member did not rebalance")
	}

	require.NoError(t, first.Close(context.Background()))
	require.Eventually(t, func() bool { return len(watcher.OwnedQueues()) == 4 }, wait, 5*time.Millisecond,
		"the watcher rebalanced among three members")
	require.NoError(t, second.Close(context.Background()))
	close(gate.open)

	require.Eventually(t, func() bool {
		return exactlyOnce(watcher, busy) && len(watcher.ActiveQueues())+len(busy.ActiveQueues()) == len(queues)
	}, wait, 5*time.Millisecond, "every queue is read by exactly one survivor")
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
