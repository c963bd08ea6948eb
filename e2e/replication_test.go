package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/protocol"
)

// The replica-set harness: three flowd processes of one broker name (broker ids 1-3, the
// lease in the cluster's JetStream R3), optionally linked through faultNet's proxies; a
// sender sending synchronously to whichever member the routes name master; the checks
// made after a fault (replfaults_test.go): every acknowledged message on the master exactly
// once, one epoch history.

const replTopic = "repl-orders"

type replNode struct {
	*daemon
	id   int
	args []string
	fnet *faultNet // nil: the members' links are direct
	past []string  // the logs of this member's earlier processes (before a kill -9)
	// view is what the sender's goroutine reads of the member while the test restarts it.
	view atomic.Pointer[nodeView]
}

type nodeView struct {
	namesrv string
	exited  chan struct{}
}

// publish makes the member's current process and addresses the sender's.
func (n *replNode) publish() {
	n.view.Store(&nodeView{namesrv: n.namesrv, exited: n.exited})
}

func startReplicaSet(t *testing.T, mode string, extra ...string) []*replNode {
	return startReplicaSetNet(t, mode, nil, extra...)
}

// startReplicaSetNet starts the three members; with fnet, every route and stream link
// between them goes through fnet's proxies.
func startReplicaSetNet(t *testing.T, mode string, fnet *faultNet, extra ...string) []*replNode {
	t.Helper()
	ports := freePorts(t, 3)
	var routes, advertise, haListen, haAdvertise []string
	for i, p := range ports {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
		if fnet != nil {
			ha := fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0])
			haListen = append(haListen, ha)
			haAdvertise = append(haAdvertise, fnet.proxy(i+1, ha))
			advertise = append(advertise, fnet.proxy(i+1, fmt.Sprintf("127.0.0.1:%d", p)))
		}
	}
	nodes := make([]*replNode, 3)
	for i := range nodes {
		n := &replNode{id: i + 1, fnet: fnet, args: []string{
			"--broker-name", "rs", "--replication", mode, "--broker-id", strconv.Itoa(i + 1),
			"--nats-cluster-listen", fmt.Sprintf("127.0.0.1:%d", ports[i]),
		}}
		if fnet == nil {
			n.args = append(n.args, "--ha-listen", "127.0.0.1:0", "--nats-routes", strings.Join(routes, ","))
		} else {
			// Routes to the others' proxies only, and this member known by its own proxy
			// when NATS gossips routes: no link bypasses the proxies.
			var viaProxy []string
			for j, a := range advertise {
				if j != i {
					viaProxy = append(viaProxy, "nats-route://"+a)
				}
			}
			n.args = append(n.args, "--ha-listen", haListen[i], "--ha-advertise", haAdvertise[i],
				"--nats-routes", strings.Join(viaProxy, ","), "--nats-cluster-advertise", advertise[i])
		}
		n.args = append(n.args, extra...)
		n.daemon = launch(t, fmt.Sprintf("rs-%d", i+1), t.TempDir(), "", n.args...)
		if fnet != nil {
			fnet.setPid(n.id, n.pid())
		}
		nodes[i] = n
	}
	for _, n := range nodes {
		n.awaitServing()
		n.publish()
	}
	return nodes
}

// allInSync waits until the master published both other members in sync in its lease: a
// fault before that leaves no member that may take over (or JetStream without quorum, a
// member still catching up), and no election, by design.
func allInSync(t *testing.T, nodes []*replNode) {
	t.Helper()
	require.Eventually(t, func() bool {
		m := nodeAt(nodes, masterAddr(nodes))
		if m == nil {
			return false
		}
		logs := m.logs.String()
		i := strings.LastIndex(logs, "replica-set in-sync set published")
		if i < 0 {
			return false
		}
		line, _, _ := strings.Cut(logs[i:], "\n")
		for _, n := range nodes {
			if n != m && !strings.Contains(line, fmt.Sprintf("rs-%d", n.id)) {
				return false
			}
		}
		return true
	}, wait, tick, "every member in sync")
}

// scrape is the node's /metrics page ("" when it does not answer).
func scrape(n *replNode) string {
	resp, err := http.Get("http://" + n.http + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// subscribeEvents subscribes, on a live node other than except, to one kind of cluster
// event.
func subscribeEvents(t *testing.T, nodes []*replNode, except *replNode, kind string) <-chan control.EventData {
	t.Helper()
	var on *replNode
	for _, n := range nodes {
		if n != except && !n.gone() {
			on = n
			break
		}
	}
	nc, err := nats.Connect(on.nats)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	out := make(chan control.EventData, 16)
	_, err = nc.Subscribe(control.EventSubjectPrefix+"."+cluster+"."+kind, func(m *nats.Msg) {
		var d control.EventData
		if json.Unmarshal(m.Data, &d) == nil {
			out <- d
		}
	})
	require.NoError(t, err)
	require.NoError(t, nc.FlushTimeout(wait))
	return out
}

func (n *replNode) restart(t *testing.T) {
	t.Helper()
	n.past = append(n.past, n.logs.String())
	n.daemon = launch(t, fmt.Sprintf("rs-%d restarted", n.id), n.dir, "", n.args...)
	if n.fnet != nil {
		n.fnet.setPid(n.id, n.pid())
	}
	// Not awaitServing: a restarted master may learn at once that its log diverged, cut it
	// and run again in place on new ports; serving follows its last "flowd serving" line.
	n.serving(t)
}

// refresh takes the member's addresses from its last "flowd serving" line, if it serves
// (it is not between a cut of its log and running again).
func (n *replNode) refresh() {
	logs := n.logs.String()
	if i := strings.LastIndex(logs, "the commit log was cut back"); i >= 0 && !servingLine.MatchString(logs[i:]) {
		return
	}
	all := servingLine.FindAllStringSubmatch(logs, -1)
	if len(all) == 0 {
		return
	}
	last := all[len(all)-1]
	n.broker, n.namesrv, n.nats, n.http, n.grpc = last[1], last[2], last[3], last[4], last[5]
	n.publish()
}

// serving waits until the member serves, and takes its addresses from its last "flowd
// serving" line: a member that cut its diverged log ran again in place, on new ports.
func (n *replNode) serving(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		logs := n.logs.String()
		if i := strings.LastIndex(logs, "the commit log was cut back"); i >= 0 && !servingLine.MatchString(logs[i:]) {
			return false // running again, not serving yet
		}
		all := servingLine.FindAllStringSubmatch(logs, -1)
		if len(all) == 0 {
			return false
		}
		last := all[len(all)-1]
		n.broker, n.namesrv, n.nats, n.http, n.grpc = last[1], last[2], last[3], last[4], last[5]
		resp, err := http.Get("http://" + n.http + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, wait, tick, "rs-%d serves", n.id)
	n.publish()
}

// masterAddr asks the live nodes' name services, all at once (a paused node does not
// answer), for the replica set's master (broker id 0), and returns the first answer.
func masterAddr(nodes []*replNode) string {
	answers := make(chan string, len(nodes))
	asked := 0
	for _, n := range nodes {
		v := n.view.Load()
		if v == nil || v.namesrv == "" {
			continue
		}
		select {
		case <-v.exited:
			continue
		default:
		}
		asked++
		go func(namesrv string) {
			r, err := routeBrokers(namesrv, protocol.AutoCreateTopicKey)
			if err != nil {
				r = nil
			}
			answers <- r["rs"]
		}(v.namesrv)
	}
	for range asked {
		if a := <-answers; a != "" {
			return a
		}
	}
	return ""
}

func nodeAt(nodes []*replNode, addr string) *replNode {
	for _, n := range nodes {
		if n.broker == addr && !n.gone() {
			return n
		}
	}
	return nil
}

// sender sends unique bodies synchronously to whichever node the routes name master, and
// records each acknowledged one with the broker that acknowledged it.
type sender struct {
	mu     sync.Mutex
	acked  map[string]string // body -> broker address
	last   time.Time         // last acknowledgement
	lastBy string
	stop   chan struct{}
	done   chan struct{}
	halted sync.Once
}

func startSender(t *testing.T, nodes []*replNode) *sender {
	s := &sender{acked: map[string]string{}, stop: make(chan struct{}), done: make(chan struct{})}
	c, err := clientcore.New(clientcore.Options{NameServers: []string{"127.0.0.1:1"}})
	require.NoError(t, err)
	go func() {
		defer close(s.done)
		defer c.Close(context.Background())
		addr := ""
		for i := 0; ; i++ {
			select {
			case <-s.stop:
				return
			default:
			}
			if addr == "" {
				if addr = masterAddr(nodes); addr == "" {
					time.Sleep(50 * time.Millisecond)
					continue
				}
			}
			body := fmt.Sprintf("m-%06d", i)
			h := &protocol.SendMessageRequestHeader{ProducerGroup: "e2e", Topic: replTopic, DefaultTopic: protocol.AutoCreateTopicKey,
				DefaultTopicQueueNums: 2, QueueID: int32(i % 2), BornTimestamp: time.Now().UnixMilli()}
			// 1 s: a paused master never answers, and the promotion time measured is the
			// set's, not the wait of a send to a master already replaced.
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			resp, err := c.Invoke(ctx, addr, protocol.NewRequest(protocol.SendMessageV2, h.EncodeV2(), []byte(body)))
			cancel()
			if err != nil || resp.ResponseCode() != protocol.Success {
				addr = "" // refused (a replica, fenced, too few in sync) or gone: ask the routes again
				time.Sleep(20 * time.Millisecond)
				continue
			}
			s.mu.Lock()
			s.acked[body], s.last, s.lastBy = addr, time.Now(), addr
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *sender) halt() {
	s.halted.Do(func() { close(s.stop) })
	<-s.done
}

// ackedBy waits until a send is acknowledged by a broker other than old and returns when.
func (s *sender) ackedBy(t *testing.T, old string, after time.Time, nodes []*replNode) time.Time {
	t.Helper()
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		last, by := s.last, s.lastBy
		s.mu.Unlock()
		if by != old && last.After(after) {
			return last
		}
		time.Sleep(tick)
	}
	for _, n := range nodes {
		if !n.gone() {
			_ = n.cmd.Process.Signal(syscall.SIGQUIT) // their goroutines, in the logs printed below
		}
	}
	time.Sleep(time.Second)
	t.Fatalf("no send acknowledged by a new master within %s", wait)
	return time.Time{}
}

func (s *sender) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.acked)
}

// bodiesAt pulls both queues of the topic from addr, from the start to the end.
func bodiesAt(t *testing.T, addr string) map[string]int {
	t.Helper()
	return topicAt(t, addr, replTopic)
}

// topicAt pulls both queues of topic from addr, from the start to the end.
func topicAt(t *testing.T, addr, topic string) map[string]int {
	t.Helper()
	c, err := clientcore.New(clientcore.Options{NameServers: []string{"127.0.0.1:1"}})
	require.NoError(t, err)
	defer c.Close(context.Background())
	got := map[string]int{}
	for q := range int32(2) {
		for off := int64(0); ; {
			h := &protocol.PullMessageRequestHeader{ConsumerGroup: protocol.ReaderGroup, Topic: topic, QueueID: q, QueueOffset: off,
				MaxMsgNums: 256, SysFlag: 0, SubVersion: 0, Subscription: "*", ExpressionType: "TAG"}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := c.Invoke(ctx, addr, protocol.NewRequestWith(protocol.PullMessage, h, nil))
			cancel()
			require.NoError(t, err)
			if resp.ResponseCode() != protocol.Success {
				break
			}
			msgs, err := protocol.DecodeStoredAll(resp.Body)
			require.NoError(t, err)
			if len(msgs) == 0 {
				break
			}
			for _, m := range msgs {
				got[string(m.Body)]++
				off = m.QueueOffset + 1
			}
		}
	}
	return got
}

// checkAcked: every acknowledged message is on the master at addr exactly once, and no
// message is there twice.
func (s *sender) checkAcked(t *testing.T, addr string) {
	t.Helper()
	s.mu.Lock()
	acked := make(map[string]string, len(s.acked))
	for k, v := range s.acked {
		acked[k] = v
	}
	s.mu.Unlock()
	// A pass reads the whole topic, which takes seconds once a long run sent a million
	// messages: the deadline allows several, and a failure says what is missing.
	var got map[string]int
	for deadline := time.Now().Add(4 * wait); ; {
		got = bodiesAt(t, addr)
		var missing []string
		for body := range acked {
			if got[body] == 0 {
				missing = append(missing, body)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d acknowledged messages not on the master %s, e.g. %s", len(missing), len(acked), addr, missing[0])
		}
		time.Sleep(100 * time.Millisecond)
	}
	for body, n := range got {
		require.Equal(t, 1, n, "%s stored %d times", body, n)
	}
}

// epochsAgree: the live members' epoch histories are one history (each a prefix of the
// longest), so no epoch had two masters writing from different offsets.
func epochsAgree(t *testing.T, nodes []*replNode) {
	t.Helper()
	type ep struct {
		Epoch int64 `json:"epoch"`
		Start int64 `json:"start"`
	}
	var longest []ep
	hist := map[int][]ep{}
	require.Eventually(t, func() bool {
		for _, n := range nodes {
			b, err := os.ReadFile(filepath.Join(n.dir, "data", "epochs.json"))
			if err != nil {
				return false
			}
			var e []ep
			if json.Unmarshal(b, &e) != nil {
				return false
			}
			hist[n.id] = e
			if len(e) > len(longest) {
				longest = e
			}
		}
		for _, e := range hist {
			if len(e) != len(longest) {
				return false // a member has not caught up with the last epoch yet
			}
		}
		return true
	}, wait, 100*time.Millisecond, "every member recorded the last epoch")
	for id, e := range hist {
		require.Equal(t, longest, e, "member %d's epoch history", id)
	}
}

// Async mode, and what a failover loses there: the master acknowledges sends its replicas
// (paused) never received, then dies; a replica takes over without them. Restarted, the old
// master is told its log diverged, cuts that tail, restarts in place and follows: the
// members end with one history and one log, the lost sends on none of them.
//
// A master streams each append at once, into the paused replicas' socket buffers too, so
// that they would read it once resumed: a long replication.async_pace keeps the sends after
// the first on the master until it dies (the first goes at once, nothing being sent before).
func TestReplicaSetDeposedMasterCutsItsUnreplicatedTail(t *testing.T) {
	nodes := startReplicaSet(t, "async", "--replication-async-pace", "20s")
	allInSync(t, nodes)
	m := nodeAt(nodes, masterAddr(nodes))
	require.NotNil(t, m)
	c, err := clientcore.New(clientcore.Options{NameServers: []string{"127.0.0.1:1"}})
	require.NoError(t, err)
	defer c.Close(context.Background())
	send := func(addr, body string) error {
		h := &protocol.SendMessageRequestHeader{ProducerGroup: "e2e", Topic: replTopic, DefaultTopic: protocol.AutoCreateTopicKey,
			DefaultTopicQueueNums: 2, QueueID: 0, BornTimestamp: time.Now().UnixMilli()}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		resp, err := c.Invoke(ctx, addr, protocol.NewRequest(protocol.SendMessageV2, h.EncodeV2(), []byte(body)))
		if err != nil {
			return err
		}
		if resp.ResponseCode() != protocol.Success {
			return fmt.Errorf("%s: %s", resp.ResponseCode(), resp.Remark)
		}
		return nil
	}
	require.NoError(t, send(m.broker, "replicated"))
	var replicas []*replNode
	for _, n := range nodes {
		if n != m {
			replicas = append(replicas, n)
		}
	}
	require.Eventually(t, func() bool {
		for _, r := range replicas {
			if bodiesAt(t, r.broker)["replicated"] != 1 {
				return false
			}
		}
		return true
	}, wait, tick, "both replicas have the first send")
	for _, r := range replicas {
		require.NoError(t, r.cmd.Process.Signal(syscall.SIGSTOP))
	}
	for i := range 5 {
		require.NoError(t, send(m.broker, fmt.Sprintf("lost-%d", i)), "async mode acknowledges at once")
	}
	m.kill()
	for _, r := range replicas {
		require.NoError(t, r.cmd.Process.Signal(syscall.SIGCONT))
	}
	var cur string
	require.Eventually(t, func() bool {
		cur = masterAddr(nodes)
		return cur != "" && cur != m.broker && send(cur, "after") == nil
	}, wait, 100*time.Millisecond, "a replica took over")

	// It serves, learns its log diverged, stops and runs again in place (new port-0
	// addresses): its addresses are those of its last "flowd serving" line.
	m.daemon = launch(t, "rs-old-master", m.dir, "", m.args...)
	require.Eventually(t, func() bool {
		logs := m.logs.String()
		i := strings.Index(logs, "the commit log was cut back")
		return i >= 0 && servingLine.MatchString(logs[i:])
	}, wait, tick, "the old master cut its diverged tail and serves again")
	all := servingLine.FindAllStringSubmatch(m.logs.String(), -1)
	last := all[len(all)-1]
	m.broker, m.namesrv, m.nats, m.http = last[1], last[2], last[3], last[4]
	require.False(t, m.gone(), "the same process runs on")
	epochsAgree(t, nodes)
	require.Eventually(t, func() bool {
		got := bodiesAt(t, m.broker)
		return got["replicated"] == 1 && got["after"] == 1
	}, wait, 100*time.Millisecond, "the old master follows the new one")
	for _, n := range nodes {
		got := bodiesAt(t, n.broker)
		for i := range 5 {
			require.Zero(t, got[fmt.Sprintf("lost-%d", i)], "rs-%d still has a send async mode lost", n.id)
		}
		require.Len(t, got, 2, "rs-%d", n.id)
	}
}
