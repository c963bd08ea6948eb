package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/consumer/allocate"
	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/protocol"
)

// ledger counts, across a group, how often each message was handed out.
type ledger struct {
	mu    sync.Mutex
	seen  map[string]int
	by    map[string]string // body → member
	dupes []string
}

func newLedger() *ledger { return &ledger{seen: map[string]int{}, by: map[string]string{}} }

func (l *ledger) add(member string, msgs []*consumer.Message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range msgs {
		b := string(m.Body)
		l.seen[b]++
		if l.seen[b] > 1 {
			l.dupes = append(l.dupes, fmt.Sprintf("%s (q%d@%d) by %s, before by %s", b, m.Queue.QueueID, m.QueueOffset, member, l.by[b]))
		}
		l.by[b] = member
	}
}

func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.seen)
}

// member polls in the background until its consumer shuts down.
type member struct {
	c    *consumer.LitePull
	name string
	done chan struct{}
}

func runMember(t *testing.T, c *consumer.LitePull, name string, l *ledger) *member {
	return runMemberTB(t, c, name, l)
}

func runMemberTB(t testing.TB, c *consumer.LitePull, name string, l *ledger) *member {
	m := &member{c: c, name: name, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		for {
			msgs, err := c.Poll(context.Background())
			if errors.Is(err, consumer.ErrNotRunning) {
				return
			}
			if err != nil {
				t.Errorf("%s: poll: %v", name, err)
				return
			}
			l.add(name, msgs)
		}
	}()
	return m
}

// expectedShares is what allocate.Averagely gives each member.
func expectedShares(t testing.TB, queues []consumer.MessageQueue, members []*member) map[*member][]consumer.MessageQueue {
	ids := make([]string, len(members))
	for i, m := range members {
		ids[i] = m.c.ClientID()
	}
	slices.Sort(ids)
	out := map[*member][]consumer.MessageQueue{}
	for _, m := range members {
		share, err := allocate.Averagely().Allocate(context.Background(), allocate.Request{Group: "g", ClientID: m.c.ClientID(), Queues: queues, ClientIDs: ids})
		require.NoError(t, err)
		out[m] = share
	}
	return out
}

// converged reports whether every member reads exactly its share.
func converged(t testing.TB, queues []consumer.MessageQueue, members []*member) bool {
	for m, share := range expectedShares(t, queues, members) {
		if !slices.Equal(m.c.ActiveQueues(), share) || !slices.Equal(m.c.Assignment(), share) {
			return false
		}
	}
	return true
}

func waitConverged(t *testing.T, what string, queues []consumer.MessageQueue, members []*member, within time.Duration) {
	t.Helper()
	start := time.Now()
	for !converged(t, queues, members) {
		if time.Since(start) > within {
			for _, m := range members {
				t.Logf("%s: assigned %v active %v", m.name, ids(m.c.Assignment()), ids(m.c.ActiveQueues()))
			}
			t.Fatalf("%s: no convergence within %v", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("%s: converged in %v", what, time.Since(start))
}

func ids(qs []consumer.MessageQueue) []int {
	out := make([]int, len(qs))
	for i, q := range qs {
		out[i] = q.QueueID
	}
	return out
}

// TestRebalanceExactlyOnce produces steadily while members join and leave: with hand-over
// locks every message is handed out exactly once across the group, and every member reaches
// its new share on the broker's notification, long before the (one-minute) rebalance timer.
func TestRebalanceExactlyOnce(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "rebal", 8)
	p := newProducer(t, b)
	l := newLedger()

	var sent atomic.Int64
	stop := make(chan struct{})
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := p.Send(context.Background(), &producer.Message{Topic: "rebal", Body: []byte(fmt.Sprintf("m-%06d", i))}); err != nil {
				t.Errorf("send: %v", err)
				return
			}
			sent.Add(1)
			time.Sleep(500 * time.Microsecond)
		}
	}()

	opts := []consumer.Option{
		consumer.WithConsumeFrom(consumer.ConsumeFromFirst),
		consumer.WithRebalanceInterval(time.Minute), // only notifications can explain fast convergence
		consumer.WithLockRetryInterval(100 * time.Millisecond),
		consumer.WithPollTimeout(100 * time.Millisecond),
	}
	c1 := newConsumer(t, b, "rebal-group", opts...)
	require.NoError(t, c1.Subscribe("rebal", "*"))
	require.NoError(t, c1.Start(context.Background()))
	m1 := runMember(t, c1, "m1", l)
	waitConverged(t, "m1 alone", queues, []*member{m1}, wait)
	time.Sleep(200 * time.Millisecond) // consume for a while in this shape

	c2 := newConsumer(t, b, "rebal-group", opts...)
	c3 := newConsumer(t, b, "rebal-group", opts...)
	require.NoError(t, c2.Subscribe("rebal", "*"))
	require.NoError(t, c3.Subscribe("rebal", "*"))
	require.NoError(t, c2.Start(context.Background()))
	m2 := runMember(t, c2, "m2", l)
	require.NoError(t, c3.Start(context.Background()))
	m3 := runMember(t, c3, "m3", l)
	// Within wait, far below the one-minute rebalance timer: the broker's notification did it.
	waitConverged(t, "m2 and m3 joined", queues, []*member{m1, m2, m3}, wait)
	time.Sleep(300 * time.Millisecond) // consume for a while in this shape

	require.NoError(t, c2.Close(context.Background()))
	<-m2.done
	waitConverged(t, "m2 left", queues, []*member{m1, m3}, wait)
	time.Sleep(300 * time.Millisecond) // consume for a while in this shape

	close(stop)
	<-produced
	total := int(sent.Load())
	require.Eventually(t, func() bool { return l.count() == total }, wait, 20*time.Millisecond,
		"every message consumed")
	time.Sleep(200 * time.Millisecond) // room for a late duplicate to show
	l.mu.Lock()
	defer l.mu.Unlock()
	assert.Empty(t, l.dupes, "no message handed out twice")
	assert.Len(t, l.seen, total)
	t.Logf("%d messages, %d duplicates", total, len(l.dupes))
}

// TestRebalanceCrashedMember: a member that dies without shutting down (its connection
// closes) loses its locks at once, and the others take its queues over.
func TestRebalanceCrashedMember(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "crash", 4)
	opts := []consumer.Option{consumer.WithRebalanceInterval(time.Minute), consumer.WithLockRetryInterval(50 * time.Millisecond)}
	c1 := newConsumer(t, b, "crash-group", opts...)
	c2 := newConsumer(t, b, "crash-group", opts...)
	for _, c := range []*consumer.LitePull{c1, c2} {
		require.NoError(t, c.Subscribe("crash", "*"))
		require.NoError(t, c.Start(context.Background()))
	}
	l := newLedger()
	m1, m2 := runMember(t, c1, "m1", l), runMember(t, c2, "m2", l)
	waitConverged(t, "two members", queues, []*member{m1, m2}, wait)
	c2.CrashForTest()
	waitConverged(t, "m2 crashed", queues, []*member{m1}, wait)
}

// TestRebalanceChurn joins and removes members in quick succession while producing, with
// each built-in stateless strategy and with a sticky one: still no duplicates, nothing lost.
func TestRebalanceChurn(t *testing.T) {
	for _, s := range []allocate.Strategy{allocate.ByCircle(), allocate.Sticky(allocate.Averagely())} {
		t.Run(s.Name(), func(t *testing.T) {
			b := startBroker(t, nil)
			createTopic(t, b, "churn", 8)
			p := newProducer(t, b)
			l := newLedger()
			var sent atomic.Int64
			stop := make(chan struct{})
			produced := make(chan struct{})
			go func() {
				defer close(produced)
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := p.Send(context.Background(), &producer.Message{Topic: "churn", Body: []byte(fmt.Sprintf("c-%06d", i))}); err != nil {
						t.Errorf("send: %v", err)
						return
					}
					sent.Add(1)
				}
			}()
			opts := []consumer.Option{
				consumer.WithConsumeFrom(consumer.ConsumeFromFirst),
				consumer.WithAllocateStrategy(s),
				consumer.WithLockRetryInterval(30 * time.Millisecond),
				consumer.WithPollTimeout(50 * time.Millisecond),
				consumer.WithPullBatchSize(4),
			}
			start := func(i int) *member {
				c, err := consumer.NewLitePull("churn-group", append(fastOpts(b), opts...)...)
				require.NoError(t, err)
				require.NoError(t, c.Subscribe("churn", "*"))
				require.NoError(t, c.Start(context.Background()))
				return runMember(t, c, fmt.Sprint("m", i), l)
			}
			members := []*member{start(0)}
			for i := 1; i <= 8; i++ {
				time.Sleep(60 * time.Millisecond)
				if i%3 == 0 {
					gone := members[0]
					members = members[1:]
					require.NoError(t, gone.c.Close(context.Background()))
					<-gone.done
				}
				members = append(members, start(i))
			}
			time.Sleep(200 * time.Millisecond)
			close(stop)
			<-produced
			total := int(sent.Load())
			require.Eventually(t, func() bool { return l.count() == total }, wait, 20*time.Millisecond)
			for _, m := range members {
				require.NoError(t, m.c.Close(context.Background()))
				<-m.done
			}
			l.mu.Lock()
			defer l.mu.Unlock()
			assert.Empty(t, l.dupes)
			t.Logf("%d messages, %d members at the end", total, len(members))
		})
	}
}

// TestStickyLeaveMovesOnlyTheLeaversQueues: with allocate.Sticky, the group's previous
// allocation is passed to the strategy, so a member leaving moves only its own queues.
func TestStickyLeaveMovesOnlyTheLeaversQueues(t *testing.T) {
	b := startBroker(t, nil)
	queues := createTopic(t, b, "sticky", 9)
	opts := []consumer.Option{
		consumer.WithAllocateStrategy(allocate.Sticky(allocate.Averagely())),
		consumer.WithRebalanceInterval(time.Minute),
		consumer.WithLockRetryInterval(30 * time.Millisecond),
	}
	var cs []*consumer.LitePull
	for range 3 {
		c := newConsumer(t, b, "sticky-group", opts...)
		require.NoError(t, c.Subscribe("sticky", "*"))
		require.NoError(t, c.Start(context.Background()))
		cs = append(cs, c)
	}
	active := func() int {
		n := 0
		for _, c := range cs {
			n += len(c.ActiveQueues())
		}
		return n
	}
	require.Eventually(t, func() bool {
		return active() == len(queues) && len(cs[0].ActiveQueues()) == 3 && len(cs[1].ActiveQueues()) == 3
	}, wait, 5*time.Millisecond)
	before := map[*consumer.LitePull][]consumer.MessageQueue{}
	for _, c := range cs {
		before[c] = c.ActiveQueues()
	}
	// The member holding queue 0 leaves: under plain Averagely every range would shift.
	var leaver *consumer.LitePull
	for _, c := range cs {
		if slices.Contains(before[c], queues[0]) {
			leaver = c
		}
	}
	require.NoError(t, leaver.Close(context.Background()))
	cs = slices.DeleteFunc(cs, func(c *consumer.LitePull) bool { return c == leaver })
	require.Eventually(t, func() bool { return active() == len(queues) }, wait, 5*time.Millisecond)
	for _, c := range cs {
		now := c.ActiveQueues()
		for _, q := range before[c] {
			assert.Contains(t, now, q, "a remaining member kept its queues")
		}
		assert.Contains(t, []int{4, 5}, len(now), "balanced")
	}
}

// TestLostConnectionRelocksAtOnce: a broker drops a member whose connection closes and
// releases its queue locks at once, so another member may take the queues over. The member
// must not go on reading them on the strength of locks it no longer holds: it stops handing
// them out, rejoins and locks them again, without waiting for its lock-renewal timer.
func TestLostConnectionRelocksAtOnce(t *testing.T) {
	b, px := startBrokerBehindProxy(t)
	queues := createTopic(t, b, "relock", 4)
	left := make(chan string, 16)
	cancel := b.Subscribe(func(e broker.Event) {
		if e.Type == broker.MemberLeft && e.Group == "relock-group" {
			left <- e.ClientID + " " + e.Reason
		}
	})
	defer cancel()
	// Renewals every 20 minutes: only the reaction to the lost connection can re-lock in time.
	c := newConsumer(t, b, "relock-group", consumer.WithLockLease(time.Hour), consumer.WithRebalanceInterval(time.Hour))
	require.NoError(t, c.Subscribe("relock", "*"))
	require.NoError(t, c.Start(context.Background()))
	holdsAll := func() bool {
		locks := b.LockedQueues("relock-group")
		for _, mq := range queues {
			if locks[mq] != c.ClientID() {
				return false
			}
		}
		return len(c.ActiveQueues()) == len(queues) && slices.Equal(b.GroupMembers("relock-group"), []string{c.ClientID()})
	}
	require.Eventually(t, holdsAll, wait, 5*time.Millisecond)

	// The broker sees the connection close first, and releases the locks ...
	px.cutTargetSide()
	select {
	case got := <-left:
		require.Equal(t, c.ClientID()+" connection closed", got)
	case <-time.After(wait):
		t.Fatal("the broker did not drop the member")
	}
	// (The event is emitted as the member leaves; its locks are released right after.)
	require.Eventually(t, func() bool { return len(b.LockedQueues("relock-group")) == 0 }, wait, time.Millisecond)
	// ... then the client does.
	px.cutClientSide()
	require.Eventually(t, holdsAll, wait, 5*time.Millisecond, "rejoined and re-locked every queue")

	p := newProducer(t, b)
	var sent []string
	for _, mq := range queues {
		sent = append(sent, produceTo(t, p, mq, fmt.Sprint("after-", mq.QueueID), 2, nil)...)
	}
	assert.Equal(t, sorted(sent), sortedBodies(pollN(t, c, len(sent), wait)))
}

// TestRegrantedLockIsALostLock: the broker releases a member's locks when its connection
// closes; meanwhile another member locks the queue, reads it and commits. When the member
// reconnects and its lock renewal is granted, that is a new lock, not a renewal: the member
// drops the messages it had cached and starts at the committed offset, rather than handing
// out what the other member already consumed.
func TestRegrantedLockIsALostLock(t *testing.T) {
	b, px := startBrokerBehindProxy(t)
	mq := createTopic(t, b, "regrant", 1)[0]
	const group = "regrant-group"
	p := newProducer(t, b)
	produceTo(t, p, mq, "before", 10, nil)

	c := newConsumer(t, b, group,
		consumer.WithConsumeFrom(consumer.ConsumeFromFirst),
		consumer.WithPullBatchSize(4),
		consumer.WithAutoCommitInterval(time.Hour),
		consumer.WithLockLease(time.Hour),
		consumer.WithRebalanceInterval(time.Hour))
	require.NoError(t, c.Subscribe("regrant", "*"))
	require.NoError(t, c.Start(context.Background()))
	first := pollN(t, c, 1, wait)
	require.NotEmpty(t, first)
	require.Equal(t, "before-0", string(first[0].Body))
	require.Eventually(t, func() bool { return c.CachedCount(mq) > 0 }, wait, 5*time.Millisecond, "more is cached")

	// The member's connection goes, and it cannot reconnect for now.
	px.refuse(true)
	px.cutTargetSide()
	require.Eventually(t, func() bool { return len(b.LockedQueues(group)) == 0 }, wait, 5*time.Millisecond)
	px.cutClientSide()
	require.Eventually(t, func() bool { return len(c.ActiveQueues()) == 0 }, wait, 5*time.Millisecond, "stops handing out")

	// Another member takes the queue, consumes all of it, commits and lets go (straight to
	// the broker: the proxy still refuses).
	other := admin(t, b)
	ctx := context.Background()
	lockBody, err := protocol.MarshalBody(&protocol.LockBatchRequestBody{ConsumerGroup: group, ClientID: other.ID(), MQSet: []protocol.MessageQueue{mq}})
	require.NoError(t, err)
	resp, err := other.InvokeOK(ctx, px.target, protocol.NewRequest(protocol.LockBatchMQ, nil, lockBody))
	require.NoError(t, err)
	var locked protocol.LockBatchResponseBody
	require.NoError(t, protocol.UnmarshalBody(resp.Body, &locked))
	require.Equal(t, []protocol.MessageQueue{mq}, locked.LockOKMQSet)
	commit := protocol.UpdateConsumerOffsetRequestHeader{ConsumerGroup: group, Topic: mq.Topic, QueueID: int32(mq.QueueID), CommitOffset: 10}
	_, err = other.InvokeOK(ctx, px.target, protocol.NewRequestWith(protocol.UpdateConsumerOffset, &commit, nil))
	require.NoError(t, err)
	_, err = other.InvokeOK(ctx, px.target, protocol.NewRequest(protocol.UnlockBatchMQ, nil, lockBody))
	require.NoError(t, err)
	off, ok := b.CommittedOffset(group, mq.Topic, int32(mq.QueueID))
	require.True(t, ok)
	require.Equal(t, int64(10), off)

	// The member comes back and gets its lock again: nothing below offset 10 is handed out.
	px.refuse(false)
	require.Eventually(t, func() bool { return len(c.ActiveQueues()) == 1 }, wait, 5*time.Millisecond, "re-locked")
	after := produceTo(t, p, mq, "after", 3, nil)
	got := pollN(t, c, len(after), wait)
	for _, m := range got {
		require.GreaterOrEqual(t, m.QueueOffset, int64(10), "handed out %q, which the other member had consumed and committed", m.Body)
	}
	require.Equal(t, after, bodies(got))
}

// TestRegrantedLockUnclaimedResumes: when nobody committed the queue while the member's lock
// was lost, the member re-reads the committed offset, finds its own, and goes on past what it
// had handed out: nothing is handed out twice, nothing skipped.
func TestRegrantedLockUnclaimedResumes(t *testing.T) {
	b, px := startBrokerBehindProxy(t)
	mq := createTopic(t, b, "resume", 1)[0]
	const group = "resume-group"
	p := newProducer(t, b)
	sent := produceTo(t, p, mq, "m", 10, nil)

	c := newConsumer(t, b, group,
		consumer.WithConsumeFrom(consumer.ConsumeFromFirst),
		consumer.WithPullBatchSize(4),
		consumer.WithAutoCommitInterval(time.Hour),
		consumer.WithLockLease(time.Hour),
		consumer.WithRebalanceInterval(time.Hour))
	require.NoError(t, c.Subscribe("resume", "*"))
	require.NoError(t, c.Start(context.Background()))
	got := pollN(t, c, 1, wait)
	require.NotEmpty(t, got)

	px.refuse(true)
	px.cutTargetSide()
	require.Eventually(t, func() bool { return len(b.LockedQueues(group)) == 0 }, wait, 5*time.Millisecond)
	px.cutClientSide()
	require.Eventually(t, func() bool { return len(c.ActiveQueues()) == 0 }, wait, 5*time.Millisecond)
	px.refuse(false)

	got = append(got, pollN(t, c, len(sent)-len(got), wait)...)
	require.Equal(t, sent, bodies(got), "each message once, in order")
}
