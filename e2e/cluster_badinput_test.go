package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
)

// awaitExit waits for d to exit and requires a non-zero exit before it served.
func awaitExit(t *testing.T, d *daemon) string {
	t.Helper()
	select {
	case <-d.exited:
	case <-time.After(wait):
		t.Fatalf("flowd %s is still running: %s", d.name, d.logs.String())
	}
	var exit *exec.ExitError
	require.True(t, errors.As(d.err, &exit), "flowd %s exits non-zero: %v", d.name, d.err)
	logs := d.logs.String()
	assert.NotContains(t, logs, `msg="flowd serving"`)
	return logs
}

// seed starts one node whose route listener is a seed (it routes to itself) and returns it
// with its route URL.
func seed(t *testing.T, name string) (*node, string) {
	t.Helper()
	route := fmt.Sprintf("nats-route://127.0.0.1:%d", freePorts(t, 1)[0])
	n := &node{broker: name, args: []string{"--broker-name", name,
		"--nats-cluster-listen", strings.TrimPrefix(route, "nats-route://"), "--nats-routes", route}}
	n.daemon = startDaemon2(t, n)
	return n, route
}

// startDaemon2 launches the node with its flags and waits until it serves.
func startDaemon2(t *testing.T, n *node) *daemon {
	t.Helper()
	d := launch(t, n.broker, t.TempDir(), "", n.args...)
	d.awaitServing()
	return d
}

// A node of another flowd cluster name routed to a running node is refused before it
// serves, naming both names: with the NATS cluster name left to default (the flowd
// cluster's), by the route check; with one NATS cluster name given to both (so NATS routes
// them together), by the broker registry, whose live brokers are of the other cluster. The
// running node keeps serving, and its routes never list the refused broker.
func TestClusterNamesThatDifferAreRefused(t *testing.T) {
	a, route := seed(t, "broker-1")
	const topic = "orders"
	a.ctl("topic", "create", topic, "--queues", "1")
	routed(t, a.namesrv, topic, wait, "broker-1")

	own := fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0])
	other := launch(t, "other cluster", t.TempDir(), "", "--broker-name", "broker-2", "--cluster", "west",
		"--nats-cluster-listen", own, "--nats-routes", route)
	logs := awaitExit(t, other)
	assert.Contains(t, logs, `leads to NATS cluster "e2e"`)
	assert.Contains(t, logs, `is "west"`)
	assert.Contains(t, logs, control.ErrClusterNameMismatch.Error())

	// One NATS cluster name: the routes form, and the registry refuses the broker. Found at
	// start, the start fails; found by a retry (JetStream was not ready within the start's
	// bound), the node serves alone and never registers.
	own = fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0])
	sameNATS := launch(t, "other cluster, same NATS cluster", t.TempDir(), "", "--broker-name", "broker-3", "--cluster", "west",
		"--nats-cluster-name", cluster, "--nats-cluster-listen", own, "--nats-routes", route)
	const refusal = `broker "broker-1" of cluster "e2e" (node "broker-1" at `
	unquoted := func() string { return strings.ReplaceAll(sameNATS.logs.String(), `\"`, `"`) }
	require.Eventually(t, func() bool { return strings.Contains(unquoted(), refusal) }, wait, tick, "the refusal names the live broker and its cluster")
	logs = unquoted()
	assert.Contains(t, logs, `this broker's cluster is "west": flowd cluster names differ`)
	assert.Contains(t, logs, "the same cluster (--cluster)")
	if strings.Contains(logs, `msg="flowd serving"`) {
		assert.Contains(t, logs, `level=ERROR msg="cluster join refused: still serving alone"`)
		sameNATS.awaitServing()
		var st control.ClusterStatusReply
		require.NoError(t, ctlJSONAt(sameNATS, "west", &st, "cluster", "status"))
		assert.False(t, st.Joined, "a broker of another cluster never joins")
		assert.Equal(t, []string{"broker-3"}, brokerNames(st), "itself alone")
	} else {
		awaitExit(t, sameNATS)
	}
	assert.False(t, a.gone(), "the running node still serves")
	routed(t, a.namesrv, topic, wait, "broker-1")
	assert.NotContains(t, a.logs.String(), "type=cluster.broker_joined broker=broker-3")
}

// ctlJSONAt runs a client command with --json against d's control plane of cluster name.
func ctlJSONAt(d *daemon, name string, out any, args ...string) error {
	raw, err := flowd(append(args, "--nats", d.nats, "--cluster", name, "--json")...)
	if err != nil {
		return err
	}
	return json.Unmarshal([]byte(raw), out)
}

// listenGarbage listens on a free loopback port and answers every connection with a line
// that is not NATS's INFO (or, silent, with nothing), as another service would.
func listenGarbage(t *testing.T, silent bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !silent {
				_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 512)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// A node whose routes lead to ports that do not speak NATS (a service answering garbage, a
// port that says nothing, as a broker's remoting port does) warns naming each route, and
// still starts and serves alone: topics, sends and reads work on its own broker.
func TestRoutesToNonNATSPortsWarnAndTheNodeServesAlone(t *testing.T) {
	garbage, silent := listenGarbage(t, false), listenGarbage(t, true)
	own := fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0])
	n := launch(t, "bad routes", t.TempDir(), "", "--broker-name", "broker-1", "--nats-cluster-listen", own,
		"--nats-routes", "nats-route://"+garbage+",nats-route://"+silent)
	n.awaitServing()
	logs := n.logs.String()
	for _, r := range []string{garbage, silent} {
		assert.Regexp(t, `level=WARN msg="NATS route does not answer as a NATS server.*route=nats-route://`+r, logs)
	}
	const topic = "alone"
	n.ctl("topic", "create", topic, "--queues", "2")
	routed(t, n.namesrv, topic, wait, "broker-1")
	n.produce(topic, nil, "one", "two")
	out, err := flowd("consume", topic, "--namesrv", n.namesrv, "--from", "first", "-n", "2")
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"one", "two"}, strings.Fields(out))
	n.terminate()
}

// startPlainNATS runs a NATS server without JetStream on a free loopback port.
func startPlainNATS(t *testing.T) string {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true, NoLog: true})
	require.NoError(t, err)
	go s.Start()
	t.Cleanup(s.Shutdown)
	require.True(t, s.ReadyForConnections(wait), "NATS server ready")
	return s.ClientURL()
}

// A node pointed (nats.urls) at a NATS server without JetStream says so, naming the server
// and what to enable, and serves alone: its broker, name service and control plane work.
func TestJetStreamUnavailableAtStartIsNamedAndTheNodeServesAlone(t *testing.T) {
	url := startPlainNATS(t)
	n := launch(t, "no JetStream", t.TempDir(), "", "--broker-name", "broker-1", "--nats-url", url)
	n.awaitServing()
	require.Eventually(t, func() bool { return strings.Contains(n.logs.String(), "JetStream is not enabled") }, wait, tick,
		"the node names what is wrong")
	assert.Regexp(t, `level=WARN msg="cluster not ready: JetStream is not enabled on the NATS server .*`+strings.TrimPrefix(url, "nats://"), n.logs.String())
	assert.Contains(t, n.logs.String(), "serving alone")

	const topic = "alone"
	n.ctl("topic", "create", topic, "--queues", "1")
	routed(t, n.namesrv, topic, wait, "broker-1")
	n.produce(topic, nil, "one")
	out, err := flowd("consume", topic, "--namesrv", n.namesrv, "--from", "first", "-n", "1")
	require.NoError(t, err)
	assert.Equal(t, "one", strings.TrimSpace(out))
	var st control.ClusterStatusReply
	require.NoError(t, n.ctlJSON(&st, "cluster", "status"))
	assert.False(t, st.Joined, "not joined while JetStream is away")
	n.terminate()
}
