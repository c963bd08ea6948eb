package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/protocol"
)

// benchClusterName is the cluster name of the bench's nodes: the <cluster> token of their
// NATS subjects.
const benchClusterName = "flowd-bench"

// benchNodeWait bounds every wait for a node: to serve, to join, to be routed.
const benchNodeWait = 60 * time.Second

// lockedBuffer is a child's output, written by its process and read by the bench.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// benchNode is one `flowd serve` child process of a cluster run, and what starts it again.
type benchNode struct {
	name   string // its broker name
	bin    string
	args   []string
	cmd    *exec.Cmd
	logs   *lockedBuffer
	exited chan struct{}

	broker, namesrv, nats string
	http                  string // its HTTP listener, when it has one (a replica-set member)
}

// benchServing is the child's "flowd serving" log line with the addresses it bound.
var benchServing = regexp.MustCompile(`msg="flowd serving".* broker=(\S+) namesrv=(\S+) nats=(\S+)`)

// benchPorts returns n distinct free 127.0.0.1 ports for the route listeners, which every node
// must know before any starts. They are drawn below the kernel's ephemeral range, so that no
// port-0 listener or outgoing connection takes one before its node binds it.
func benchPorts(n int) ([]int, error) {
	low := 32768
	if raw, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(raw)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 11000 {
				low = v
			}
		}
	}
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			return nil, fmt.Errorf("bench: no %d free ports below %d", n, low)
		}
		p := 10000 + rand.IntN(low-10000)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil || slices.Contains(ports, p) {
			continue
		}
		ln.Close()
		ports = append(ports, p)
	}
	return ports, nil
}

// startBenchCluster starts n nodes under dir/<prefix>-i, joined by NATS routes when n > 1,
// each with the flags extra besides, and waits until each serves and every one lists all n
// brokers as joined.
func startBenchCluster(ctx context.Context, c benchConfig, prefix string, n int, extra ...string) ([]*benchNode, error) {
	var nodes []*benchNode
	stopAll := func() {
		for _, nd := range nodes {
			nd.kill()
		}
	}
	var routes []string
	var ports []int
	if n > 1 {
		var err error
		if ports, err = benchPorts(n); err != nil {
			return nil, err
		}
		for _, p := range ports {
			routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
		}
	}
	for i := range n {
		name := fmt.Sprintf("%s-%d", prefix, i+1)
		nd := &benchNode{name: name, bin: c.flowdBin, args: []string{"serve",
			"--data-dir", filepath.Join(c.dataDir, name), "--cluster", benchClusterName, "--broker-name", name,
			"--listen", "127.0.0.1:0", "--namesrv-listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0",
			"--http-listen", "off", "--grpc-listen", "off"}}
		nd.args = append(nd.args, extra...)
		if n > 1 {
			nd.args = append(nd.args, "--nats-cluster-listen", fmt.Sprintf("127.0.0.1:%d", ports[i]), "--nats-routes", strings.Join(routes, ","))
		}
		if err := nd.start(); err != nil {
			stopAll()
			return nil, err
		}
		nodes = append(nodes, nd)
	}
	for _, nd := range nodes {
		if err := nd.awaitServing(ctx); err != nil {
			stopAll()
			return nil, err
		}
	}
	for _, nd := range nodes {
		if err := nd.awaitJoined(ctx, n); err != nil {
			stopAll()
			return nil, err
		}
	}
	return nodes, nil
}

// start starts the child process, without waiting for it to serve.
func (nd *benchNode) start() error {
	nd.logs, nd.exited = &lockedBuffer{}, make(chan struct{})
	nd.cmd = exec.Command(nd.bin, nd.args...)
	nd.cmd.Stdout, nd.cmd.Stderr = nd.logs, nd.logs
	if err := nd.cmd.Start(); err != nil {
		return fmt.Errorf("bench: start node %s: %w", nd.name, err)
	}
	go func() {
		_ = nd.cmd.Wait()
		close(nd.exited)
	}()
	return nil
}

// awaitServing waits until the child logs the addresses it bound.
func (nd *benchNode) awaitServing(ctx context.Context) error {
	m, err := nd.awaitLine(ctx, benchServing)
	if err != nil {
		return err
	}
	nd.broker, nd.namesrv, nd.nats = m[1], m[2], m[3]
	return nil
}

// awaitLine waits until the child's output matches re, and returns the match.
func (nd *benchNode) awaitLine(ctx context.Context, re *regexp.Regexp) ([]string, error) {
	var m []string
	err := pollFor(ctx, benchNodeWait, 10*time.Millisecond, func() (bool, error) {
		select {
		case <-nd.exited:
			return false, fmt.Errorf("bench: node %s exited: %s", nd.name, nd.logs.String())
		default:
		}
		m = re.FindStringSubmatch(nd.logs.String())
		return m != nil, nil
	}, "node "+nd.name+" serves")
	return m, err
}

// awaitJoined waits until the node's cluster.status lists n brokers, itself joined.
func (nd *benchNode) awaitJoined(ctx context.Context, n int) error {
	return pollFor(ctx, benchNodeWait, 20*time.Millisecond, func() (bool, error) {
		var st control.ClusterStatusReply
		if _, err := nd.control().request(ctx, "cluster.status", nil, &st); err != nil {
			return false, nil
		}
		// A single node is not clustered: it answers with itself as the one broker.
		return (st.Joined || n == 1 && !st.Clustered) && len(st.Brokers) == n, nil
	}, fmt.Sprintf("node %s sees %d brokers joined", nd.name, n))
}

// control is a client of the node's control plane.
func (nd *benchNode) control() *clientOpts {
	return &clientOpts{url: nd.nats, cluster: benchClusterName, timeout: 10 * time.Second}
}

// createTopic creates topic with queues on every broker through the node's control plane.
func (nd *benchNode) createTopic(ctx context.Context, topic string, queues int) error {
	var r control.TopicReply
	_, err := nd.control().request(ctx, "topic.create", map[string]any{"topic": topic, "queues": queues}, &r)
	return err
}

// kill ends the child with SIGKILL, as a crash would, and reaps it.
func (nd *benchNode) kill() {
	if nd.cmd == nil || nd.cmd.Process == nil {
		return
	}
	select {
	case <-nd.exited:
		return
	default:
	}
	_ = nd.cmd.Process.Kill()
	<-nd.exited
}

func stopBenchNodes(nodes []*benchNode) {
	for _, nd := range nodes {
		nd.kill()
	}
}

// pollFor calls check every period until it reports done or an error, within limit.
func pollFor(ctx context.Context, limit, period time.Duration, check func() (bool, error), what string) error {
	deadline := time.Now().Add(limit)
	for {
		ok, err := check()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: %s: not within %v", what, limit)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("bench: %s: %w", what, ctx.Err())
		case <-time.After(period):
		}
	}
}

// routeBrokerNames asks a name service for topic's route (GET_ROUTEINFO_BY_TOPIC) and returns
// the names of the brokers with writable queues in it, sorted; a topic without a route has
// none.
func routeBrokerNames(ctx context.Context, cl *clientcore.Client, namesrv, topic string) ([]string, error) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := cl.Invoke(rctx, namesrv, protocol.NewRequestWith(protocol.GetRouteInfoByTopic, &protocol.GetRouteInfoRequestHeader{Topic: topic}, nil))
	if err != nil {
		return nil, fmt.Errorf("bench: route of %q from %s: %w", topic, namesrv, err)
	}
	if resp.ResponseCode() == protocol.TopicNotExist {
		return nil, nil
	}
	if resp.ResponseCode() != protocol.Success {
		return nil, fmt.Errorf("bench: route of %q from %s: %w", topic, namesrv, clientcore.NewBrokerError(resp))
	}
	data, err := protocol.DecodeTopicRouteData(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("bench: route of %q from %s: %w", topic, namesrv, err)
	}
	var out []string
	for _, q := range data.QueueDatas {
		if q.WriteQueueNums > 0 && !slices.Contains(out, q.BrokerName) {
			out = append(out, q.BrokerName)
		}
	}
	slices.Sort(out)
	return out, nil
}

// newRouteClient is a client that queries name services directly.
func newRouteClient(namesrv string) (*clientcore.Client, error) {
	cl, err := clientcore.New(clientcore.Options{NameServers: []string{namesrv}, Logger: discardLogger()})
	if err != nil {
		return nil, fmt.Errorf("bench: route client: %w", err)
	}
	return cl, nil
}

// discardLogger discards: the bench's clients are not what it reports.
func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
