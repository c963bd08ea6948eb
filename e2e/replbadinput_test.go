package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/protocol"
)

// sendTo sends one message of body to replTopic at addr and returns the broker's answer.
func sendTo(t *testing.T, addr, body string) (protocol.ResponseCode, string, error) {
	t.Helper()
	c, err := clientcore.New(clientcore.Options{NameServers: []string{"127.0.0.1:1"}})
	require.NoError(t, err)
	defer c.Close(context.Background())
	h := &protocol.SendMessageRequestHeader{ProducerGroup: "e2e", Topic: replTopic, DefaultTopic: protocol.AutoCreateTopicKey,
		DefaultTopicQueueNums: 2, BornTimestamp: time.Now().UnixMilli()}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	resp, err := c.Invoke(ctx, addr, protocol.NewRequest(protocol.SendMessageV2, h.EncodeV2(), []byte(body)))
	if err != nil {
		return 0, "", err
	}
	return resp.ResponseCode(), resp.Remark, nil
}

// JetStream without a quorum (docs/cluster.md, "Election and fencing"): every member cut
// off from the others, so no NATS server has a majority of the lease's Raft group. Async
// mode, where a master needs no replica to take a send: the refusals are the lease's. The
// master fences itself and refuses sends with SERVICE_NOT_AVAILABLE, every member does,
// and nobody is elected for three lease TTLs (1 s here); healed, the set has one master again.
func TestReplicaSetWithoutJetStreamQuorumRefusesWritesAndElectsNobody(t *testing.T) {
	fnet := newFaultNet(t)
	nodes := startReplicaSetNet(t, "async", fnet, "--replication-lease-ttl", "1s")
	allInSync(t, nodes)
	m := nodeAt(nodes, masterAddr(nodes))
	require.NotNil(t, m)
	code, remark, err := sendTo(t, m.broker, "before")
	require.NoError(t, err)
	require.Equal(t, protocol.Success, code, remark)
	for _, n := range nodes {
		// Async mode: acknowledged before the replicas hold it, which they must before the
		// cut for it to survive a change of master.
		require.Eventually(t, func() bool { return bodiesAt(t, n.broker)["before"] == 1 }, wait, tick, "rs-%d holds the first send", n.id)
	}

	t0 := time.Now()
	for _, n := range nodes {
		fnet.isolate(n.id)
	}
	// Until it fences (2/3 TTL after its last renewal), the master still takes sends: they
	// are "cut" ones, acknowledged in async mode, kept if it is master again after the heal
	// (its log goes furthest) and lost if another member is. What is sent after it fenced
	// ("during") is stored nowhere.
	acked := 0
	require.Eventually(t, func() bool {
		code, _, err := sendTo(t, m.broker, "cut")
		if err == nil && code == protocol.Success {
			acked++
		}
		return err == nil && code == protocol.ServiceNotAvailable
	}, wait, tick, "the master refuses sends once it cannot renew its lease")
	time.Sleep(3 * time.Second) // three lease TTLs: long past any takeover
	for _, n := range nodes {
		code, remark, err := sendTo(t, n.broker, "during")
		require.NoError(t, err)
		require.Equal(t, protocol.ServiceNotAvailable, code, "rs-%d: %s", n.id, remark)
		require.Contains(t, remark, "broker is not its replica set's master", "rs-%d", n.id)
		require.False(t, logSince(n.logs.String(), "replica-set lease taken", t0), "rs-%d was elected without a quorum", n.id)
	}
	require.True(t, logSince(m.logs.String(), "fenced, taking no writes", t0), "the master fenced itself")
	t.Logf("without a JetStream quorum, every member refused sends (%s) and nobody was elected for %s", protocol.ServiceNotAvailable, time.Since(t0).Round(time.Second))

	fnet.heal()
	require.Eventually(t, func() bool {
		cur := masterAddr(nodes)
		if cur == "" {
			return false
		}
		code, _, err := sendTo(t, cur, "after")
		return err == nil && code == protocol.Success
	}, wait, 100*time.Millisecond, "healed, the set has a master that takes sends")
	for _, n := range nodes {
		n.followsAgainOrLeads(t, t0)
	}
	epochsAgree(t, nodes)
	oneMasterPerEpoch(t, nodes)
	got := bodiesAt(t, masterAddr(nodes))
	require.Equal(t, 1, got["before"])
	require.Equal(t, 1, got["after"])
	require.Zero(t, got["during"], "no member stored a send while the set had no quorum")
	require.LessOrEqual(t, got["cut"], acked, "a send refused before the fence was stored")
}

// followsAgainOrLeads waits until n, after since, follows a master or is one, and serves.
func (n *replNode) followsAgainOrLeads(t *testing.T, since time.Time) {
	t.Helper()
	require.Eventually(t, func() bool {
		logs := n.logs.String()
		return logSince(logs, "following master", since) || logSince(logs, "replica set: this node is master", since) ||
			!logSince(logs, "stepped down", since)
	}, wait, tick, "rs-%d follows or leads", n.id)
	n.serving(t)
}

// oddMemberIsRefused: a member of another store.segment_size is of another replica set
// as far as the stream goes (its log cannot be a byte copy of the master's): the master m
// refuses it, it takes no part (logged, for an operator) and never enters the in-sync set,
// and it refuses sends.
func oddMemberIsRefused(t *testing.T, like, m *replNode) {
	t.Helper()
	since := time.Now()
	odd := launchFourth(t, like, t.TempDir(), "store: {segment_size: 8MiB}\n")
	refusedMember(t, odd, "")
	require.Contains(t, m.logs.String(), "rs-4", "the master logged the refused member")
	code, remark, err := sendTo(t, odd.broker, "to-the-odd-one")
	require.NoError(t, err)
	require.Equal(t, protocol.ServiceNotAvailable, code, remark)
	time.Sleep(time.Second)
	for _, l := range logLine.FindAllStringSubmatch(m.logs.String(), -1) {
		if at, err := time.Parse(time.RFC3339Nano, l[1]); err == nil && !at.Before(since.Truncate(time.Millisecond)) && strings.Contains(l[2], "in-sync set published") {
			require.NotContains(t, l[2], "rs-4", "the refused member is never in sync")
		}
	}
}

// launchFourth starts a fourth member (broker id 4) of like's set on dir, with extra
// configuration.
func launchFourth(t *testing.T, like *replNode, dir, extra string) *daemon {
	t.Helper()
	args := append([]string(nil), like.args...)
	for i, a := range args {
		switch a {
		case "--broker-id":
			args[i+1] = "4"
		case "--nats-cluster-listen":
			args[i+1] = fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0])
		}
	}
	return launch(t, "rs-4", dir, extra, args...)
}

// refusedMember waits until d logs that its master refused it (the line holding want too),
// and checks that it answers /readyz not ready, saying why. It takes d's addresses from its
// serving line: d never becomes ready.
func refusedMember(t *testing.T, d *daemon, want string) string {
	t.Helper()
	var line string
	var m []string
	require.Eventually(t, func() bool {
		logs := d.logs.String()
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, "the master refused this replica; it takes no part until an operator acts") {
				line = l
			}
		}
		m = servingLine.FindStringSubmatch(logs)
		return line != "" && m != nil
	}, wait, tick, "%s serves and says it takes no part", d.name)
	require.Contains(t, line, want)
	d.broker, d.namesrv, d.nats, d.http, d.grpc = m[1], m[2], m[3], m[4], m[5]
	resp, err := http.Get("http://" + d.http + "/readyz")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "a refused member is not ready")
	require.Contains(t, string(body), "replica set: ", "it says why")
	require.Contains(t, string(body), want)
	return line
}

// A master whose disk fails steps down: its data directory is on a small tmpfs the test
// fills; the store's next allocation fails, the store refuses writes, the lease is no
// longer renewed, and an in-sync replica takes over with every acknowledged send. Needs
// root (mount); skipped otherwise.
func TestReplicaSetMasterWhoseDiskFailsStepsDown(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	// Only the commit log's disk fails: the data directory's store, not its NATS data.
	dir := t.TempDir()
	mnt := filepath.Join(dir, "data", "store")
	require.NoError(t, os.MkdirAll(mnt, 0o755))
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", mnt).CombinedOutput(); err != nil {
			t.Logf("umount %s: %v: %s", mnt, err, out)
		}
	})
	nodes := startReplicaSetDisk(t, dir)
	s := startSender(t, nodes)
	defer s.halt()
	require.Eventually(t, func() bool { return s.count() > 50 }, wait, tick, "sends acknowledged")
	allInSync(t, nodes)
	m := nodes[0]
	require.Equal(t, m.broker, masterAddr(nodes), "rs-1, on the small disk, is master")

	t0 := time.Now()
	filler, err := os.Create(filepath.Join(mnt, "filler"))
	require.NoError(t, err)
	buf := make([]byte, 1<<20)
	for {
		if _, err := filler.Write(buf); err != nil {
			break // the disk is full
		}
	}
	require.NoError(t, filler.Close())
	at := s.ackedBy(t, m.broker, t0, nodes)
	require.Eventually(t, func() bool { return logSince(m.logs.String(), "store write failed", t0) }, wait, tick, "the master's store failed")
	require.Eventually(t, func() bool { return logSince(m.logs.String(), "stepped down", t0) }, wait, tick, "the master stepped down")
	require.False(t, m.gone(), "the master lives on, a replica that takes no writes")
	cur := masterAddr(nodes)
	require.NotEqual(t, m.broker, cur)
	t.Logf("the master's disk filled; a send acknowledged by the new master %s later", at.Sub(t0).Round(time.Millisecond))
	s.halt()
	s.checkAcked(t, cur)
	oneMasterPerEpoch(t, nodes)
}

// startReplicaSetDisk starts a sync-mode set whose first member's directory is first,
// with 8 MiB segments so that the store allocates often.
func startReplicaSetDisk(t *testing.T, first string) []*replNode {
	t.Helper()
	ports := freePorts(t, 3)
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	nodes := make([]*replNode, 3)
	for i := range nodes {
		n := &replNode{id: i + 1, args: []string{
			"--broker-name", "rs", "--replication", "sync", "--broker-id", fmt.Sprint(i + 1), "--ha-listen", "127.0.0.1:0",
			"--nats-cluster-listen", fmt.Sprintf("127.0.0.1:%d", ports[i]), "--nats-routes", strings.Join(routes, ","),
		}}
		dir := t.TempDir()
		if i == 0 {
			dir = first
		}
		n.daemon = launch(t, fmt.Sprintf("rs-%d", i+1), dir, "store: {segment_size: 8MiB}\n", n.args...)
		nodes[i] = n
	}
	for _, n := range nodes {
		n.awaitServing()
		n.publish()
	}
	return nodes
}
