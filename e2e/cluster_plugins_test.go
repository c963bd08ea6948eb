package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/protocol"
)

const propFilter = "../examples/wasm/c-propfilter/propfilter.wasm"

// produceWith sends each body with `flowd produce` and the extra flags through namesrv and
// returns, for each, the port of the broker that stored it.
func produceWith(t *testing.T, namesrv, topic string, flags []string, bodies ...string) []sent {
	t.Helper()
	args := append(append([]string{"produce", topic, "--namesrv", namesrv}, flags...), bodies...)
	out, err := flowd(args...)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, len(bodies), "one line of ids per message: %s", out)
	res := make([]sent, len(bodies))
	for i, l := range lines {
		f := strings.Fields(l)
		require.Len(t, f, 2, "msgId and offsetMsgId: %q", l)
		host, _, err := protocol.ParseOffsetMsgID(f[1])
		require.NoError(t, err)
		res[i] = sent{body: bodies[i], port: int(host.Port())}
	}
	return res
}

// activeOnEvery waits until n's plugin.list shows name@version active on every node of
// nodes, as the nodes reported it.
func (n *node) activeOnEvery(t *testing.T, name, version string, nodes ...string) {
	t.Helper()
	var last []control.PluginNode
	require.Eventually(t, func() bool {
		var r control.PluginListReply
		if err := n.ctlJSON(&r, "plugin", "list", name); err != nil {
			return false
		}
		i := slices.IndexFunc(r.Plugins, func(p control.PluginView) bool { return p.Manifest != nil && p.Manifest.Version == version })
		if i < 0 {
			return false
		}
		last = r.Plugins[i].Nodes
		active := map[string]bool{}
		for _, pn := range last {
			active[pn.Node] = pn.Active && pn.Error == ""
		}
		for _, want := range nodes {
			if !active[want] {
				return false
			}
		}
		return true
	}, wait, tick, "%s reports %s@%s active on %v: last %+v", n.broker, name, version, nodes, last)
}

// consumeWasm reads count messages of topic through namesrv with the Wasm filter name, from
// the first offset, and returns their bodies.
func consumeWasm(t *testing.T, namesrv, topic, name string, count string) []string {
	t.Helper()
	out, err := flowd("consume", topic, "--namesrv", namesrv, "--wasm", name, "--from", "first", "-n", count)
	require.NoError(t, err)
	return strings.Fields(out)
}

// A Wasm filter deployed once, on node A of three `flowd serve` nodes, is fetched and
// activated by every node: pulls through B and C, which read the queues of all three
// brokers, get exactly the messages it keeps. A version activated on C reaches every node
// alike; a node joining later runs it from its first pull; and a crash and restart of all
// three nodes keeps it active.
func TestClusterPluginDeployedOnceFiltersEveryNode(t *testing.T) {
	nodes := startCluster(t, "broker-1", "broker-2", "broker-3")
	a, b, c := nodes[0], nodes[1], nodes[2]
	all := []string{"broker-1", "broker-2", "broker-3"}
	const topic = "orders"
	a.ctl("topic", "create", topic, "--queues", "2")
	for _, n := range nodes {
		routed(t, n.namesrv, topic, wait, all...)
	}

	eu := writeJSON(t, "region-eu.json", map[string]any{"name": "region", "kind": "filter", "version": "1.0.0", "abi": 1,
		"parameters": map[string]string{"property": "region", "value": "eu"}})
	// One node of the cluster answers the command (the control service's queue group): it
	// deploys and activates, the two others follow.
	var deployed control.PluginReply
	require.NoError(t, a.ctlJSON(&deployed, "plugin", "deploy", propFilter, eu, "--activate"))
	require.True(t, deployed.Plugin.Active)
	for _, n := range nodes {
		n.activeOnEvery(t, "region", "1.0.0", all...)
	}
	out := b.ctl("plugin", "list")
	assert.Regexp(t, `region\s+1\.0\.0\s+filter\s+true\s+broker-1=active,broker-2=active,broker-3=active`, out)
	for _, n := range nodes {
		if n.broker != deployed.Node {
			assert.Contains(t, n.logs.String(), "cluster plugins: activated the cluster's version", "%s followed %s's activation", n.broker, deployed.Node)
		}
	}

	// Six messages of each region, round robin over the six queues: two of each on every
	// broker.
	euSent := produceWith(t, b.namesrv, topic, []string{"-p", "region=eu"}, bodies("eu", 6)...)
	usSent := produceWith(t, b.namesrv, topic, []string{"-p", "region=us"}, bodies("us", 6)...)
	brokers := map[int]int{port(t, a.daemon.broker): 2, port(t, b.daemon.broker): 2, port(t, c.daemon.broker): 2}
	require.Equal(t, brokers, perPort(euSent), "eu messages by broker port")
	require.Equal(t, brokers, perPort(usSent), "us messages by broker port")

	for _, n := range []*node{b, c} {
		assert.ElementsMatch(t, bodies("eu", 6), consumeWasm(t, n.namesrv, topic, "region", "6"),
			"through %s every broker's pulls keep the eu messages only", n.broker)
	}

	// A new version activated on C: every node swaps it in.
	us := writeJSON(t, "region-us.json", map[string]any{"name": "region", "kind": "filter", "version": "2.0.0", "abi": 1,
		"parameters": map[string]string{"property": "region", "value": "us"}})
	c.ctl("plugin", "deploy", propFilter, us, "--activate")
	for _, n := range nodes {
		n.activeOnEvery(t, "region", "2.0.0", all...)
	}
	assert.ElementsMatch(t, bodies("us", 6), consumeWasm(t, a.namesrv, topic, "region", "6"), "through A, after C's activation")

	// A fourth node joins later, routed to the three: it has the plugin's active version
	// compiled before its broker serves, and its pulls run it.
	late := lateNode(t, a, "broker-4")
	logs := late.logs.String()
	caught, serving := strings.Index(logs, "cluster plugins: activated the cluster's version"), strings.Index(logs, `msg="flowd serving"`)
	require.True(t, caught >= 0 && caught < serving, "broker-4 caught up before it served:\n%s", logs)
	routed(t, late.namesrv, topic, wait, append(all, "broker-4")...)
	assert.ElementsMatch(t, bodies("us", 6), consumeWasm(t, late.namesrv, topic, "region", "6"), "through the late node, whose broker runs the filter too")
	late.kill()

	// All three crash (SIGKILL: a clean stop of the last node waits on a JetStream that lost
	// its quorum) and start again, together: the plugin and its active version stay.
	for _, n := range nodes {
		n.kill()
	}
	for _, n := range nodes {
		n.daemon = launch(t, n.broker+" restarted", n.dir, "", n.args...)
	}
	for _, n := range nodes {
		n.awaitServing()
	}
	for _, n := range nodes {
		routed(t, n.namesrv, topic, wait, all...)
	}
	b.activeOnEvery(t, "region", "2.0.0", all...)
	var list control.PluginListReply
	require.NoError(t, c.ctlJSON(&list, "plugin", "list", "region"))
	require.Len(t, list.Plugins, 2, "both versions kept")
	assert.ElementsMatch(t, bodies("us", 6), consumeWasm(t, b.namesrv, topic, "region", "6"), "through B, after the restart")
}

// lateNode starts a node named name whose embedded NATS server routes to the cluster of
// peer (and to itself), and waits until it serves.
func lateNode(t *testing.T, peer *node, name string) *daemon {
	t.Helper()
	i := slices.Index(peer.args, "--nats-routes")
	require.GreaterOrEqual(t, i, 0)
	p := freePorts(t, 1)[0]
	d := launch(t, name, t.TempDir(), "", "--broker-name", name,
		"--nats-cluster-listen", fmt.Sprintf("127.0.0.1:%d", p),
		"--nats-routes", peer.args[i+1]+fmt.Sprintf(",nats-route://127.0.0.1:%d", p))
	d.awaitServing()
	return d
}
