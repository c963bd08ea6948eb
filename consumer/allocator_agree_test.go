package consumer_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/consumer/allocate"
	"github.com/flowd-io/flowd/protocol"
)

// reversed is a test allocator standing in for a Wasm one: member i of n gets what
// averagely gives member n-1-i, so its assignment differs from the built-in fallback's. It
// computes the whole group at once (allocate.GroupStrategy) and counts its group calls.
type reversed struct {
	name       string
	groupCalls atomic.Int64
	deadlines  chan time.Duration // when set, each call reports its context's time left
}

func (r *reversed) Name() string { return r.name }

func (r *reversed) Allocate(ctx context.Context, req allocate.Request) ([]protocol.MessageQueue, error) {
	shares, err := r.group(ctx, req)
	if err != nil {
		return nil, err
	}
	return shares[req.ClientID], nil
}

func (r *reversed) AllocateGroup(ctx context.Context, req allocate.Request) (map[string][]protocol.MessageQueue, error) {
	r.groupCalls.Add(1)
	if r.deadlines != nil {
		left := time.Duration(-1)
		if d, ok := ctx.Deadline(); ok {
			left = time.Until(d)
		}
		select {
		case r.deadlines <- left:
		default:
		}
	}
	return r.group(ctx, req)
}

func (r *reversed) group(ctx context.Context, req allocate.Request) (map[string][]protocol.MessageQueue, error) {
	out := map[string][]protocol.MessageQueue{}
	n := len(req.ClientIDs)
	for i, id := range req.ClientIDs {
		req.ClientID = req.ClientIDs[n-1-i]
		share, err := allocate.Averagely().Allocate(ctx, req)
		if err != nil {
			return nil, err
		}
		out[id] = share
	}
	return out, nil
}

// groupShares is what strategy gives each of cs (sorted by client id) of queues.
func groupShares(t *testing.T, s allocate.Strategy, queues []consumer.MessageQueue, cs ...*consumer.LitePull) map[string][]consumer.MessageQueue {
	t.Helper()
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.ClientID()
	}
	slices.Sort(ids)
	shares, err := allocate.Group(context.Background(), s, allocate.Request{Group: "g", Queues: queues, ClientIDs: ids})
	require.NoError(t, err)
	return shares
}

// owns reports whether every member of cs reads exactly its share in want (and so every
// queue is read once).
func owns(want map[string][]consumer.MessageQueue, cs ...*consumer.LitePull) bool {
	if len(want) != len(cs) {
		return false
	}
	for _, c := range cs {
		got := c.ActiveQueues()
		slices.SortFunc(got, consumer.MessageQueue.Compare)
		if !slices.Equal(got, want[c.ClientID()]) || !slices.Equal(c.OwnedQueues(), want[c.ClientID()]) {
			return false
		}
	}
	return true
}

type eventLog struct {
	mu     sync.Mutex
	events []broker.Event
}

func (e *eventLog) add(ev broker.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, ev)
}

func (e *eventLog) of(typ broker.EventType, group string) []broker.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []broker.Event
	for _, ev := range e.events {
		if ev.Type == typ && ev.Group == group {
			out = append(out, ev)
		}
	}
	return out
}

// TestGroupAgreesOnAllocatorAndFallsBackWhileMembersDiffer: three members run the same
// (Wasm-like) allocator and use it. A fourth joins with another version of it: the broker
// emits AllocatorMismatch once, every member falls back to averagely (every queue read
// exactly once, the fallback's assignment, never a split between the two versions) and says
// so in its running info. When the odd member leaves, the others return to their allocator.
func TestGroupAgreesOnAllocatorAndFallsBackWhileMembersDiffer(t *testing.T) {
	b := startBroker(t, nil)
	var events eventLog
	t.Cleanup(b.Subscribe(events.add))
	topic := uniqueName(t)
	queues := createTopic(t, b, topic, 7)
	group := topic + "-group"
	v1 := &reversed{name: "WASM-reverse@1.0.0"}
	var cs []*consumer.LitePull
	for range 3 {
		c := newConsumer(t, b, group, consumer.WithAllocateStrategy(v1), consumer.WithRebalanceInterval(time.Hour))
		require.NoError(t, c.Subscribe(topic, "*"))
		require.NoError(t, c.Start(context.Background()))
		cs = append(cs, c)
	}
	shared := groupShares(t, v1, queues, cs...)
	require.NotEqual(t, groupShares(t, allocate.Averagely(), queues, cs...), shared, "the test allocator must differ from the fallback")
	require.Eventually(t, func() bool { return owns(shared, cs...) }, wait, 5*time.Millisecond, "the members use their shared allocator")
	assert.Empty(t, events.of(broker.AllocatorMismatch, group))
	info, err := b.DescribeGroup(group)
	require.NoError(t, err)
	for _, m := range info.Members {
		assert.Equal(t, "WASM-reverse@1.0.0", m.Allocator, "DescribeGroup shows each member's allocator")
	}

	v2 := &reversed{name: "WASM-reverse@2.0.0"}
	odd := newConsumer(t, b, group, consumer.WithAllocateStrategy(v2), consumer.WithRebalanceInterval(time.Hour))
	require.NoError(t, odd.Subscribe(topic, "*"))
	require.NoError(t, odd.Start(context.Background()))
	all := append(slices.Clone(cs), odd)
	fallback := groupShares(t, allocate.Averagely(), queues, all...)
	require.NotEqual(t, groupShares(t, v1, queues, all...), fallback)
	require.Eventually(t, func() bool { return owns(fallback, all...) }, wait, 5*time.Millisecond,
		"every member falls back to averagely while one runs another version")
	require.Eventually(t, func() bool { return len(events.of(broker.AllocatorMismatch, group)) == 1 }, wait, 5*time.Millisecond)
	ev := events.of(broker.AllocatorMismatch, group)[0]
	assert.Equal(t, "WASM-reverse@2.0.0", ev.Allocators[odd.ClientID()])
	assert.Equal(t, "WASM-reverse@1.0.0", ev.Allocators[cs[0].ClientID()])
	assert.Len(t, ev.Allocators, 4)
	for _, c := range all {
		props := c.Hooks().RunningInfo().Properties
		assert.Equal(t, allocate.NameAveragely, props["allocatorInUse"])
		assert.Contains(t, props["allocatorMismatch"], odd.ClientID()+"=WASM-reverse@2.0.0")
	}
	// Heartbeats repeat the same identities: no further event.
	for _, c := range all {
		require.NoError(t, c.HeartbeatForTest(context.Background()))
	}
	assert.Len(t, events.of(broker.AllocatorMismatch, group), 1, "one event per change, not per heartbeat")

	require.NoError(t, odd.Close(context.Background()))
	require.Eventually(t, func() bool { return owns(shared, cs...) }, wait, 5*time.Millisecond,
		"with the odd member gone the others return to their allocator")
	require.Eventually(t, func() bool { return len(events.of(broker.AllocatorMismatch, group)) == 2 }, wait, 5*time.Millisecond)
	assert.Equal(t, "agreed", events.of(broker.AllocatorMismatch, group)[1].Reason)
	for _, c := range cs {
		props := c.Hooks().RunningInfo().Properties
		assert.Equal(t, "WASM-reverse@1.0.0", props["allocatorInUse"])
		assert.Empty(t, props["allocatorMismatch"])
	}
}

// TestAllocatorRunsOncePerGroupChange: a strategy that computes the whole group is called
// once per change of its inputs, not once per member and rebalance, and within the allocate
// timeout.
func TestAllocatorRunsOncePerGroupChange(t *testing.T) {
	b := startBroker(t, nil)
	topic := uniqueName(t)
	queues := createTopic(t, b, topic, 5)
	s := &reversed{name: "WASM-once@1.0.0", deadlines: make(chan time.Duration, 1)}
	c := newConsumer(t, b, topic+"-group", consumer.WithAllocateStrategy(s), consumer.WithRebalanceInterval(time.Hour),
		consumer.WithAllocateTimeout(time.Minute))
	require.NoError(t, c.Subscribe(topic, "*"))
	require.NoError(t, c.Start(context.Background()))
	want := groupShares(t, &reversed{name: s.name}, queues, c)
	require.Eventually(t, func() bool { return owns(want, c) && !c.Settling() }, wait, 5*time.Millisecond)
	select {
	case left := <-s.deadlines:
		assert.Greater(t, left, time.Duration(0), "the strategy runs under the allocate timeout")
		assert.LessOrEqual(t, left, time.Minute)
	default:
		t.Fatal("the strategy was not called")
	}
	// The lock table changes while the member takes its queues (nothing held, then all), of
	// the topic and of the group's retry topic: at most one call per table seen. Then
	// rebalances with nothing changed call it no more.
	calls := s.groupCalls.Load()
	assert.LessOrEqual(t, calls, int64(4))
	for range 5 {
		done := c.Rebalances()
		c.Hooks().NotifyConsumerIDsChanged()
		require.Eventually(t, func() bool { return c.Rebalances() > done }, wait, 5*time.Millisecond)
	}
	assert.Equal(t, calls, s.groupCalls.Load(), "unchanged inputs: the group assignment is not computed again")
}

// TestLocksRenewedWhileTheStrategyRuns: a strategy that takes long (a Wasm allocator near its
// timeout) does not keep the member from renewing the locks it holds.
func TestLocksRenewedWhileTheStrategyRuns(t *testing.T) {
	const lease = 3 * time.Second
	b := startBroker(t, func(c *broker.Config) { c.LockLease = lease })
	topic := uniqueName(t)
	queues := createTopic(t, b, topic, 2)
	group := topic + "-group"
	gate := newGated(allocate.Averagely())
	opts := []consumer.Option{consumer.WithRebalanceInterval(time.Hour), consumer.WithLockLease(lease), consumer.WithLockRenewInterval(50 * time.Millisecond)}
	slow := newConsumer(t, b, group, append(opts, consumer.WithAllocateStrategy(gate), consumer.WithAllocateTimeout(time.Minute))...)
	require.NoError(t, slow.Subscribe(topic, "*"))
	require.NoError(t, slow.Start(context.Background()))
	require.Eventually(t, func() bool { return len(slow.ActiveQueues()) == len(queues) && !slow.Settling() }, wait, 5*time.Millisecond)

	gate.armed.Store(true)
	other := newConsumer(t, b, group, opts...)
	require.NoError(t, other.Subscribe(topic, "*"))
	require.NoError(t, other.Start(context.Background())) // the join makes the slow member allocate
	select {
	case <-gate.entered:
	case <-time.After(wait):
		t.Fatal("the slow member did not allocate")
	}
	before := slow.LockValidUntil(queues[0])
	require.False(t, before.IsZero())
	require.Eventually(t, func() bool { return slow.LockValidUntil(queues[0]).After(before) }, wait, 5*time.Millisecond,
		"the held locks are renewed while the strategy runs")
	close(gate.open)
	require.Eventually(t, func() bool {
		return owns(groupShares(t, allocate.Averagely(), queues, slow, other), slow, other)
	}, wait, 5*time.Millisecond)
}

// TestAllocatorVersionChangeWhileRunning: a member's allocator changes identity while it runs
// (a Wasm allocator's new version is activated on one member only): it tells the brokers
// before allocating with it, and the group falls back to averagely until the other member
// has the same version too.
func TestAllocatorVersionChangeWhileRunning(t *testing.T) {
	b := startBroker(t, nil)
	topic := uniqueName(t)
	queues := createTopic(t, b, topic, 5)
	group := topic + "-group"
	alg := &reversed{name: "WASM-reverse"}
	var versions [2]atomic.Value
	var cs []*consumer.LitePull
	for i := range 2 {
		versions[i].Store("WASM-reverse@1")
		s := allocate.WithIdentity(alg, func() string { return versions[i].Load().(string) })
		// No periodic heartbeat: the member must report the change itself.
		c := newConsumer(t, b, group, consumer.WithAllocateStrategy(s), consumer.WithRebalanceInterval(time.Hour), consumer.WithClientOptions(client.WithHeartbeatInterval(time.Hour)))
		require.NoError(t, c.Subscribe(topic, "*"))
		require.NoError(t, c.Start(context.Background()))
		cs = append(cs, c)
	}
	shared := groupShares(t, alg, queues, cs...)
	fallback := groupShares(t, allocate.Averagely(), queues, cs...)
	require.NotEqual(t, fallback, shared)
	require.Eventually(t, func() bool { return owns(shared, cs...) }, wait, 5*time.Millisecond)

	versions[0].Store("WASM-reverse@2")
	cs[0].Hooks().NotifyConsumerIDsChanged()
	require.Eventually(t, func() bool { return owns(fallback, cs...) }, wait, 5*time.Millisecond,
		"both members fall back while their versions differ")
	versions[1].Store("WASM-reverse@2")
	cs[1].Hooks().NotifyConsumerIDsChanged()
	require.Eventually(t, func() bool { return owns(shared, cs...) }, wait, 5*time.Millisecond,
		"back to the allocator once both run the new version")
}
