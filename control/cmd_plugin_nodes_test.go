package control_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/runtime"
)

// reportingMembership is a node's membership whose cluster keeps per-node plugin reports,
// as the daemon's is over the cluster's plugin store.
type reportingMembership struct {
	reports map[string][]control.PluginReport
}

func (reportingMembership) ClusterMembership() control.ClusterMembership {
	return control.ClusterMembership{Joined: true}
}

func (m reportingMembership) PluginReports(name string) []control.PluginReport {
	return m.reports[name]
}

// In a cluster, plugin.list shows each version with the nodes that report it active and
// those that refused it, with why; a version no node reports has no nodes.
func TestPluginListShowsEachNodesReport(t *testing.T) {
	ctx := context.Background()
	rt, err := runtime.New(ctx, runtime.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rt.Close(ctx)) })
	st, err := plugins.NewDirStore(filepath.Join(t.TempDir(), "plugins"))
	require.NoError(t, err)
	reg, err := plugins.NewRegistry(ctx, rt, st, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, reg.Close(ctx)) })
	wasm := propfilterModule(t)
	sum := sha256.Sum256(wasm)
	for _, v := range []string{"1.0.0", "2.0.0", "3.0.0"} {
		require.NoError(t, reg.Deploy(ctx, &plugins.Manifest{Name: "region", Kind: plugins.KindFilter, Version: v, ABI: plugins.ABIVersion,
			SHA256: hex.EncodeToString(sum[:]), Parameters: map[string]string{"property": "region", "value": "eu"}}, wasm))
	}
	require.NoError(t, reg.Activate(ctx, "region", "2.0.0"))
	now := time.Now().UTC().Truncate(time.Second)
	e := start(t, func(c *control.ServiceConfig) {
		c.Plugins = reg
		c.Membership = reportingMembership{reports: map[string][]control.PluginReport{"region": {
			{Node: "broker-1", Active: "2.0.0", Time: now},
			{Node: "broker-2", Active: "1.0.0", Failed: "2.0.0", Error: "sha256 is x, the manifest says y", Time: now},
		}}}
	})

	var list control.PluginListReply
	e.ok("plugin.list", `{"name":"region"}`, &list)
	require.Len(t, list.Plugins, 3)
	assert.Equal(t, []control.PluginNode{{Node: "broker-2", Active: true, Time: now}}, list.Plugins[0].Nodes, "1.0.0 runs on broker-2")
	assert.Equal(t, []control.PluginNode{
		{Node: "broker-1", Active: true, Time: now},
		{Node: "broker-2", Error: "sha256 is x, the manifest says y", Time: now},
	}, list.Plugins[1].Nodes, "2.0.0: active on broker-1, refused by broker-2")
	assert.Empty(t, list.Plugins[2].Nodes)

	var reply control.PluginReply
	e.ok("plugin.activate", `{"name":"region","version":"2.0.0"}`, &reply)
	assert.Len(t, reply.Plugin.Nodes, 2, "the activation's reply carries the nodes' reports")
}
