package control_test

import (
	"context"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/runtime"
)

// badguest builds plugins/testdata/badguest, a plugin that misbehaves in the way its "mode"
// parameter says on a batch mentioning its "trigger" parameter ("boom" by default).
func badguest(t *testing.T) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "badguest.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, "../plugins/testdata/badguest")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	o, err := cmd.CombinedOutput()
	require.NoError(t, err, string(o))
	wasm, err := os.ReadFile(out)
	require.NoError(t, err)
	return wasm
}

// slowCommand bounds a command that compiles or starts a Go guest.
const slowCommand = 3 * time.Minute

// startWithLargePayloads is startWithPlugins on a NATS server taking requests of up to
// 8 MiB, so that a Go guest (about 2 MB) fits in plugin.deploy.
func startWithLargePayloads(t *testing.T) *pluginEnv {
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

	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, MaxPayload: 8 << 20})
	require.NoError(t, err)
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	require.True(t, ns.ReadyForConnections(wait), "nats server ready")
	b := startBroker(t, nil)
	// Compiling and starting a Go guest takes seconds under the race detector on a busy
	// machine: the commands get minutes.
	cfg := control.ServiceConfig{Logger: quiet(), Plugins: reg, RequestTimeout: slowCommand, PluginEvents: func(e control.PluginEvent) {
		pe.mu.Lock()
		defer pe.mu.Unlock()
		pe.events = append(pe.events, e)
	}}
	svc, err := control.StartService(ctx, connect(t, ns), b, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, svc.Stop()) })
	pe.env = &env{t: t, b: b, ns: ns, svc: svc, cl: connect(t, ns), cfg: cfg, replyWait: slowCommand}
	return pe
}

func badManifest(t *testing.T, wasm []byte, version string, params map[string]string, policy string) map[string]any {
	return manifestJSON(t, version, wasm, func(m map[string]any) {
		m["name"] = "bad"
		m["parameters"] = params
		m["limits"] = map[string]any{"memory_pages": 128, "max_instances": 2, "call_timeout": "10s"} // the ceiling
		m["policy"] = map[string]any{"on_fault": policy}
	})
}

// plugin.activate answers once the new version is swapped in, and reports plugin.activated,
// while a call is still running on the old version: that call is the old version's to
// finish, not the command's to wait for.
func TestPluginActivateAnswersWithACallInFlight(t *testing.T) {
	pe := startWithLargePayloads(t)
	wasm := badguest(t)
	module := base64.StdEncoding.EncodeToString(wasm)
	pe.ok("plugin.deploy", jsonString(t, map[string]any{"manifest": badManifest(t, wasm, "1.0.0", map[string]string{"mode": "loop"}, "fail_closed"),
		"module": module, "activate": true}), nil)
	pe.ok("plugin.deploy", jsonString(t, map[string]any{"manifest": badManifest(t, wasm, "2.0.0", map[string]string{"mode": "code"}, "fail_closed"),
		"module": module}), nil)
	pe.takeEvents()

	f, err := pe.reg.Filter("bad")
	require.NoError(t, err)
	callCtx, stopCall := context.WithCancel(context.Background())
	defer stopCall()
	inFlight := make(chan error, 1)
	go func() { inFlight <- f.Match(callCtx, []plugins.Message{{Topic: "boom"}}, make([]bool, 1)) }()
	require.Eventually(t, func() bool {
		st := pe.reg.Stats()
		return len(st) == 1 && st[0].Borrowed == 1
	}, wait, 10*time.Millisecond, "the call is in the guest")

	var reply control.PluginReply
	pe.ok("plugin.activate", `{"name":"bad","version":"2.0.0"}`, &reply)
	assert.True(t, reply.Plugin.Active)
	assert.Equal(t, "2.0.0", reply.Plugin.Manifest.Version)
	assert.Equal(t, []control.PluginEvent{{Type: control.EventPluginActivated, Name: "bad", Version: "2.0.0", Kind: "filter"}}, pe.takeEvents())
	assert.Equal(t, "2.0.0", pe.reg.ActiveVersion("bad"))
	select {
	case err := <-inFlight:
		t.Fatalf("the call on the old version ended early: %v", err)
	default:
	}
	stopCall()
	require.ErrorIs(t, <-inFlight, context.Canceled)
}

// A deploy refused because the self-test faulted says so in one line, without the wasm
// stack trace and without the words of a fault policy that never applied: the version was
// not reloaded, nor failed open or closed, it was refused.
func TestPluginDeployRefusalReadsPlainly(t *testing.T) {
	pe := startWithLargePayloads(t)
	wasm := badguest(t)
	module := base64.StdEncoding.EncodeToString(wasm)
	for _, tc := range []struct{ mode, policy string }{{"oob", "reload"}, {"trap", "fail_open"}, {"code", "fail_closed"}} {
		params := map[string]string{"mode": tc.mode, "trigger": "flowd-self-test"}
		msg := pe.fail("plugin.deploy", jsonString(t, map[string]any{"manifest": badManifest(t, wasm, "1.0.0", params, tc.policy),
			"module": module}), control.CodeBadRequest)
		assert.Contains(t, msg, `field "module"`, tc.mode)
		assert.Contains(t, msg, "self-test failed", tc.mode)
		for _, word := range []string{"reload", "failed open", "failed closed", "stack trace", "\n"} {
			assert.False(t, strings.Contains(msg, word), "%s: %q in %q", tc.mode, word, msg)
		}
	}
	var list control.PluginListReply
	pe.ok("plugin.list", ``, &list)
	assert.Empty(t, list.Plugins, "nothing refused was stored")
}

// plugin.list shows the active version's calls and faults by kind, as they happen.
func TestPluginListShowsCallsAndFaultsByKind(t *testing.T) {
	pe := startWithLargePayloads(t)
	wasm := badguest(t)
	pe.ok("plugin.deploy", jsonString(t, map[string]any{"manifest": badManifest(t, wasm, "1.0.0", map[string]string{"mode": "trap"}, "reload"),
		"module": base64.StdEncoding.EncodeToString(wasm), "activate": true}), nil)
	f, err := pe.reg.Filter("bad")
	require.NoError(t, err)
	require.NoError(t, f.Match(context.Background(), []plugins.Message{{Topic: "fine"}}, make([]bool, 1)))
	require.Error(t, f.Match(context.Background(), []plugins.Message{{Topic: "boom"}}, make([]bool, 1)))

	var list control.PluginListReply
	pe.ok("plugin.list", `{"name":"bad"}`, &list)
	require.Len(t, list.Plugins, 1)
	st := list.Plugins[0].Stats
	require.NotNil(t, st, "the active version has stats")
	assert.GreaterOrEqual(t, st.Calls, uint64(2))
	assert.Equal(t, uint64(1), st.Faults["trap"])
	assert.Equal(t, uint64(0), st.Faults["timeout"])
	assert.Len(t, st.Faults, 5, "every kind")
	assert.Equal(t, uint64(1), st.FaultsTotal)
	assert.Positive(t, st.MeanCallMicros)
}
