package control

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openRefused runs Open, which must fail within a generous bound (the route check reads
// each route for ProbeTimeout at most), and returns its error.
func openRefused(t *testing.T, cfg NATSConfig) error {
	t.Helper()
	type result struct {
		n   *NATS
		err error
	}
	opened := make(chan result, 1)
	go func() {
		n, err := Open(context.Background(), cfg)
		opened <- result{n, err}
	}()
	select {
	case r := <-opened:
		if r.err == nil {
			closeNode(t, r.n)
		}
		require.Error(t, r.err, "Open of %s started the server", cfg.ServerName)
		return r.err
	case <-time.After(60 * time.Second):
		t.Fatalf("Open of %s did not return", cfg.ServerName)
		return nil
	}
}

// A fourth server named like one of a formed three-server cluster would break JetStream
// (NATS drops its routes as a duplicate name): Open refuses it before the server starts,
// naming the name, the route it answers on and the settings. The route list is the one
// every node shares, this node's own (not yet listening) URL included.
func TestServerNameAlreadyInTheClusterFailsOpen(t *testing.T) {
	addrs := []string{freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)}
	var routes []string
	for _, a := range addrs {
		routes = append(routes, "nats-route://"+a)
	}
	var nodes []*NATS
	for i, a := range addrs[:3] {
		nodes = append(nodes, openNode(t, clusterNode(t, fmt.Sprintf("node-%d", i+1), "flowd-test", a, routes...)))
	}
	require.Eventually(t, func() bool {
		for _, n := range nodes {
			if st, err := n.ClusterState(); err != nil || len(st.Routes) != 2 {
				return false
			}
		}
		return true
	}, 60*time.Second, 50*time.Millisecond, "the cluster did not form")

	err := openRefused(t, clusterNode(t, "node-2", "flowd-test", addrs[3], routes...))
	require.ErrorIs(t, err, ErrDuplicateServerName)
	assert.Contains(t, err.Error(), `NATS server name "node-2" is already in the cluster at nats-route://`+addrs[1]+":")
	assert.Contains(t, err.Error(), "broker_name (--broker-name)")
	assert.Contains(t, err.Error(), "nats.server_name (--nats-server-name")
	assert.NotContains(t, err.Error(), addrs[0])
	for _, n := range nodes {
		st, err := n.ClusterState()
		require.NoError(t, err)
		assert.Len(t, st.Routes, 2, "%s keeps its routes", st.ServerName)
	}
}

// Two routes answering with this server's name are both named in one error; two servers
// other than this one sharing a name are refused too, since the cluster could not hold
// both; one server reached by two URLs is one server, not a duplicate.
func TestRoutesAnsweringWithOneServerNameFailOpen(t *testing.T) {
	a, b := freeAddr(t), freeAddr(t)
	openNode(t, clusterNode(t, "twin", "flowd-test", a)) // two seeds, each alone
	openNode(t, clusterNode(t, "twin", "flowd-test", b))

	err := openRefused(t, clusterNode(t, "twin", "flowd-test", freeAddr(t), "nats-route://"+a, "nats-route://"+b))
	require.ErrorIs(t, err, ErrDuplicateServerName)
	assert.Contains(t, err.Error(), fmt.Sprintf(`NATS server name "twin" is already in the cluster at nats-route://%s, nats-route://%s:`, a, b))

	err = openRefused(t, clusterNode(t, "third", "flowd-test", freeAddr(t), "nats-route://"+a, "nats-route://"+b))
	require.ErrorIs(t, err, ErrDuplicateServerName)
	assert.Contains(t, err.Error(), fmt.Sprintf(`the NATS servers at nats-route://%s, nats-route://%s of cluster "flowd-test" all have the name "twin"`, a, b))

	_, port, _ := strings.Cut(a, ":")
	n := openNode(t, clusterNode(t, "third", "flowd-test", freeAddr(t), "nats-route://"+a, "nats-route://localhost:"+port))
	assert.Equal(t, "third", n.Server().Name())
}

// The route list every node shares holds this node's own URL; its listener is not up at
// the check, so a NATS server answering there is another process on the port: Open says
// so, naming the route, that server and the setting, rather than a bare "address in use".
func TestNATSServerOnOwnRouteURLFailsOpen(t *testing.T) {
	squat := freeAddr(t)
	openNode(t, clusterNode(t, "squatter", "other", squat))
	other := freeAddr(t)
	err := openRefused(t, clusterNode(t, "node-1", "flowd-test", squat, "nats-route://"+squat, "nats-route://"+other))
	require.ErrorIs(t, err, ErrRouteListenerInUse)
	assert.NotErrorIs(t, err, ErrClusterNameMismatch)
	assert.Contains(t, err.Error(), fmt.Sprintf(`route nats-route://%s is this server's own route listener (nats.cluster.listen, --nats-cluster-listen)`, squat))
	assert.Contains(t, err.Error(), `NATS server "squatter" of cluster "other" already answers there`)
}
