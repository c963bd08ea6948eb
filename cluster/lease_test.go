package cluster_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/cluster"
)

const leaseTTL = 600 * time.Millisecond

// runLease runs a member's lease on its own NATS connection until the returned stop.
func runLease(t *testing.T, s *natsserver.Server, node string, bootstrap bool) (*cluster.Lease, func()) {
	t.Helper()
	return runLeaseWith(t, s, cluster.LeaseOptions{Node: node, MayBootstrap: bootstrap})
}

// runLeaseWith is runLease with o's other settings (its KV, broker name, addresses, TTL and
// logger are the test's).
func runLeaseWith(t *testing.T, s *natsserver.Server, o cluster.LeaseOptions) (*cluster.Lease, func()) {
	t.Helper()
	return runLeaseWrapped(t, s, o, nil)
}

// runLeaseWrapped is runLeaseWith on the bucket as wrap returns it (nil: as it is).
func runLeaseWrapped(t *testing.T, s *natsserver.Server, o cluster.LeaseOptions, wrap func(jetstream.KeyValue) jetstream.KeyValue) (*cluster.Lease, func()) {
	t.Helper()
	js, err := jetstream.New(connect(t, s))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	kv, err := cluster.OpenReplicaSets(ctx, js, 1)
	cancel()
	require.NoError(t, err)
	if wrap != nil {
		kv = wrap(kv)
	}
	o.KV, o.BrokerName, o.HAAddr, o.Addr, o.Logger = kv, "b", o.Node+":ha", o.Node+":broker", quiet
	if o.TTL == 0 {
		o.TTL = leaseTTL
	}
	l := cluster.NewLease(o)
	rctx, rcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { l.Run(rctx) })
	stop := func() { rcancel(); wg.Wait() }
	t.Cleanup(stop)
	return l, stop
}

func eventuallyTrue(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never happened: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLeaseFailsOverToAnInSyncMember: the bootstrap member becomes master in epoch 1; when
// it stops renewing it fences itself, and of the others only the one it published in sync
// takes over, in epoch 2.
func TestLeaseFailsOverToAnInSyncMember(t *testing.T) {
	s := startNATS(t, false)
	a, stopA := runLease(t, s, "a", true)
	eventuallyTrue(t, "a is master", a.Held)
	b, _ := runLease(t, s, "b", false)
	c, _ := runLease(t, s, "c", false)
	a.SetInSync([]string{"b"})
	eventuallyTrue(t, "the in-sync set is published", func() bool {
		rec, ok := c.Leader()
		return ok && len(rec.InSync) == 1 && rec.InSync[0] == "b"
	})
	rec, _ := b.Leader()
	require.Equal(t, int64(1), rec.Epoch)
	require.Equal(t, "a", rec.Node)

	stopA() // a stops renewing (it died, or paused)
	eventuallyTrue(t, "b took over", func() bool {
		bHeld := b.Held()
		require.False(t, bHeld && a.Held(), "two members held the lease at once")
		return bHeld
	})
	require.False(t, a.Held(), "a master that cannot renew stops taking writes")
	eventuallyTrue(t, "c reads the new record", func() bool {
		rec, _ = c.Leader()
		return rec.Node != "a"
	})
	require.Equal(t, "b", rec.Node)
	require.Equal(t, int64(2), rec.Epoch)
	require.Equal(t, "b:ha", rec.HAAddr)
	require.False(t, c.Held(), "c was not in sync: it may not take over")
	el, _ := b.Counts()
	require.Equal(t, int64(1), el)
}

// TestLeaseFencesWhenJetStreamIsLost: with JetStream gone no member can renew or take
// over: the master fences itself and nobody is elected, so writes stop rather than split.
func TestLeaseFencesWhenJetStreamIsLost(t *testing.T) {
	s := startNATS(t, false)
	a, _ := runLease(t, s, "a", true)
	eventuallyTrue(t, "a is master", a.Held)
	b, _ := runLease(t, s, "b", false)
	a.SetInSync([]string{"b"})
	eventuallyTrue(t, "the in-sync set is published", func() bool {
		rec, ok := b.Leader()
		return ok && len(rec.InSync) == 1
	})
	s.Shutdown()
	eventuallyTrue(t, "a fenced itself", func() bool { return !a.Held() })
	time.Sleep(3 * leaseTTL)
	require.False(t, b.Held(), "no election without JetStream")
	require.False(t, a.Held())
	_, fenced := a.Counts()
	require.Equal(t, int64(1), fenced)
}

// staleKV answers Get with an entry it was given (a stream replica that has not caught up,
// as a direct get may be served by) while stale is set; the rest is the real bucket.
type staleKV struct {
	jetstream.KeyValue
	mu    sync.Mutex
	stale jetstream.KeyValueEntry
}

func (s *staleKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	s.mu.Lock()
	e := s.stale
	s.mu.Unlock()
	if e != nil {
		return e, nil
	}
	return s.KeyValue.Get(ctx, key)
}

// TestLeaseIgnoresAStaleRead: a read older than the revision the master last wrote is
// not taken for the record: the master keeps its lease, rather than renewing on the old
// revision, failing, and stepping down.
func TestLeaseIgnoresAStaleRead(t *testing.T) {
	s := startNATS(t, false)
	js, err := jetstream.New(connect(t, s))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	real, err := cluster.OpenReplicaSets(ctx, js, 1)
	require.NoError(t, err)
	kv := &staleKV{KeyValue: real}
	l := cluster.NewLease(cluster.LeaseOptions{KV: kv, BrokerName: "b", Node: "a", MayBootstrap: true, TTL: leaseTTL, Logger: quiet})
	rctx, rcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { l.Run(rctx) })
	defer wg.Wait()
	defer rcancel()
	eventuallyTrue(t, "a is master", l.Held)
	first, err := real.Get(ctx, "leader.b")
	require.NoError(t, err)
	eventuallyTrue(t, "a renewed", func() bool {
		e, err := real.Get(ctx, "leader.b")
		return err == nil && e.Revision() > first.Revision()
	})
	kv.mu.Lock()
	kv.stale = first
	kv.mu.Unlock()
	time.Sleep(3 * leaseTTL) // several rounds of stale reads
	require.True(t, l.Held(), "a stale read cost the master its lease")
	_, fenced := l.Counts()
	require.Zero(t, fenced)
}

// leaderlessKV is the bucket of a stream without a leader while down is set: reads are
// answered (direct gets, served by any replica), writes are not.
type leaderlessKV struct {
	jetstream.KeyValue
	down *atomic.Bool
}

func (k leaderlessKV) Put(ctx context.Context, key string, v []byte) (uint64, error) {
	if k.down.Load() {
		return 0, nats.ErrNoResponders
	}
	return k.KeyValue.Put(ctx, key, v)
}

func (k leaderlessKV) Update(ctx context.Context, key string, v []byte, rev uint64) (uint64, error) {
	if k.down.Load() {
		return 0, nats.ErrNoResponders
	}
	return k.KeyValue.Update(ctx, key, v, rev)
}

func (k leaderlessKV) Create(ctx context.Context, key string, v []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	if k.down.Load() {
		return 0, nats.ErrNoResponders
	}
	return k.KeyValue.Create(ctx, key, v, opts...)
}

// The lease bucket's stream loses its leader for longer than a TTL (its Raft group
// elects another): nobody can write, the master cannot renew and fences, and its lease
// lapses as the replica sees it. When JetStream answers again the replica gives the master
// two renew intervals before it takes the lease: the master, answered a little later,
// renews, and keeps it, in the same epoch. With positions compared and without.
func TestLeaseOutlivesAStreamWithoutLeader(t *testing.T) {
	for _, elect := range []bool{true, false} {
		t.Run(fmt.Sprintf("elect_longest_log=%v", elect), func(t *testing.T) {
			s := startNATS(t, false)
			var downA, downB atomic.Bool
			open := func(o cluster.LeaseOptions, down *atomic.Bool) *cluster.Lease {
				o.TTL = candidacyTTL
				l, _ := runLeaseWrapped(t, s, o, func(kv jetstream.KeyValue) jetstream.KeyValue { return leaderlessKV{kv, down} })
				return l
			}
			var pos func() cluster.LogPosition
			if elect {
				pos = func() cluster.LogPosition { return cluster.LogPosition{Epoch: 1, End: 100} }
			}
			a := open(cluster.LeaseOptions{Node: "a", MayBootstrap: true}, &downA)
			eventuallyTrue(t, "a is master", a.Held)
			b := open(cluster.LeaseOptions{Node: "b", Position: pos}, &downB)
			a.SetInSync([]string{"b"})
			eventuallyTrue(t, "the in-sync set is published", func() bool {
				rec, ok := b.Leader()
				return ok && len(rec.InSync) == 1
			})
			downA.Store(true)
			downB.Store(true)
			eventuallyTrue(t, "a fenced itself", func() bool { return !a.Held() })
			time.Sleep(2 * candidacyTTL) // b sees the lease lapse, and cannot take it
			require.False(t, b.Held())
			// JetStream answers b first: a's renewal was waiting out a call that went
			// unanswered.
			downB.Store(false)
			time.Sleep(300 * time.Millisecond)
			downA.Store(false)
			eventuallyTrue(t, "a renewed", a.Held)
			time.Sleep(2 * candidacyTTL)
			require.True(t, a.Held(), "a keeps the lease")
			require.False(t, b.Held(), "b took the lease from a master that renewed once JetStream answered")
			rec, _ := b.Leader()
			require.Equal(t, "a", rec.Node)
			require.Equal(t, int64(1), rec.Epoch)
			el, _ := b.Counts()
			require.Zero(t, el)
		})
	}
}
