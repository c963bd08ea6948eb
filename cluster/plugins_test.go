package cluster_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/cluster"
	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/protocol"
	"github.com/flowd-io/flowd/runtime"
)

// propFilter is the example filter that keeps the messages whose property region is value.
func propFilter(t *testing.T, name, version, value string) (*plugins.Manifest, []byte) {
	t.Helper()
	wasm, err := os.ReadFile("../examples/wasm/c-propfilter/propfilter.wasm")
	require.NoError(t, err)
	sum := sha256.Sum256(wasm)
	return &plugins.Manifest{
		Name: name, Kind: plugins.KindFilter, Version: version, ABI: plugins.ABIVersion,
		Limits: plugins.Limits{MemoryPages: 16, MaxInstances: 1}, SHA256: hex.EncodeToString(sum[:]),
		Parameters: map[string]string{"property": "region", "value": value},
	}, wasm
}

// pluginNode is one node's plugins as the daemon runs them: a runtime, a registry on a
// cluster.PluginStore over a local copy in dir.
type pluginNode struct {
	name  string
	dir   string
	rt    *runtime.Runtime
	store *cluster.PluginStore
	reg   *plugins.Registry
	ev    chan cluster.PluginEvent
}

// openPluginNode builds the node's registry on its local copy, as at a daemon's start,
// without reaching the cluster yet.
func openPluginNode(t *testing.T, name, dir string, mods ...func(*cluster.PluginOptions)) *pluginNode {
	t.Helper()
	ctx := context.Background()
	n := &pluginNode{name: name, dir: dir, ev: make(chan cluster.PluginEvent, 64)}
	var err error
	n.rt, err = runtime.New(ctx, runtime.Options{CacheDir: filepath.Join(dir, "wasm-cache")})
	require.NoError(t, err)
	cache, err := plugins.NewDirStore(filepath.Join(dir, "plugins"))
	require.NoError(t, err)
	opts := cluster.PluginOptions{
		Node: name, Logger: quiet, RetryInterval: 100 * time.Millisecond,
		OnEvent: func(e cluster.PluginEvent) {
			select {
			case n.ev <- e:
			default:
			}
		},
	}
	for _, mod := range mods {
		mod(&opts)
	}
	n.store, err = cluster.NewPluginStore(cache, opts)
	require.NoError(t, err)
	n.reg, err = plugins.NewRegistry(ctx, n.rt, n.store, quiet)
	require.NoError(t, err)
	t.Cleanup(func() { n.close(t) })
	return n
}

// startPluginNode opens a node on a fresh directory and starts following the cluster.
func startPluginNode(t *testing.T, s *natsserver.Server, name string) *pluginNode {
	t.Helper()
	n := openPluginNode(t, name, t.TempDir())
	n.start(t, s)
	return n
}

func (n *pluginNode) start(t *testing.T, s *natsserver.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, n.store.Start(ctx, connect(t, s), n.reg))
}

func (n *pluginNode) close(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, n.store.Close(ctx))
	require.NoError(t, n.reg.Close(ctx))
	require.NoError(t, n.rt.Close(ctx))
}

// keeps runs the node's filter name on one message per region and returns the regions kept.
func (n *pluginNode) keeps(t *testing.T, name string) []string {
	t.Helper()
	f, err := n.reg.Filter(name)
	require.NoError(t, err)
	regions := []string{"eu", "us", "apac"}
	msgs := make([]plugins.Message, len(regions))
	for i, r := range regions {
		msgs[i] = plugins.Message{Topic: "orders", Properties: []byte(protocol.EncodeProperties(map[string]string{"region": r}))}
	}
	keep := make([]bool, len(msgs))
	require.NoError(t, f.Match(context.Background(), msgs, keep))
	var out []string
	for i, k := range keep {
		if k {
			out = append(out, regions[i])
		}
	}
	return out
}

func (n *pluginNode) waitEvent(t *testing.T, typ cluster.PluginEventType, name string) cluster.PluginEvent {
	t.Helper()
	timeout := time.After(wait)
	for {
		select {
		case e := <-n.ev:
			if e.Type == typ && e.Name == name {
				return e
			}
		case <-timeout:
			t.Fatalf("%s: no %s event for %s", n.name, typ, name)
		}
	}
}

// reported waits until node's report on plugin, as seen by n, satisfies ok.
func (n *pluginNode) reported(t *testing.T, plugin, node string, ok func(cluster.PluginReport) bool) cluster.PluginReport {
	t.Helper()
	var last cluster.PluginReport
	require.Eventually(t, func() bool {
		for _, r := range n.store.Reports(plugin) {
			if r.Node == node {
				last = r
				return ok(r)
			}
		}
		return false
	}, wait, 10*time.Millisecond, "%s sees %s's report on %s: last %+v", n.name, node, plugin, last)
	return last
}

// A version deployed and activated on one node is fetched, checked, compiled and swapped in
// on the other, which reports it and tells of it; an activation on the second reaches the
// first; a version taken by another module, or of another kind, is refused.
func TestPluginDeployedOnOneNodeActivatesOnAnother(t *testing.T) {
	s := startNATS(t, false)
	a, b := startPluginNode(t, s, "node-a"), startPluginNode(t, s, "node-b")
	ctx := context.Background()

	v1, wasm := propFilter(t, "region", "1.0.0", "eu")
	require.NoError(t, a.reg.Deploy(ctx, v1, wasm))
	require.NoError(t, a.reg.Activate(ctx, "region", "1.0.0"))
	e := b.waitEvent(t, cluster.PluginActivated, "region")
	assert.Equal(t, "1.0.0", e.Version)
	assert.Equal(t, "filter", e.Kind)
	require.Equal(t, "1.0.0", b.reg.ActiveVersion("region"))
	assert.Equal(t, []string{"eu"}, b.keeps(t, "region"), "B runs A's filter")
	for _, node := range []string{"node-a", "node-b"} {
		a.reported(t, "region", node, func(r cluster.PluginReport) bool { return r.Active == "1.0.0" && r.Error == "" })
	}
	_, err := os.Stat(filepath.Join(b.dir, "plugins", "region", "1.0.0", "module.wasm"))
	require.NoError(t, err, "B keeps a local copy")
	bCopy, err := plugins.NewDirStore(filepath.Join(b.dir, "plugins"))
	require.NoError(t, err)
	localActive, err := bCopy.Active(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"region": "1.0.0"}, localActive, "B's local copy records the version it follows, for its next start")

	// The other way: B deploys and activates v2, A follows.
	v2, _ := propFilter(t, "region", "2.0.0", "us")
	require.NoError(t, b.reg.Deploy(ctx, v2, wasm))
	require.NoError(t, b.reg.Activate(ctx, "region", "2.0.0"))
	a.waitEvent(t, cluster.PluginActivated, "region")
	assert.Equal(t, "2.0.0", a.reg.ActiveVersion("region"))
	assert.Equal(t, []string{"us"}, a.keeps(t, "region"))
	b.reported(t, "region", "node-a", func(r cluster.PluginReport) bool { return r.Active == "2.0.0" })
	list, err := a.reg.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	assert.True(t, list[1].Active && list[1].Manifest.Version == "2.0.0")

	// A version is immutable cluster-wide: another module under 1.0.0 is refused on B,
	// and a transform named like the filter too.
	other := *v1
	other.SHA256 = strings.Repeat("0", 64)
	require.ErrorIs(t, b.store.Put(ctx, &other, wasm), plugins.ErrExists)
	tr := *v1
	tr.Version, tr.Kind = "3.0.0", plugins.KindTransform
	require.ErrorIs(t, b.store.Put(ctx, &tr, wasm), plugins.ErrKind)
}

// A version removed on one node is removed on every node, local copies included.
func TestPluginRemoveIsClusterWide(t *testing.T) {
	s := startNATS(t, false)
	a, b := startPluginNode(t, s, "node-a"), startPluginNode(t, s, "node-b")
	ctx := context.Background()
	v1, wasm := propFilter(t, "region", "1.0.0", "eu")
	v2, _ := propFilter(t, "region", "2.0.0", "us")
	require.NoError(t, a.reg.Deploy(ctx, v1, wasm))
	require.NoError(t, a.reg.Deploy(ctx, v2, wasm))
	require.NoError(t, a.reg.Activate(ctx, "region", "2.0.0"))
	b.waitEvent(t, cluster.PluginActivated, "region")
	_, err := os.Stat(filepath.Join(a.dir, "plugins", "region", "1.0.0"))
	require.NoError(t, err)

	require.NoError(t, b.reg.Remove(ctx, "region", "1.0.0"))
	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(a.dir, "plugins", "region", "1.0.0"))
		return os.IsNotExist(err)
	}, wait, 10*time.Millisecond, "A's local copy of 1.0.0 goes")
	_, err = a.reg.Get(ctx, "region", "1.0.0")
	require.ErrorIs(t, err, plugins.ErrNotFound)
	list, err := a.reg.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, "2.0.0", list[0].Manifest.Version)
	assert.Equal(t, []string{"us"}, a.keeps(t, "region"), "the active version runs on")
	require.ErrorIs(t, a.reg.Remove(ctx, "region", "1.0.0"), plugins.ErrNotFound)
}

// A module in the cluster that does not match its manifest's sha256 is refused by the node
// fetching it: nothing is activated, the node reports the fault and tells of it.
func TestPluginCorruptModuleIsRefusedByTheFetchingNode(t *testing.T) {
	s := startNATS(t, false)
	b := startPluginNode(t, s, "node-b")
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	// Another writer put a module that is not the manifest's into the buckets.
	m, wasm := propFilter(t, "bad", "1.0.0", "eu")
	js, err := jetstream.New(connect(t, s))
	require.NoError(t, err)
	obj, err := js.ObjectStore(ctx, "flowd_plugin_modules")
	require.NoError(t, err)
	kv, err := js.KeyValue(ctx, "flowd_plugin_versions")
	require.NoError(t, err)
	corrupt := append([]byte{}, wasm...)
	corrupt[len(corrupt)-1] ^= 0xff
	object := m.ID() + "/" + m.SHA256
	_, err = obj.PutBytes(ctx, object, corrupt)
	require.NoError(t, err)
	mb, err := json.Marshal(m)
	require.NoError(t, err)
	entry, err := json.Marshal(map[string]any{"manifest": json.RawMessage(mb), "object": object, "deployer": "elsewhere", "deployed": time.Now()})
	require.NoError(t, err)
	_, err = kv.Put(ctx, "version.bad.1=2E0=2E0", entry)
	require.NoError(t, err)
	active, err := json.Marshal(cluster.PluginActive{Version: "1.0.0", Node: "elsewhere", Boot: "x", Time: time.Now()})
	require.NoError(t, err)
	_, err = kv.Put(ctx, "active.bad", active)
	require.NoError(t, err)

	e := b.waitEvent(t, cluster.PluginFailed, "bad")
	assert.Equal(t, "1.0.0", e.Version)
	assert.Contains(t, e.Reason, "sha256")
	r := b.reported(t, "bad", "node-b", func(r cluster.PluginReport) bool { return r.Failed == "1.0.0" })
	assert.Contains(t, r.Error, "sha256")
	assert.Empty(t, r.Active)
	assert.Equal(t, "", b.reg.ActiveVersion("bad"), "nothing activated")
	_, _, err = b.store.Get(ctx, "bad", "1.0.0")
	require.ErrorIs(t, err, runtime.ErrChecksum)
	_, err = os.Stat(filepath.Join(b.dir, "plugins", "bad", "1.0.0", "module.wasm"))
	assert.True(t, os.IsNotExist(err), "the corrupt module is not cached")
}

// A node that joins after a plugin was deployed and activated has it active, compiled,
// when Start returns; restarted, it serves its local copy before it reaches the cluster,
// refuses changes until it does, and then follows an activation made while it was away.
func TestPluginLateJoinerCatchesUpBeforeItIsReady(t *testing.T) {
	s := startNATS(t, false)
	a := startPluginNode(t, s, "node-a")
	ctx := context.Background()
	v1, wasm := propFilter(t, "region", "1.0.0", "eu")
	require.NoError(t, a.reg.Deploy(ctx, v1, wasm))
	require.NoError(t, a.reg.Activate(ctx, "region", "1.0.0"))

	c := startPluginNode(t, s, "node-c")
	require.True(t, c.store.Synced(), "Start returns once caught up")
	require.Equal(t, "1.0.0", c.reg.ActiveVersion("region"))
	assert.Equal(t, []string{"eu"}, c.keeps(t, "region"))
	a.reported(t, "region", "node-c", func(r cluster.PluginReport) bool { return r.Active == "1.0.0" })

	// C stops; A activates v2 meanwhile.
	c.close(t)
	v2, _ := propFilter(t, "region", "2.0.0", "apac")
	require.NoError(t, a.reg.Deploy(ctx, v2, wasm))
	require.NoError(t, a.reg.Activate(ctx, "region", "2.0.0"))

	// C restarts on its directory: its registry runs the local copy before the cluster
	// answers, and plugin changes wait for the cluster.
	c2 := openPluginNode(t, "node-c", c.dir)
	require.Equal(t, "1.0.0", c2.reg.ActiveVersion("region"), "the local copy, before JetStream")
	assert.Equal(t, []string{"eu"}, c2.keeps(t, "region"))
	require.ErrorIs(t, c2.reg.Activate(ctx, "region", "1.0.0"), cluster.ErrPluginsNotJoined)

	c2.start(t, s)
	require.True(t, c2.store.Synced())
	require.Equal(t, "2.0.0", c2.reg.ActiveVersion("region"), "caught up with the activation made while away")
	assert.Equal(t, []string{"apac"}, c2.keeps(t, "region"))
}

// A node that ran alone with plugins and then joins the cluster publishes them: a node never
// drops a plugin because it was not in the cluster.
func TestPluginLocalVersionsArePublishedAtJoin(t *testing.T) {
	s := startNATS(t, false)
	ctx := context.Background()
	dir := t.TempDir()
	alone, err := plugins.NewDirStore(filepath.Join(dir, "plugins"))
	require.NoError(t, err)
	m, wasm := propFilter(t, "solo", "1.0.0", "us")
	require.NoError(t, alone.Put(ctx, m, wasm))
	require.NoError(t, alone.SetActive(ctx, "solo", "1.0.0"))

	a := openPluginNode(t, "node-a", dir)
	a.start(t, s)
	b := startPluginNode(t, s, "node-b")
	require.Equal(t, "1.0.0", b.reg.ActiveVersion("solo"))
	assert.Equal(t, []string{"us"}, b.keeps(t, "solo"))
}

// Without JetStream, Start gives up after SyncTimeout: the node serves its local copy, is
// not caught up, and refuses plugin changes, which are the cluster's.
func TestPluginStoreWithoutJetStreamServesTheLocalCopy(t *testing.T) {
	s := startNATS(t, true)
	ctx := context.Background()
	dir := t.TempDir()
	alone, err := plugins.NewDirStore(filepath.Join(dir, "plugins"))
	require.NoError(t, err)
	m, wasm := propFilter(t, "solo", "1.0.0", "us")
	require.NoError(t, alone.Put(ctx, m, wasm))
	require.NoError(t, alone.SetActive(ctx, "solo", "1.0.0"))

	n := openPluginNode(t, "node-a", dir, func(o *cluster.PluginOptions) {
		o.SyncTimeout, o.RequestTimeout = 300*time.Millisecond, 100*time.Millisecond
	})
	n.start(t, s)
	assert.False(t, n.store.Synced())
	assert.Equal(t, []string{"us"}, n.keeps(t, "solo"), "the local copy serves")
	list, err := n.reg.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	m2, _ := propFilter(t, "solo", "2.0.0", "eu")
	require.ErrorIs(t, n.reg.Deploy(ctx, m2, wasm), cluster.ErrPluginsNotJoined)
	require.ErrorIs(t, n.reg.Remove(ctx, "solo", "1.0.0"), plugins.ErrActive)
}
