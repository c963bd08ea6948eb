package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// leaseStream is the JetStream stream of the replica sets' lease bucket.
const leaseStream = "KV_flowd_replica_sets"

// streamLeader is the NATS server that leads the lease bucket's stream, as the server of
// nc answers ("" when it does not: no leader, or no answer in time).
func streamLeader(nc *nats.Conn) string {
	js, err := jetstream.New(nc)
	if err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := js.Stream(ctx, leaseStream)
	if err != nil {
		return ""
	}
	info, err := st.Info(ctx)
	if err != nil || info.Cluster == nil {
		return ""
	}
	return info.Cluster.Leader
}

// Losing the replica whose NATS server leads the lease bucket's stream (docs/cluster.md,
// "The lease is as available as its JetStream stream"): the stream's Raft group elects
// another leader, which takes longer than a master may go without renewing, so the master
// fences itself meanwhile, and a replica sees its lease lapse. Once JetStream answers
// again the replica gives the master two renew intervals before it takes a lapsed lease:
// the master renews, keeps its lease in the same epoch, and takes sends again; no member
// takes over. The replica is paused (SIGSTOP) and resumed once the master took sends again.
// FLOWD_LEADER_LOSS_ROUNDS=N runs N rounds (default 1).
func TestReplicaSetLosingTheLeaseStreamLeaderKeepsItsMaster(t *testing.T) {
	rounds := 1
	if v := os.Getenv("FLOWD_LEADER_LOSS_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		rounds = n
	}
	nodes := startReplicaSet(t, "sync")
	s := startSender(t, nodes)
	defer s.halt()
	require.Eventually(t, func() bool { return s.count() > 50 }, wait, tick, "sends acknowledged")
	fencedRounds := 0
	for r := range rounds {
		allInSync(t, nodes)
		old := masterAddr(nodes)
		m := nodeAt(nodes, old)
		require.NotNil(t, m, "the routes name a live master")
		nc, err := nats.Connect(m.nats)
		require.NoError(t, err)
		var leader *replNode
		require.Eventually(t, func() bool {
			name := streamLeader(nc)
			for _, n := range nodes {
				if n != m && name == fmt.Sprintf("rs-%d", n.id) {
					leader = n
					return true
				}
			}
			return false
		}, wait, tick, "the lease stream's leader is on a replica (the master moves it off its own server)")
		epoch := masterEpoch(t, m)
		t0 := time.Now()
		require.NoError(t, leader.cmd.Process.Signal(syscall.SIGSTOP))
		require.Eventually(t, func() bool {
			name := streamLeader(nc)
			return name != "" && name != fmt.Sprintf("rs-%d", leader.id)
		}, wait, tick, "JetStream elected another leader of the lease stream")
		elected := time.Now()
		mid := s.count()
		require.Eventually(t, func() bool { return s.count() > mid+20 }, wait, tick, "sends acknowledged once the stream has a leader again")
		// A replica that was to take the lease from the master would have by now: it saw
		// the lease lapse before the election ended, and waits two renew intervals (2/3 of
		// the default 3 s lease_ttl) after JetStream answered again. Wait that out twice.
		time.Sleep(4 * time.Second)
		require.Equal(t, old, masterAddr(nodes), "the master keeps its lease")
		require.Equal(t, epoch, masterEpoch(t, m), "in the same epoch")
		for _, n := range nodes {
			require.False(t, logSince(n.logs.String(), "replica-set lease taken: this node is master", t0), "rs-%d took the lease", n.id)
		}
		fenced := logSince(m.logs.String(), "fenced, taking no writes", t0)
		if fenced {
			fencedRounds++
		}
		graced := false
		for _, n := range nodes {
			graced = graced || logSince(n.logs.String(), "the master has two renew intervals to renew it", t0)
		}
		if os.Getenv("FLOWD_LEASE_TRACE") == "1" {
			logTrace(t, nodes, leader, t0, time.Now())
		}
		require.NoError(t, leader.cmd.Process.Signal(syscall.SIGCONT))
		nc.Close()
		t.Logf("round %d: rs-%d (the lease stream's leader) paused; JetStream elected another %s later; the master rs-%d fenced: %v, a replica gave it its grace: %v; it kept the lease",
			r+1, leader.id, elected.Sub(t0).Round(time.Millisecond), m.id, fenced, graced)
	}
	allInSync(t, nodes)
	s.halt()
	s.checkAcked(t, masterAddr(nodes))
	oneMasterPerEpoch(t, nodes)
	t.Logf("%d rounds: the master kept its lease in every one, fenced meanwhile in %d", rounds, fencedRounds)
}

// masterEpoch is the epoch of m's last "this node is master" line.
func masterEpoch(t *testing.T, m *replNode) string {
	t.Helper()
	all := masterLine.FindAllStringSubmatch(m.logs.String(), -1)
	require.NotEmpty(t, all)
	last := all[len(all)-1]
	require.True(t, strings.HasPrefix(last[1], "rs-"))
	return last[2]
}
