package replication

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/protocol"
	"github.com/stretchr/testify/require"
)

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 4}))
}

func storeOptions() store.Options {
	return store.Options{
		StoreHost:     netip.MustParseAddrPort("127.0.0.1:10911"),
		Logger:        quietLogger(),
		SegmentSize:   64 << 10, // small: streams cross segment rolls
		FlushInterval: 10 * time.Millisecond,
		CleanInterval: time.Hour,
		MaxDiskUsage:  -1,
	}
}

// node is one member's data directory: a store and its epoch file.
type node struct {
	t      testing.TB
	name   string
	dir    string
	st     *store.Store
	epochs *EpochFile
}

func newNode(t testing.TB, name string) *node {
	n := &node{t: t, name: name, dir: t.TempDir()}
	n.open()
	t.Cleanup(func() {
		if n.st != nil {
			n.st.Close()
		}
	})
	return n
}

func (n *node) open() {
	st, err := store.Open(filepath.Join(n.dir, "store"), storeOptions())
	require.NoError(n.t, err)
	ep, err := OpenEpochFile(filepath.Join(n.dir, EpochFileName))
	require.NoError(n.t, err)
	n.st, n.epochs = st, ep
}

func (n *node) close() {
	require.NoError(n.t, n.st.Close())
	n.st = nil
}

func (n *node) put(t *testing.T, topic string, i int) store.PutResult {
	m := &protocol.MessageExt{QueueID: int32(i % 4), BornTimestamp: 1, BornHost: netip.MustParseAddrPort("127.0.0.1:1")}
	m.Topic = topic
	m.Body = bytes.Repeat([]byte(fmt.Sprintf("%s-%05d|", n.name, i)), 20)
	r, err := n.st.Put(context.Background(), m)
	require.NoError(t, err)
	return r
}

func (n *node) end() int64 { w, _ := n.st.Positions(); return w }

func startMaster(t *testing.T, n *node, epoch int64, sync bool, minInSync int) *Master {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	m, err := StartMaster(ln, MasterConfig{
		Store: n.st, Epochs: n.epochs, Epoch: epoch, Cluster: "c", BrokerName: "b",
		Sync: sync, MinInSync: minInSync, Heartbeat: 50 * time.Millisecond, Logger: quietLogger(),
	})
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return m
}

// follow runs a follower of addr on n until the returned stop is called; the error Run
// returned arrives on the channel.
func follow(t *testing.T, n *node, addr string, brokerName string) (stop func(), done <-chan error) {
	ctx, cancel := context.WithCancel(context.Background())
	f := NewFollower(ReplicaConfig{
		Store: n.st, Epochs: n.epochs, Cluster: "c", BrokerName: brokerName, Node: n.name,
		Master: func() string { return addr }, RetryInterval: 20 * time.Millisecond, Logger: quietLogger(),
	})
	ch := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); ch <- f.Run(ctx) }()
	stop = func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	return stop, ch
}

// eventually polls cond (a condition, not a speed: the bound only keeps a broken test
// from hanging).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never happened: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sameLog checks that two stores hold byte-identical commit logs.
func sameLog(t *testing.T, a, b *store.Store) {
	t.Helper()
	wa, _ := a.Positions()
	wb, _ := b.Positions()
	require.Equal(t, wa, wb)
	for off := int64(0); off < wa; {
		ba, next, err := a.ReadRaw(off, 1<<20)
		require.NoError(t, err)
		bb, nextB, err := b.ReadRaw(off, 1<<20)
		require.NoError(t, err)
		require.Equal(t, next, nextB)
		require.True(t, bytes.Equal(ba, bb), "logs differ at %d", off)
		off = next
	}
}

func TestSyncSendsCompleteOnceAReplicaHoldsThem(t *testing.T) {
	mn, r1, r2 := newNode(t, "m"), newNode(t, "r1"), newNode(t, "r2")
	m := startMaster(t, mn, 1, true, 2)
	follow(t, r1, m.Addr().String(), "b")
	follow(t, r2, m.Addr().String(), "b")
	eventually(t, "both replicas in sync", func() bool { return len(m.InSync()) == 2 })

	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for p := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				res := mn.put(t, "orders", p*1000+i)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := m.Wait(ctx, res.CommitLogOffset+int64(res.Size))
				cancel()
				if err != nil {
					errs <- err
					continue
				}
				// Acknowledged: at least one replica holds it now.
				w1, _ := r1.st.Positions()
				w2, _ := r2.st.Positions()
				if max(w1, w2) < res.CommitLogOffset+int64(res.Size) {
					errs <- fmt.Errorf("acknowledged %d, replicas at %d and %d", res.CommitLogOffset, w1, w2)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	eventually(t, "replicas caught up", func() bool { return r1.end() == mn.end() && r2.end() == mn.end() })
	sameLog(t, mn.st, r1.st)
	sameLog(t, mn.st, r2.st)
	require.Equal(t, []Epoch{{Epoch: 1, Start: 0}}, terms(r1.epochs.Epochs()), "the replica recorded the master's epoch")
	// The master learns a replica's offset from the replica's next report,
	// which may come a moment after the replica wrote the bytes.
	eventually(t, "the master sees both replicas at its end", func() bool {
		reps := m.Replicas()
		for _, r := range reps {
			if !r.InSync || r.Written != mn.end() {
				return false
			}
		}
		return len(reps) == 2
	})
}

func TestSyncRefusesWhenTooFewAreInSync(t *testing.T) {
	mn := newNode(t, "m")
	m := startMaster(t, mn, 1, true, 2)
	res := mn.put(t, "orders", 1)
	err := m.Wait(context.Background(), res.CommitLogOffset+int64(res.Size))
	require.ErrorIs(t, err, ErrNotEnoughInSync)

	// Async mode acknowledges at once, replicas or not.
	an := newNode(t, "a")
	am := startMaster(t, an, 1, false, 2)
	res = an.put(t, "orders", 1)
	require.NoError(t, am.Wait(context.Background(), res.CommitLogOffset+int64(res.Size)))
}

func TestSyncWaiterFailsAtItsDeadlineWhenTheReplicaStalls(t *testing.T) {
	mn, r1 := newNode(t, "m"), newNode(t, "r1")
	m := startMaster(t, mn, 1, true, 2)
	stop, _ := follow(t, r1, m.Addr().String(), "b")
	eventually(t, "replica in sync", func() bool { return len(m.InSync()) == 1 })
	stop() // the replica goes away after being counted in sync
	res := mn.put(t, "orders", 1)
	var got error
	done := make(chan struct{})
	m.Await(res.CommitLogOffset+int64(res.Size), time.Now().Add(300*time.Millisecond), func(err error) { got = err; close(done) })
	<-done
	require.ErrorIs(t, got, ErrNotEnoughInSync)
}

func TestReplicaResumesFromItsEndAfterARestart(t *testing.T) {
	mn, r1 := newNode(t, "m"), newNode(t, "r1")
	m := startMaster(t, mn, 1, false, 2)
	for i := range 300 {
		mn.put(t, "orders", i)
	}
	stop, _ := follow(t, r1, m.Addr().String(), "b")
	eventually(t, "caught up", func() bool { return r1.end() == mn.end() })
	stop()
	r1.close()
	for i := 300; i < 600; i++ {
		mn.put(t, "orders", i)
	}
	r1.open()
	before := r1.end()
	require.Less(t, before, mn.end())
	follow(t, r1, m.Addr().String(), "b")
	eventually(t, "caught up again", func() bool { return r1.end() == mn.end() })
	sameLog(t, mn.st, r1.st)
	eventually(t, "the replica's dispatcher built the queue", func() bool {
		return r1.st.MaxOffset("orders", 1) == 150 && mn.st.MaxOffset("orders", 1) == 150
	})
}

func TestDivergedReplicaCutsItsTailAndFollows(t *testing.T) {
	a, b := newNode(t, "a"), newNode(t, "b")
	// Epoch 1: a is master and b follows it for 50 messages.
	ma := startMaster(t, a, 1, false, 2)
	for i := range 50 {
		a.put(t, "orders", i)
	}
	stop, _ := follow(t, b, ma.Addr().String(), "b")
	eventually(t, "b caught up", func() bool { return b.end() == a.end() })
	stop()
	shared := a.end()
	// a writes on alone (its tail never reached b), then loses the mastership.
	for i := 50; i < 70; i++ {
		a.put(t, "orders", i)
	}
	require.NoError(t, ma.Close())
	// Epoch 2: b is master and takes sends.
	mb := startMaster(t, b, 2, false, 2)
	for i := range 10 {
		b.put(t, "orders", 100+i)
	}
	require.Equal(t, []Epoch{{Epoch: 1, Start: 0}, {Epoch: 2, Start: shared}}, terms(b.epochs.Epochs()))

	// a comes back as a replica: it is told to cut back to where epoch 1 ended on b.
	_, done := follow(t, a, mb.Addr().String(), "b")
	var div *DivergedError
	require.ErrorAs(t, <-done, &div)
	require.Equal(t, shared, div.TruncateTo)

	a.close()
	require.NoError(t, store.Truncate(filepath.Join(a.dir, "store"), div.TruncateTo, storeOptions()))
	require.NoError(t, a.epochs.TruncateTo(div.TruncateTo))
	a.open()
	require.Equal(t, shared, a.end())
	follow(t, a, mb.Addr().String(), "b")
	eventually(t, "a follows b", func() bool { return a.end() == b.end() })
	sameLog(t, b.st, a.st)
	require.Equal(t, b.epochs.Epochs(), a.epochs.Epochs())
}

func TestMasterRefusesAReplicaOfAnotherSet(t *testing.T) {
	mn, r := newNode(t, "m"), newNode(t, "r")
	m := startMaster(t, mn, 1, true, 2)
	_, done := follow(t, r, m.Addr().String(), "other")
	err := <-done
	require.ErrorIs(t, err, ErrRefused)
	require.Empty(t, m.InSync())
}

func TestReplicaRefusesADeposedMaster(t *testing.T) {
	old, r := newNode(t, "old"), newNode(t, "r")
	require.NoError(t, r.epochs.Add(Epoch{Epoch: 5, Start: 0}))
	m := startMaster(t, old, 3, false, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	f := NewFollower(ReplicaConfig{Store: r.st, Epochs: r.epochs, Cluster: "c", BrokerName: "b", Node: "r",
		Master: func() string { return m.Addr().String() }, Logger: quietLogger()})
	err := f.once(ctx)
	require.ErrorIs(t, err, ErrStaleMaster)
}

func TestSnapshotsReachReplicas(t *testing.T) {
	mn, r := newNode(t, "m"), newNode(t, "r")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	version := 1
	m, err := StartMaster(ln, MasterConfig{Store: mn.st, Epochs: mn.epochs, Epoch: 1, Cluster: "c", BrokerName: "b",
		SnapshotInterval: 20 * time.Millisecond, Logger: quietLogger(),
		Snapshots: func() map[string][]byte {
			mu.Lock()
			defer mu.Unlock()
			return map[string][]byte{"offsets": []byte(fmt.Sprintf(`{"v":%d}`, version))}
		}})
	require.NoError(t, err)
	defer m.Close()
	got := make(chan string, 100)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := NewFollower(ReplicaConfig{Store: r.st, Epochs: r.epochs, Cluster: "c", BrokerName: "b", Node: "r",
		Master: func() string { return m.Addr().String() }, Logger: quietLogger(),
		OnSnapshot: func(name string, data []byte) {
			select {
			case got <- name + "=" + string(data):
			default:
			}
		}})
	go f.Run(ctx)
	require.Equal(t, `offsets={"v":1}`, <-got)
	mu.Lock()
	version = 2
	mu.Unlock()
	for s := range got {
		if s == `offsets={"v":2}` {
			break
		}
	}
}

// An idle replica whose master goes away (no record to acknowledge) notices, and follows
// the next master it is pointed at.
func TestIdleReplicaFollowsTheNextMaster(t *testing.T) {
	mn, r := newNode(t, "m"), newNode(t, "r")
	m1 := startMaster(t, mn, 1, false, 2)
	var mu sync.Mutex
	addr := m1.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := NewFollower(ReplicaConfig{Store: r.st, Epochs: r.epochs, Cluster: "c", BrokerName: "b", Node: "r",
		Master: func() string { mu.Lock(); defer mu.Unlock(); return addr }, RetryInterval: 20 * time.Millisecond, Logger: quietLogger()})
	var wg sync.WaitGroup
	wg.Go(func() { f.Run(ctx) })
	defer wg.Wait()
	defer cancel()
	mn.put(t, "orders", 1)
	eventually(t, "caught up", func() bool { return r.end() == mn.end() })
	first := mn.end()
	require.NoError(t, m1.Close())
	m2 := startMaster(t, mn, 2, false, 2)
	mu.Lock()
	addr = m2.Addr().String()
	mu.Unlock()
	mn.put(t, "orders", 2)
	eventually(t, "following the next master", func() bool { return r.end() == mn.end() })
	require.Equal(t, []Epoch{{Epoch: 1, Start: 0}, {Epoch: 2, Start: first}}, terms(r.epochs.Epochs()))
}

// A master that welcomed the replica and then went silent (a paused process: its kernel
// keeps the connection open) is left as soon as the lease names another master, not after
// the replica's silence timeout (an hour here, so that only the lease can end it).
func TestReplicaLeavesASilentMasterOnceTheLeaseNamesAnother(t *testing.T) {
	mn, r := newNode(t, "m"), newNode(t, "r")
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer silent.Close()
	welcomed := make(chan struct{}, 1)
	go func() {
		c, err := silent.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br, bw := bufio.NewReader(c), bufio.NewWriter(c)
		var h hello
		if readJSON(br, frameHello, &h) != nil || writeJSON(bw, frameWelcome, welcome{Epoch: 1, TruncateTo: -1}) != nil {
			return
		}
		welcomed <- struct{}{}
		_, _ = io.Copy(io.Discard, br) // reads the acks, sends nothing, until the replica leaves
	}()
	var mu sync.Mutex
	addr := silent.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := NewFollower(ReplicaConfig{Store: r.st, Epochs: r.epochs, Cluster: "c", BrokerName: "b", Node: "r",
		Master:        func() string { mu.Lock(); defer mu.Unlock(); return addr },
		RetryInterval: 20 * time.Millisecond, SilenceTimeout: time.Hour, Logger: quietLogger()})
	var wg sync.WaitGroup
	wg.Go(func() { f.Run(ctx) })
	defer wg.Wait()
	defer cancel()
	select {
	case <-welcomed:
	case <-time.After(15 * time.Second):
		t.Fatal("the replica never reached the silent master")
	}
	m := startMaster(t, mn, 2, false, 2)
	mn.put(t, "orders", 1)
	mu.Lock()
	addr = m.Addr().String()
	mu.Unlock()
	eventually(t, "following the master the lease names", func() bool { return r.end() == mn.end() })
}

// terms is a history without its set identity, as the tests compare histories.
func terms(eps []Epoch) []Epoch {
	out := make([]Epoch, len(eps))
	for i, e := range eps {
		out[i] = Epoch{Epoch: e.Epoch, Start: e.Start}
	}
	return out
}
