package control_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/runtime"
)

// pluginEnv is a service with a plugin registry, recording the plugin events it reports.
type pluginEnv struct {
	*env
	reg *plugins.Registry

	mu     sync.Mutex
	events []control.PluginEvent
}

func startWithPlugins(t *testing.T) *pluginEnv {
	t.Helper()
	ctx := context.Background()
	rt, err := runtime.New(ctx, runtime.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rt.Close(ctx)) })
	st, err := plugins.NewDirStore(filepath.Join(t.TempDir(), "plugins"))
	require.NoError(t, err)
	reg, err := plugins.NewRegistry(ctx, rt, st, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, reg.Close(ctx)) })
	pe := &pluginEnv{reg: reg}
	pe.env = start(t, func(c *control.ServiceConfig) {
		c.Plugins = reg
		c.PluginEvents = func(e control.PluginEvent) {
			pe.mu.Lock()
			defer pe.mu.Unlock()
			pe.events = append(pe.events, e)
		}
	})
	return pe
}

func (pe *pluginEnv) takeEvents() []control.PluginEvent {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	out := pe.events
	pe.events = nil
	return out
}

func propfilterModule(t *testing.T) []byte {
	t.Helper()
	wasm, err := os.ReadFile("../examples/wasm/c-propfilter/propfilter.wasm")
	require.NoError(t, err)
	return wasm
}

func manifestJSON(t *testing.T, version string, wasm []byte, mod func(map[string]any)) map[string]any {
	t.Helper()
	sum := sha256.Sum256(wasm)
	m := map[string]any{"name": "region", "kind": "filter", "version": version, "abi": 1,
		"parameters": map[string]string{"property": "region", "value": "eu"}, "sha256": hex.EncodeToString(sum[:])}
	if mod != nil {
		mod(m)
	}
	return m
}

func jsonString(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func TestPluginCommands(t *testing.T) {
	pe := startWithPlugins(t)
	wasm := propfilterModule(t)
	module := base64.StdEncoding.EncodeToString(wasm)

	var dep control.PluginReply
	pe.ok("plugin.deploy", jsonString(t, map[string]any{"manifest": manifestJSON(t, "1.0.0", wasm, nil), "module": module}), &dep)
	assert.Equal(t, "region", dep.Plugin.Manifest.Name)
	assert.False(t, dep.Plugin.Active)
	pe.ok("plugin.deploy", jsonString(t, map[string]any{"manifest": manifestJSON(t, "1.1.0", wasm, nil), "module": module, "activate": true}), &dep)
	assert.True(t, dep.Plugin.Active)
	assert.Equal(t, "1.1.0", pe.reg.ActiveVersion("region"))
	assert.Equal(t, []control.PluginEvent{
		{Type: control.EventPluginDeployed, Name: "region", Version: "1.0.0", Kind: "filter"},
		{Type: control.EventPluginDeployed, Name: "region", Version: "1.1.0", Kind: "filter"},
		{Type: control.EventPluginActivated, Name: "region", Version: "1.1.0", Kind: "filter"},
	}, pe.takeEvents())

	pe.ok("plugin.activate", `{"name":"region","version":"1.0.0"}`, nil)
	var list control.PluginListReply
	pe.ok("plugin.list", `{}`, &list)
	require.Len(t, list.Plugins, 2)
	assert.True(t, list.Plugins[0].Active)
	assert.False(t, list.Plugins[1].Active)
	pe.ok("plugin.list", `{"name":"other"}`, &list)
	assert.Empty(t, list.Plugins)

	pe.ok("plugin.remove", `{"name":"region","version":"1.1.0"}`, nil)
	assert.Contains(t, pe.fail("plugin.remove", `{"name":"region","version":"1.0.0"}`, control.CodeConflict), "active")
	pe.fail("plugin.remove", `{"name":"region","version":"1.1.0"}`, control.CodeNotFound)
	pe.fail("plugin.activate", `{"name":"region","version":"9.0.0"}`, control.CodeNotFound)
	assert.Equal(t, []control.PluginEvent{
		{Type: control.EventPluginActivated, Name: "region", Version: "1.0.0", Kind: "filter"},
		{Type: control.EventPluginRemoved, Name: "region", Version: "1.1.0", Kind: "filter"},
	}, pe.takeEvents())

	// Deploying the same version with another module is a conflict.
	pe.fail("plugin.deploy", jsonString(t, map[string]any{"manifest": manifestJSON(t, "1.0.0", []byte("x"), nil), "module": base64.StdEncoding.EncodeToString([]byte("x"))}), control.CodeConflict)
}

func TestPluginCommandsNameTheBadField(t *testing.T) {
	pe := startWithPlugins(t)
	wasm := propfilterModule(t)
	module := base64.StdEncoding.EncodeToString(wasm)
	for _, tc := range []struct {
		name  string
		cmd   string
		body  string
		field string
	}{
		{"no manifest", "plugin.deploy", jsonString(t, map[string]any{"module": module}), "manifest"},
		{"manifest not an object", "plugin.deploy", jsonString(t, map[string]any{"manifest": "region", "module": module}), "manifest"},
		{"bad version", "plugin.deploy", jsonString(t, map[string]any{"manifest": manifestJSON(t, "one", wasm, nil), "module": module}), "manifest.version"},
		{"bad policy", "plugin.deploy", jsonString(t, map[string]any{"manifest": manifestJSON(t, "1.0.0", wasm, func(m map[string]any) {
			m["policy"] = map[string]string{"on_fault": "ignore"}
		}), "module": module}), "manifest.policy.on_fault"},
		{"manifest value of the wrong type", "plugin.deploy", jsonString(t, map[string]any{"manifest": manifestJSON(t, "1.0.0", wasm, func(m map[string]any) {
			m["limits"] = map[string]any{"memory_pages": "many"}
		}), "module": module}), "manifest.limits.memory_pages"},
		{"manifest duration that does not parse", "plugin.deploy", jsonString(t, map[string]any{"manifest": manifestJSON(t, "1.0.0", wasm, func(m map[string]any) {
			m["limits"] = map[string]any{"call_timeout": "soon"}
		}), "module": module}), "manifest.limits.call_timeout"},
		{"unknown manifest field", "plugin.deploy", jsonString(t, map[string]any{"manifest": manifestJSON(t, "1.0.0", wasm, func(m map[string]any) {
			m["colour"] = "red"
		}), "module": module}), "manifest.colour"},
		{"no module", "plugin.deploy", jsonString(t, map[string]any{"manifest": manifestJSON(t, "1.0.0", wasm, nil)}), "module"},
		{"bad base64", "plugin.deploy", jsonString(t, map[string]any{"manifest": manifestJSON(t, "1.0.0", wasm, nil), "module": "%%%"}), "module"},
		{"checksum mismatch", "plugin.deploy", jsonString(t, map[string]any{"manifest": manifestJSON(t, "1.0.0", wasm, nil), "module": base64.StdEncoding.EncodeToString(wasm[:len(wasm)-1])}), "module"},
		{"not a module", "plugin.deploy", jsonString(t, map[string]any{"manifest": manifestJSON(t, "1.0.0", []byte("nope"), nil), "module": base64.StdEncoding.EncodeToString([]byte("nope"))}), "module"},
		{"missing parameters", "plugin.deploy", jsonString(t, map[string]any{"manifest": manifestJSON(t, "1.0.0", wasm, func(m map[string]any) {
			delete(m, "parameters")
		}), "module": module}), "manifest.parameters"},
		{"memory limit below the module's", "plugin.deploy", jsonString(t, map[string]any{"manifest": manifestJSON(t, "1.0.0", wasm, func(m map[string]any) {
			m["limits"] = map[string]any{"memory_pages": 1}
		}), "module": module}), "module"},
		{"activate without name", "plugin.activate", `{"version":"1.0.0"}`, "name"},
		{"remove without version", "plugin.remove", `{"name":"region"}`, "version"},
		{"unknown request field", "plugin.list", `{"kind":"filter"}`, "kind"},
	} {
		msg := pe.fail(tc.cmd, tc.body, control.CodeBadRequest)
		assert.Contains(t, msg, `field "`+tc.field+`"`, tc.name)
	}
	var list control.PluginListReply
	pe.ok("plugin.list", ``, &list)
	assert.Empty(t, list.Plugins, "nothing refused was stored")
	assert.Empty(t, pe.takeEvents())
}

// The plugin commands exist only on a service with a registry.
func TestPluginCommandsNeedARegistry(t *testing.T) {
	pe := startWithPlugins(t)
	msg, err := pe.cl.Request("$SRV.INFO.flowd", nil, wait)
	require.NoError(t, err)
	var info micro.Info
	require.NoError(t, json.Unmarshal(msg.Data, &info))
	subjects := map[string]string{}
	for _, ep := range info.Endpoints {
		subjects[ep.Subject] = ep.Metadata["read_only"]
	}
	for _, name := range control.Commands() {
		if strings.HasPrefix(name, "pipeline.") {
			continue // served with a pipeline controller only
		}
		assert.Contains(t, subjects, pe.svc.Subject(name))
	}
	assert.Equal(t, "true", subjects["flowd.ctl.v1.local.plugin.list"])
	assert.Equal(t, "false", subjects["flowd.ctl.v1.local.plugin.deploy"])

	without := start(t, nil)
	_, err = without.cl.Request("flowd.ctl.v1.local.plugin.list", nil, wait/10)
	require.Error(t, err, "no responders without a registry")
}
