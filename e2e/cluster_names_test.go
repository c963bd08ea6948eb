package e2e

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A node started with a broker name live in a cluster joined by routes, with its own
// route listener, would bring a second NATS server of that name (the server name defaults
// to the broker name) and break JetStream: it exits non-zero before it serves, naming the
// name, the route it answers on and the settings, and the cluster keeps serving both
// brokers.
func TestDuplicateBrokerNameWithItsOwnRouteListenerIsRefused(t *testing.T) {
	// Three nodes: the registry's buckets want three replicas' worth of servers.
	all := []string{"broker-1", "broker-2", "broker-3"}
	nodes := startCluster(t, all...)
	a, b, c := nodes[0], nodes[1], nodes[2]
	for _, n := range nodes {
		for _, name := range all {
			want := "type=cluster.broker_joined broker=" + name
			require.Eventually(t, func() bool { return strings.Contains(n.logs.String(), want) }, wait, tick, "%s sees %s join", n.broker, name)
		}
	}
	const topic = "orders"
	a.ctl("topic", "create", topic, "--queues", "1")
	routed(t, b.namesrv, topic, wait, all...)

	// The shared route list, this node's own URL added, as an operator would.
	routes := ""
	for i, arg := range a.args {
		if arg == "--nats-routes" {
			routes = a.args[i+1]
		}
	}
	require.NotEmpty(t, routes)
	own := fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0])
	dup := launch(t, "duplicate broker-2", t.TempDir(), "", "--broker-name", "broker-2",
		"--nats-cluster-listen", own, "--nats-routes", routes+",nats-route://"+own)
	select {
	case <-dup.exited:
	case <-time.After(wait):
		t.Fatalf("a second broker-2 is still running: %s", dup.logs.String())
	}
	var exit *exec.ExitError
	require.True(t, errors.As(dup.err, &exit), "a second broker-2 exits non-zero: %v", dup.err)
	logs := dup.logs.String()
	var bRoute string
	for _, r := range strings.Split(routes, ",") {
		if strings.HasSuffix(r, fmt.Sprintf(":%d", port(t, routeListen(b)))) {
			bRoute = r
		}
	}
	require.NotEmpty(t, bRoute)
	assert.Contains(t, logs, fmt.Sprintf(`NATS server name "broker-2" is already in the cluster at %s`, bRoute))
	assert.Contains(t, logs, "broker_name (--broker-name)")
	assert.Contains(t, logs, "nats.server_name (--nats-server-name")
	assert.NotContains(t, logs, `msg="flowd serving"`)

	// Every broker still serves and is routed by every name service.
	for _, n := range nodes {
		assert.False(t, n.gone(), "%s still runs", n.broker)
		routed(t, n.namesrv, topic, wait, all...)
	}
	sends := produceIDs(t, a.namesrv, topic, bodies("after", 6)...)
	assert.Equal(t, map[int]int{port(t, a.daemon.broker): 2, port(t, b.daemon.broker): 2, port(t, c.daemon.broker): 2},
		perPort(sends), "sends by broker port")
}

// routeListen is the node's route listener, host:port, from its flags.
func routeListen(n *node) string {
	for i, arg := range n.args {
		if arg == "--nats-cluster-listen" {
			return n.args[i+1]
		}
	}
	return ""
}
