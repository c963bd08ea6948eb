package control

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// syncLog is a log that tests read while servers write to it.
type syncLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *syncLog) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// clusterNode is the configuration of one embedded server of a test cluster.
func clusterNode(t testing.TB, name, cluster, listen string, routes ...string) NATSConfig {
	return NATSConfig{
		Listen: "127.0.0.1:0", StoreDir: t.TempDir(), ServerName: name, Logger: discardLogger(),
		Cluster: NATSClusterConfig{Name: cluster, Listen: listen, Routes: routes},
	}
}

func openNode(t testing.TB, cfg NATSConfig) *NATS {
	t.Helper()
	n, err := Open(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { closeNode(t, n) })
	return n
}

func closeNode(t testing.TB, n *NATS) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if !n.Conn().IsClosed() {
		require.NoError(t, n.Close(ctx))
	}
}

// Three embedded servers given each other's routes form one NATS cluster: every server
// routes to the two others and JetStream elects a meta leader. An R3 KV bucket written on
// one node is read on another, and stays writable with two of the three servers, the
// meta leader gone.
func TestThreeEmbeddedServersFormAJetStreamCluster(t *testing.T) {
	addrs := []string{freeAddr(t), freeAddr(t), freeAddr(t)}
	var routes []string
	for _, a := range addrs {
		routes = append(routes, "nats-route://"+a)
	}
	nodes := map[string]*NATS{}
	for i, a := range addrs {
		name := fmt.Sprintf("node-%d", i+1)
		nodes[name] = openNode(t, clusterNode(t, name, "flowd-test", a, routes...))
	}
	// formed: every live server routes to the others and names the same meta leader, not
	// the one that went (a follower names the old leader until it misses it).
	formed := func(live int, gone string) func() bool {
		return func() bool {
			var leader string
			for _, n := range nodes {
				if n.Conn().IsClosed() {
					continue
				}
				st, err := n.ClusterState()
				if err != nil || len(st.Routes) != live-1 || st.MetaLeader == "" || st.MetaLeader == gone || len(st.Peers) != 3 {
					return false
				}
				if leader != "" && st.MetaLeader != leader {
					return false
				}
				leader = st.MetaLeader
			}
			return true
		}
	}
	require.Eventually(t, formed(3, ""), 60*time.Second, 50*time.Millisecond, "the cluster did not form")
	st, err := nodes["node-1"].ClusterState()
	require.NoError(t, err)
	assert.True(t, st.Clustered)
	assert.Equal(t, "flowd-test", st.Name)
	assert.Equal(t, "node-1", st.ServerName)
	assert.Equal(t, "nats-route://"+addrs[0], st.RouteURL)
	assert.Equal(t, []string{"node-2", "node-3"}, st.Routes)
	assert.Equal(t, []string{"node-1", "node-2", "node-3"}, []string{st.Peers[0].Name, st.Peers[1].Name, st.Peers[2].Name})

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	kv := func(n *NATS) jetstream.KeyValue {
		js, err := jetstream.New(n.Conn())
		require.NoError(t, err)
		var b jetstream.KeyValue
		require.Eventually(t, func() bool {
			b, err = js.KeyValue(ctx, "brokers")
			return err == nil
		}, 60*time.Second, 50*time.Millisecond, "the bucket is not found")
		return b
	}
	js, err := jetstream.New(nodes["node-1"].Conn())
	require.NoError(t, err)
	// A meta leader places an R3 stream only once it has heard from both other peers: right
	// after the election it may still answer "no suitable peers for placement".
	require.Eventually(t, func() bool {
		_, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "brokers", Replicas: 3})
		return err == nil
	}, 60*time.Second, 100*time.Millisecond, "the R3 bucket is not placed")
	require.NoError(t, err)
	_, err = kv(nodes["node-1"]).Put(ctx, "broker-a", []byte("10.0.0.1:10911"))
	require.NoError(t, err)
	read := func(n *NATS, key, want string) {
		b := kv(n)
		require.Eventually(t, func() bool {
			e, err := b.Get(ctx, key)
			return err == nil && string(e.Value()) == want
		}, 60*time.Second, 50*time.Millisecond, "%s did not read %s=%s", n.srv.Name(), key, want)
	}
	read(nodes["node-2"], "broker-a", "10.0.0.1:10911")

	// The meta leader goes: the two others elect another and the bucket takes writes.
	gone := st.MetaLeader
	closeNode(t, nodes[gone])
	var writer, reader *NATS
	for name, n := range nodes {
		switch {
		case name == gone:
		case writer == nil:
			writer = n
		default:
			reader = n
		}
	}
	require.Eventually(t, formed(2, gone), 60*time.Second, 50*time.Millisecond, "no meta leader after %s went", gone)
	st, err = writer.ClusterState()
	require.NoError(t, err)
	assert.NotEqual(t, gone, st.MetaLeader)
	wkv := kv(writer)
	require.Eventually(t, func() bool {
		_, err := wkv.Put(ctx, "broker-b", []byte("10.0.0.2:10911"))
		return err == nil
	}, 60*time.Second, 100*time.Millisecond, "R3 bucket not writable with 2 of 3 servers")
	read(reader, "broker-b", "10.0.0.2:10911")
}

// A route to a server of another cluster name would be refused by NATS for ever: Open
// fails, naming the route, both names and the setting.
func TestRouteToAnotherClusterNameFailsOpen(t *testing.T) {
	east := freeAddr(t)
	openNode(t, clusterNode(t, "east-1", "east", east))
	cfg := clusterNode(t, "west-1", "west", freeAddr(t), "nats-route://"+east)
	n, err := Open(context.Background(), cfg)
	if err == nil {
		closeNode(t, n)
	}
	require.ErrorIs(t, err, ErrClusterNameMismatch)
	assert.Contains(t, err.Error(), "nats-route://"+east)
	assert.Contains(t, err.Error(), `cluster "east"`)
	assert.Contains(t, err.Error(), `is "west"`)
	assert.Contains(t, err.Error(), "--nats-cluster-name")
}

// A route to a port that is not a NATS route listener (one that says nothing, one that
// speaks another protocol) does not hold Open up: the server starts, and a warning names
// each route. A route nobody listens on yet is normal while a cluster starts.
func TestRouteToANonNATSPortWarnsAndOpenReturns(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	other, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var held sync.WaitGroup
	done := make(chan struct{})
	defer func() {
		close(done)
		_ = silent.Close()
		_ = other.Close()
		held.Wait()
	}()
	serve := func(ln net.Listener, greeting string) {
		held.Go(func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				if greeting != "" {
					_, _ = c.Write([]byte(greeting))
				}
				held.Go(func() { // held open until the test ends
					<-done
					_ = c.Close()
				})
			}
		})
	}
	serve(silent, "")
	serve(other, "SSH-2.0-OpenSSH_9.6\r\n")
	down := freeAddr(t)

	var log syncLog
	cfg := clusterNode(t, "solo", "flowd-test", freeAddr(t),
		"nats-route://"+silent.Addr().String(), "nats-route://"+other.Addr().String(), "nats-route://"+down)
	cfg.Logger = log.logger()
	cfg.Cluster.ProbeTimeout = time.Second
	opened := make(chan error, 1)
	var n *NATS
	go func() {
		var err error
		n, err = Open(context.Background(), cfg)
		opened <- err
	}()
	select {
	case err := <-opened:
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("Open hung on routes to ports that are not NATS")
	}
	defer closeNode(t, n)
	logs := log.String()
	for _, a := range []string{silent.Addr().String(), other.Addr().String()} {
		assert.Regexp(t, `level=WARN msg="NATS route does not answer as a NATS server[^\n]*route=nats-route://`+a, logs)
	}
	assert.Contains(t, logs, "SSH-2.0")
	assert.Regexp(t, `level=INFO msg="NATS route not reachable yet[^\n]*route=nats-route://`+down, logs)
	st, err := n.ClusterState()
	require.NoError(t, err)
	assert.True(t, st.Clustered)
	assert.Empty(t, st.Routes)
}

// Bad cluster settings are refused before anything binds, each naming what is wrong; a
// route listener off loopback needs route credentials, as the client listener needs a
// token or users.
func TestClusterSettingsAreValidated(t *testing.T) {
	base := func(mod func(*NATSConfig)) NATSConfig {
		c := clusterNode(t, "n1", "flowd-test", "127.0.0.1:0")
		mod(&c)
		return c
	}
	cases := map[string]struct {
		cfg  NATSConfig
		err  error
		want string
	}{
		"open route listener": {base(func(c *NATSConfig) { c.Cluster.Listen = "0.0.0.0:6222" }), ErrInsecureListener, "--nats-cluster-user"},
		"wildcard listener":   {base(func(c *NATSConfig) { c.Cluster.Listen = ":6222" }), ErrInsecureListener, "cluster listen :6222"},
		"routes, no listener": {base(func(c *NATSConfig) { c.Cluster.Listen = ""; c.Cluster.Routes = []string{"nats-route://127.0.0.1:6222"} }), ErrBadConfig, "--nats-cluster-listen"},
		"http route":          {base(func(c *NATSConfig) { c.Cluster.Routes = []string{"http://127.0.0.1:6222"} }), ErrBadConfig, `route "http://127.0.0.1:6222"`},
		"route without port":  {base(func(c *NATSConfig) { c.Cluster.Routes = []string{"nats-route://n2"} }), ErrBadConfig, `route "nats-route://n2"`},
		"route with a path":   {base(func(c *NATSConfig) { c.Cluster.Routes = []string{"nats-route://n2:6222/x"} }), ErrBadConfig, "nothing may follow"},
		"cluster name":        {base(func(c *NATSConfig) { c.Cluster.Name = "a.b" }), ErrBadConfig, "--nats-cluster-name"},
		"no cluster name":     {base(func(c *NATSConfig) { c.Cluster.Name = "" }), ErrBadConfig, "--nats-cluster-name"},
		"server name":         {base(func(c *NATSConfig) { c.ServerName = "broker a" }), ErrBadConfig, "--nats-server-name"},
		"user, no password":   {base(func(c *NATSConfig) { c.Cluster.User = "route" }), ErrBadConfig, "--nats-cluster-password"},
		"client listener off": {base(func(c *NATSConfig) { c.Listen = "off" }), ErrBadConfig, "--nats-listen"},
		"bad listen":          {base(func(c *NATSConfig) { c.Cluster.Listen = "127.0.0.1" }), ErrBadConfig, "--nats-cluster-listen"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			n, err := Open(context.Background(), c.cfg)
			if err == nil {
				closeNode(t, n)
			}
			require.ErrorIs(t, err, c.err)
			assert.Contains(t, err.Error(), c.want)
		})
	}

	// With credentials a route listener may bind every interface, and its routes present them.
	a, b := "127.0.0.1:0", freeAddr(t)
	n1 := openNode(t, base(func(c *NATSConfig) {
		c.Cluster.Listen, c.Cluster.User, c.Cluster.Password = b, "route", "r-secret"
	}))
	n2 := openNode(t, base(func(c *NATSConfig) {
		c.ServerName = "n2"
		c.Cluster.Listen, c.Cluster.User, c.Cluster.Password = a, "route", "r-secret"
		c.Cluster.Routes = []string{"nats-route://" + b}
	}))
	routed := func(n *NATS, to string) func() bool {
		return func() bool {
			st, err := n.ClusterState()
			return err == nil && len(st.Routes) == 1 && st.Routes[0] == to
		}
	}
	require.Eventually(t, routed(n2, "n1"), 60*time.Second, 50*time.Millisecond, "the authenticated route did not form")
	require.Eventually(t, routed(n1, "n2"), 60*time.Second, 50*time.Millisecond, "the authenticated route did not form")
}

// Without cluster settings the embedded server is what it was: no route listener, and
// JetStream standalone under the name "flowd".
func TestStandaloneServerHasNoCluster(t *testing.T) {
	n := openEmbedded(t, nil)
	assert.Nil(t, n.Server().ClusterAddr(), "no route listener")
	assert.False(t, n.Server().JetStreamIsClustered())
	st, err := n.ClusterState()
	require.NoError(t, err)
	assert.Equal(t, ClusterState{ServerName: "flowd"}, st)

	ext := startExternal(t, "")
	c, err := Open(context.Background(), NATSConfig{URLs: []string{ext.url()}, Logger: discardLogger()})
	require.NoError(t, err)
	defer closeNode(t, c)
	st, err = c.ClusterState()
	require.NoError(t, err)
	assert.Equal(t, ClusterState{}, st)
}

// A mismatch Open cannot see (the other node was not up yet) is logged when NATS refuses
// the route, with what to change.
func TestRouteRefusedForItsClusterNameLaterIsLoggedWithAHint(t *testing.T) {
	east := freeAddr(t)
	openNode(t, clusterNode(t, "west-1", "west", freeAddr(t), "nats-route://"+east))
	var log syncLog
	cfg := clusterNode(t, "east-1", "east", east)
	cfg.Logger = log.logger()
	openNode(t, cfg)
	require.Eventually(t, func() bool {
		return strings.Contains(log.String(), `does not match`) && strings.Contains(log.String(), "--nats-cluster-name")
	}, 60*time.Second, 50*time.Millisecond, "the refused route was not logged with a hint: %s", log.String())
}
