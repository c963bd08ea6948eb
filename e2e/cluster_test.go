package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/protocol"
)

// brokerTTL is the registry's default TTL (cluster.Options.TTL): a node that stops
// heartbeating leaves every route within it.
const brokerTTL = 6 * time.Second

// freePorts returns n distinct free 127.0.0.1 ports for the route listeners, which every
// node must know before any starts, so they cannot be port 0. They are drawn below the
// kernel's ephemeral range: a port from it could be taken, before the node binds it, by
// another listener on port 0 or by an outgoing connection.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	low := 32768 // Linux's default ephemeral range starts here
	if raw, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(raw)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 11000 {
				low = v
			}
		}
	}
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		require.Less(t, tries, 1000, "free ports below %d", low)
		p := 10000 + rand.IntN(low-10000)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil || slices.Contains(ports, p) {
			continue
		}
		ln.Close()
		ports = append(ports, p)
	}
	return ports
}

// node is one daemon of a three-node cluster and what it needs to start again.
type node struct {
	*daemon
	broker string // its broker name
	args   []string
}

// startCluster launches len(names) nodes joined by routes (the same list on every node),
// all at once as an operator would, and waits until each serves.
func startCluster(t *testing.T, names ...string) []*node {
	t.Helper()
	return startClusterWith(t, nil, names...)
}

// startClusterWith is startCluster with the flags extra[name] added to that node's.
func startClusterWith(t *testing.T, extra map[string][]string, names ...string) []*node {
	t.Helper()
	ports := freePorts(t, len(names))
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	nodes := make([]*node, len(names))
	for i, name := range names {
		n := &node{broker: name, args: []string{
			"--broker-name", name,
			"--nats-cluster-listen", fmt.Sprintf("127.0.0.1:%d", ports[i]),
			"--nats-routes", strings.Join(routes, ","),
		}}
		n.args = append(n.args, extra[name]...)
		n.daemon = launch(t, name, t.TempDir(), "", n.args...)
		nodes[i] = n
	}
	for _, n := range nodes {
		n.awaitServing()
	}
	return nodes
}

// restart starts the node again on its data directory, route listener and broker name.
func (n *node) restart(t *testing.T) {
	t.Helper()
	n.daemon = launch(t, n.broker+" restarted", n.dir, "", n.args...)
	n.awaitServing()
}

// routeBrokers asks the name service at namesrv for topic's route (GET_ROUTEINFO_BY_TOPIC)
// and returns the broker address of each broker with writable queues, by broker name.
func routeBrokers(namesrv, topic string) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := clientcore.New(clientcore.Options{NameServers: []string{namesrv}})
	if err != nil {
		return nil, err
	}
	defer c.Close(context.Background())
	resp, err := c.Invoke(ctx, namesrv, protocol.NewRequestWith(protocol.GetRouteInfoByTopic, &protocol.GetRouteInfoRequestHeader{Topic: topic}, nil))
	if err != nil {
		return nil, fmt.Errorf("route of %q from %s: %w", topic, namesrv, err)
	}
	if resp.ResponseCode() != protocol.Success {
		return nil, fmt.Errorf("route of %q from %s: %w", topic, namesrv, clientcore.NewBrokerError(resp))
	}
	data, err := protocol.DecodeTopicRouteData(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("route of %q from %s: %w", topic, namesrv, err)
	}
	addrs := map[string]string{}
	for _, bd := range data.BrokerDatas {
		addrs[bd.BrokerName] = bd.BrokerAddrs[protocol.MasterID]
	}
	out := map[string]string{}
	for _, q := range data.QueueDatas {
		if q.WriteQueueNums > 0 {
			out[q.BrokerName] = addrs[q.BrokerName]
		}
	}
	return out, nil
}

// routed polls namesrv until topic's route lists exactly the brokers want (by name) and
// returns how long that took.
func routed(t *testing.T, namesrv, topic string, within time.Duration, want ...string) time.Duration {
	t.Helper()
	slices.Sort(want)
	start := time.Now()
	var got []string
	var err error
	for {
		var r map[string]string
		r, err = routeBrokers(namesrv, topic)
		got = got[:0]
		for name := range r {
			got = append(got, name)
		}
		slices.Sort(got)
		if err == nil && slices.Equal(got, want) {
			break
		}
		if time.Since(start) > within {
			t.Fatalf("the route of %q from %s does not list %v within %v: last %v, %v", topic, namesrv, want, within, got, err)
		}
		time.Sleep(50 * time.Millisecond) // the poll's period, not an assertion
	}
	return time.Since(start)
}

// sent is one acknowledged send: its body and the broker port its offset message id names.
type sent struct {
	body string
	port int
}

// produceIDs sends each body with `flowd produce` through namesrv and returns, for each, the
// port of the broker that stored it, decoded from the offset message id it printed.
func produceIDs(t *testing.T, namesrv, topic string, bodies ...string) []sent {
	t.Helper()
	out, err := flowd(append([]string{"produce", topic, "--namesrv", namesrv}, bodies...)...)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, len(bodies), "one line of ids per message: %s", out)
	var res []sent
	for i, l := range lines {
		f := strings.Fields(l)
		require.Len(t, f, 2, "msgId and offsetMsgId: %q", l)
		host, _, err := protocol.ParseOffsetMsgID(f[1])
		require.NoError(t, err)
		res = append(res, sent{body: bodies[i], port: int(host.Port())})
	}
	return res
}

// port is the port of a host:port address.
func port(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	n, err := strconv.Atoi(p)
	require.NoError(t, err)
	return n
}

// perPort counts the sends by broker port.
func perPort(s []sent) map[int]int {
	out := map[int]int{}
	for _, m := range s {
		out[m.port]++
	}
	return out
}

func bodies(prefix string, n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("%s-%02d", prefix, i))
	}
	return out
}

// Three `flowd serve` nodes on loopback joined by NATS routes form one cluster: a topic
// created through one node's control plane is routed by every node's name service to the
// queues of all three brokers, and the producer spreads its sends over them; a node killed
// with SIGKILL leaves the routes within the registry's TTL while the others keep taking
// sends, each readable, and it rejoins on restart; a node with a broker name live elsewhere
// refuses to start, naming it.
func TestThreeNodesServeOneCluster(t *testing.T) {
	nodes := startCluster(t, "broker-1", "broker-2", "broker-3")
	a, b, c := nodes[0], nodes[1], nodes[2]
	all := []string{"broker-1", "broker-2", "broker-3"}
	for _, n := range nodes {
		for _, name := range all {
			want := "type=cluster.broker_joined broker=" + name
			require.Eventually(t, func() bool { return strings.Contains(n.logs.String(), want) }, wait, tick, "%s sees %s join", n.broker, name)
		}
	}

	// (a) A topic created on A is routable from C's name service, on all three brokers.
	const topic = "orders"
	created := time.Now()
	a.ctl("topic", "create", topic, "--queues", "2")
	routed(t, c.namesrv, topic, wait, all...)
	t.Logf("topic created on %s routed by %s to every broker after %v", a.broker, c.broker, time.Since(created).Round(time.Millisecond))

	// (b) The producer pointed at one node spreads the sends over all three brokers: two
	// queues each, round robin.
	first := produceIDs(t, b.namesrv, topic, bodies("first", 6)...)
	assert.Equal(t, map[int]int{port(t, a.daemon.broker): 2, port(t, b.daemon.broker): 2, port(t, c.daemon.broker): 2}, perPort(first), "sends by broker port")

	// (c) B crashes: every other node's routes drop it within the TTL (plus the time the
	// registry takes to tell, under load), and sends go on to A and C.
	b.kill()
	killed := time.Now()
	for _, n := range []*node{a, c} {
		routed(t, n.namesrv, topic, brokerTTL+wait, "broker-1", "broker-3")
	}
	gone := time.Since(killed)
	t.Logf("killed %s left every route after %v (TTL %v)", b.broker, gone.Round(time.Millisecond), brokerTTL)
	assert.Less(t, gone, brokerTTL+wait)
	assert.Contains(t, a.logs.String(), "type=cluster.broker_left broker=broker-2 reason=expired")

	after := produceIDs(t, a.namesrv, topic, bodies("after", 8)...)
	assert.Equal(t, map[int]int{port(t, a.daemon.broker): 4, port(t, c.daemon.broker): 4}, perPort(after), "sends by broker port, B gone")

	// Every acknowledged send stored on A or C reads back from the cluster as it is now.
	var want []string
	for _, m := range append(first, after...) {
		if m.port != port(t, b.daemon.broker) {
			want = append(want, m.body)
		}
	}
	out, err := flowd("consume", topic, "--namesrv", c.namesrv, "--from", "first", "-n", strconv.Itoa(len(want)))
	require.NoError(t, err)
	assert.ElementsMatch(t, want, strings.Fields(out), "what A and C acknowledged")

	// B restarts on its data directory and is routed again; its messages read again.
	oldB := port(t, b.daemon.broker)
	b.restart(t)
	for _, n := range nodes {
		routed(t, n.namesrv, topic, wait, all...)
	}
	out, err = flowd("consume", topic, "--namesrv", a.namesrv, "--from", "first", "-n", strconv.Itoa(len(first)+len(after)))
	require.NoError(t, err)
	assert.ElementsMatch(t, append(bodies("first", 6), bodies("after", 8)...), strings.Fields(out), "every acknowledged send, B's included")
	t.Logf("%s rejoined (broker port %d, was %d)", b.broker, port(t, b.daemon.broker), oldB)

	// (d) A node named like a live broker does not start: its error names the broker.
	dup := launch(t, "duplicate broker-3", t.TempDir(), "", "--broker-name", "broker-3", "--nats-url", a.nats)
	select {
	case <-dup.exited:
	case <-time.After(wait):
		t.Fatalf("a second broker-3 is still running: %s", dup.logs.String())
	}
	var exit *exec.ExitError
	require.True(t, errors.As(dup.err, &exit), "a second broker-3 exits non-zero: %v", dup.err)
	assert.Contains(t, dup.logs.String(), `"broker-3"`)
	assert.Contains(t, dup.logs.String(), "already live")
	assert.NotContains(t, dup.logs.String(), `msg="flowd serving"`)
	routed(t, a.namesrv, topic, wait, all...)
}
