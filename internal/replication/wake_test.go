package replication

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker/store"
)

// quietStreams are a master's and a replica's settings under which nothing but the store's
// hooks moves a stream: no heartbeat, no periodic acknowledgement, no silence timeout.
const quietStreams = time.Hour

func startQuietMaster(t *testing.T, n *node, sync bool) *Master {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	m, err := StartMaster(ln, MasterConfig{
		Store: n.st, Epochs: n.epochs, Epoch: 1, Cluster: "c", BrokerName: "b", Sync: sync, MinInSync: 2,
		Heartbeat: quietStreams, SnapshotInterval: quietStreams, Logger: quietLogger(),
	})
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return m
}

func followQuietly(t *testing.T, n *node, addr string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f := NewFollower(ReplicaConfig{
		Store: n.st, Epochs: n.epochs, Cluster: "c", BrokerName: "b", Node: n.name,
		Master: func() string { return addr }, AckInterval: quietStreams, SilenceTimeout: quietStreams, Logger: quietLogger(),
	})
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// In async mode nothing waits on the master's Await, yet a replica gets each append at
// once: the store's append hook wakes the idle stream (before, it looked only on its
// heartbeat, and an async replica was that far behind). With the heartbeat an hour away,
// only the hook can have sent the records.
func TestAsyncStreamWakesOnAppend(t *testing.T) {
	mn, rn := newNode(t, "m"), newNode(t, "r1")
	m := startQuietMaster(t, mn, false)
	followQuietly(t, rn, m.Addr().String())
	eventually(t, "the replica is connected and idle", func() bool { return len(m.InSync()) == 1 && m.idle.Load() == 1 })
	for round := range 3 {
		for i := range 5 {
			mn.put(t, "orders", round*5+i)
		}
		eventually(t, "the replica holds the master's log", func() bool { return rn.end() == mn.end() })
	}
	require.Equal(t, mn.end(), rn.end())
}

// Under store.flush sync a replica acknowledges its fsync as soon as the store reports it
// (the flush hook), so a sync-mode send completes without the periodic acknowledgement,
// which is an hour away here: the acknowledgement sent after the write precedes the fsync.
func TestSyncFlushReplicaAcknowledgesItsFsync(t *testing.T) {
	opts := storeOptions()
	opts.FlushMode = store.FlushSync
	open := func(n *node) {
		require.NoError(t, n.st.Close())
		st, err := store.Open(filepath.Join(n.dir, "store"), opts)
		require.NoError(t, err)
		n.st = st
	}
	mn, rn := newNode(t, "m"), newNode(t, "r1")
	open(mn)
	open(rn)
	m := startQuietMaster(t, mn, true)
	followQuietly(t, rn, m.Addr().String())
	eventually(t, "the replica is in sync", func() bool { return len(m.InSync()) == 1 })
	for i := range 5 {
		res := mn.put(t, "orders", i)
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		err := m.Wait(ctx, res.CommitLogOffset+int64(res.Size))
		cancel()
		require.NoError(t, err, "send %d acknowledged by the replica's fsync", i)
		_, flushed := rn.st.Positions()
		require.GreaterOrEqual(t, flushed, res.CommitLogOffset+int64(res.Size), "the replica fsynced what it acknowledged")
	}
}
