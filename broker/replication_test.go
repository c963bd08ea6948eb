package broker_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/internal/replication"
	"github.com/flowd-io/flowd/protocol"
)

// role is a test's broker.Replication: master (with a replication.Master) or replica, as
// the test decides; the daemon decides it from the cluster's lease.
type role struct {
	mu        sync.Mutex
	master    *replication.Master
	sync      bool
	minInSync int
}

func (r *role) Writable() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.master == nil {
		return fmt.Errorf("a replica: %w", broker.ErrNotMaster)
	}
	if n := len(r.master.InSync()) + 1; r.sync && n < r.minInSync {
		return fmt.Errorf("%d of %d members in sync: %w", n, r.minInSync, broker.ErrNotEnoughInSync)
	}
	return nil
}

func (r *role) Sync() bool { return r.sync }

func (r *role) Await(end int64, deadline time.Time, done func(error)) {
	r.mu.Lock()
	m := r.master
	r.mu.Unlock()
	if m == nil {
		done(broker.ErrNotMaster)
		return
	}
	m.Await(end, deadline, done)
}

func (r *role) become(t *testing.T, b *testBroker, epoch int64) *replication.Master {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	eps, err := replication.OpenEpochFile(filepath.Join(b.cfg.DataDir, replication.EpochFileName))
	require.NoError(t, err)
	m, err := replication.StartMaster(ln, replication.MasterConfig{
		Store: b.Store(), Epochs: eps, Epoch: epoch, Cluster: "c", BrokerName: "b", Sync: r.sync, MinInSync: r.minInSync,
		Heartbeat: 50 * time.Millisecond, SnapshotInterval: 50 * time.Millisecond, Logger: b.cfg.Logger,
		Snapshots: func() map[string][]byte {
			offs, _ := b.OffsetsSnapshot()
			topics, _ := b.TopicsSnapshot()
			groups, _ := b.GroupsSnapshot()
			pop, _ := b.PopSnapshot()
			return map[string][]byte{"offsets": offs, "topics": topics, "groups": groups, "pop": pop}
		},
	})
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	r.mu.Lock()
	r.master = m
	r.mu.Unlock()
	return m
}

func (r *role) demote() {
	r.mu.Lock()
	m := r.master
	r.master = nil
	r.mu.Unlock()
	if m != nil {
		m.Close()
	}
}

// followBroker streams from addr into b's store and applies the snapshots, until stop.
func followBroker(t *testing.T, b *testBroker, addr string) (stop func()) {
	eps, err := replication.OpenEpochFile(filepath.Join(b.cfg.DataDir, replication.EpochFileName))
	require.NoError(t, err)
	f := replication.NewFollower(replication.ReplicaConfig{
		Store: b.Store(), Epochs: eps, Cluster: "c", BrokerName: "b", Node: b.Addr(),
		Master: func() string { return addr }, Logger: b.cfg.Logger, RetryInterval: 20 * time.Millisecond,
		OnSnapshot: func(name string, data []byte) {
			switch name {
			case "offsets", "pop":
				require.NoError(t, b.MergeOffsets(data))
			case "topics":
				require.NoError(t, b.MergeTopics(data))
			case "groups":
				require.NoError(t, b.MergeGroups(data))
			}
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { f.Run(ctx) })
	stop = func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	return stop
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never happened: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestReplicaSetSyncSendsSurviveAPromotion: in sync mode every send a replica set's master
// acknowledges is already in its replica's log; the replica refuses sends; with its replica
// gone the master refuses sends rather than acknowledge them alone; and the promoted
// replica serves every acknowledged message exactly once, with the offsets consumers
// committed on the old master.
func TestReplicaSetSyncSendsSurviveAPromotion(t *testing.T) {
	const topic = "repl"
	mRole := &role{sync: true, minInSync: 2}
	rRole := &role{sync: true, minInSync: 2}
	m := startBroker(t, func(c *broker.Config) { c.Replication = mRole })
	r := startBroker(t, func(c *broker.Config) { c.Replication = rRole })
	hm := mRole.become(t, m, 1)
	stopFollow := followBroker(t, r, hm.Addr().String())
	waitFor(t, "the replica in sync", func() bool { return len(hm.InSync()) == 1 })

	cl := newTransport(t)
	var acked []string
	for i := range 50 {
		body := fmt.Sprintf("msg-%02d", i)
		resp, err := cl.Invoke(context.Background(), m.Addr(), syncSendRequest(topic, []byte(body)))
		require.NoError(t, err)
		require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
		acked = append(acked, body)
		mEnd := m.StoreStats().CommitLogMaxOffset
		rEnd, _ := r.Store().Positions()
		require.GreaterOrEqual(t, rEnd, mEnd, "acknowledged before the replica held it")
	}
	_, err := m.ResetOffsetsTo(context.Background(), "g", topic, map[int32]int64{0: 20})
	require.NoError(t, err)

	resp, err := cl.Invoke(context.Background(), r.Addr(), syncSendRequest(topic, []byte("to-replica")))
	require.NoError(t, err)
	require.Equal(t, protocol.ServiceNotAvailable, resp.ResponseCode(), resp.Remark)

	waitFor(t, "offsets and topics reached the replica", func() bool {
		off, ok := r.CommittedOffset("g", topic, 0)
		_, hasTopic := r.Topic(topic)
		return ok && off == 20 && hasTopic
	})

	stopFollow()
	waitFor(t, "the replica left the in-sync set", func() bool { return len(hm.InSync()) == 0 })
	resp, err = cl.Invoke(context.Background(), m.Addr(), syncSendRequest(topic, []byte("alone")))
	require.NoError(t, err)
	require.Equal(t, protocol.SystemError, resp.ResponseCode())
	require.Contains(t, resp.Remark, "in-sync replicas not enough")

	// Failover: the old master steps down, the replica takes epoch 2.
	mRole.demote()
	rRole.sync = false
	rRole.become(t, r, 2)
	require.NoError(t, r.Promoted(context.Background()))
	resp, err = cl.Invoke(context.Background(), r.Addr(), syncSendRequest(topic, []byte("after")))
	require.NoError(t, err)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	resp, err = cl.Invoke(context.Background(), m.Addr(), syncSendRequest(topic, []byte("to-old-master")))
	require.NoError(t, err)
	require.Equal(t, protocol.ServiceNotAvailable, resp.ResponseCode())

	waitFor(t, "the promoted replica dispatched", func() bool { return r.StoreMax(topic, 0) == int64(len(acked)+1) })
	got := allBodies(t, cl, r, topic)
	for _, body := range acked {
		require.True(t, got[body], "acknowledged %s missing on the new master", body)
	}
	require.Len(t, got, len(acked)+1, "each message once")
	off, ok := r.CommittedOffset("g", topic, 0)
	require.True(t, ok)
	require.Equal(t, int64(20), off)
}

// TestProduceAndSendFollowTheReplicaSet: the sends that do not come over remoting (gRPC's
// Produce, the control plane's Send) obey the replica set as remoting sends do: a replica
// stores nothing, and in sync mode a send returns only once the replica holds it.
func TestProduceAndSendFollowTheReplicaSet(t *testing.T) {
	const topic = "repl-produce"
	mRole := &role{sync: true, minInSync: 2}
	rRole := &role{sync: true, minInSync: 2}
	m := startBroker(t, func(c *broker.Config) { c.Replication = mRole })
	r := startBroker(t, func(c *broker.Config) { c.Replication = rRole })
	tc := broker.TopicConfig{Name: topic, ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermRead | protocol.PermWrite}
	require.NoError(t, m.CreateTopic(tc))
	require.NoError(t, r.CreateTopic(tc))
	ctx := context.Background()
	req := func(body string) broker.ProduceRequest {
		return broker.ProduceRequest{Message: protocol.Message{Topic: topic, Body: []byte(body)}, QueueID: -1}
	}

	before := r.StoreStats().CommitLogMaxOffset
	_, err := r.Produce(ctx, req("to-replica"))
	require.ErrorIs(t, err, broker.ErrNotMaster)
	_, err = r.Send(ctx, protocol.Message{Topic: topic, Body: []byte("to-replica")}, -1)
	require.ErrorIs(t, err, broker.ErrNotMaster)
	require.Equal(t, before, r.StoreStats().CommitLogMaxOffset, "a replica stored a send")

	hm := mRole.become(t, m, 1)
	_, err = m.Produce(ctx, req("alone"))
	require.ErrorIs(t, err, broker.ErrNotEnoughInSync, "a sync master without its replica takes a send")

	followBroker(t, r, hm.Addr().String())
	waitFor(t, "the replica in sync", func() bool { return len(hm.InSync()) == 1 })
	for i := range 10 {
		_, err := m.Produce(ctx, req(fmt.Sprintf("p-%d", i)))
		require.NoError(t, err)
		rEnd, _ := r.Store().Positions()
		require.GreaterOrEqual(t, rEnd, m.StoreStats().CommitLogMaxOffset, "Produce returned before the replica held it")
		_, err = m.Send(ctx, protocol.Message{Topic: topic, Body: []byte(fmt.Sprintf("s-%d", i))}, -1)
		require.NoError(t, err)
		rEnd, _ = r.Store().Positions()
		require.GreaterOrEqual(t, rEnd, m.StoreStats().CommitLogMaxOffset, "Send returned before the replica held it")
	}
}
