package metrics_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/metrics"
	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/runtime"
)

// badguest builds plugins/testdata/badguest, a filter misbehaving in its parameter's mode
// on a batch mentioning "boom".
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

// Faults the plugin layer detects (malformed output, error codes) are counted under their
// kind, next to the runtime's traps, from a real registry's stats.
func TestPluginFaultsCountABIFaultsByKind(t *testing.T) {
	ctx := context.Background()
	rt, err := runtime.New(ctx, runtime.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rt.Close(ctx)) })
	st, err := plugins.NewDirStore(t.TempDir())
	require.NoError(t, err)
	reg, err := plugins.NewRegistry(ctx, rt, st, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, reg.Close(ctx)) })

	wasm := badguest(t)
	sum := sha256.Sum256(wasm)
	for name, mode := range map[string]string{"pointer": "pointer", "code": "code"} {
		m := &plugins.Manifest{Name: name, Kind: plugins.KindFilter, Version: "1.0.0", ABI: plugins.ABIVersion,
			Limits: plugins.Limits{MemoryPages: 128, MaxInstances: 1}, Policy: plugins.FaultPolicy{OnFault: plugins.OnFaultReload},
			Parameters: map[string]string{"mode": mode}, SHA256: hex.EncodeToString(sum[:])}
		require.NoError(t, reg.Deploy(ctx, m, wasm))
		require.NoError(t, reg.Activate(ctx, name, m.Version))
		f, err := reg.Filter(name)
		require.NoError(t, err)
		for range 2 {
			require.Error(t, f.Match(ctx, []plugins.Message{{Topic: "boom"}}, make([]bool, 1)))
		}
	}

	m := metrics.New(metrics.Options{DisableRuntimeMetrics: true})
	m.WatchPlugins(reg.Stats)
	for _, tc := range []struct {
		plugin, fault string
		want          float64
	}{
		{"pointer", "bad_output", 2}, {"pointer", "guest_error", 0}, {"pointer", "trap", 0},
		{"code", "guest_error", 2}, {"code", "bad_output", 0},
	} {
		v, ok := value(t, m.Registry(), "flowd_plugin_faults_total",
			"plugin", tc.plugin, "kind", "filter", "version", "1.0.0", "fault", tc.fault)
		assert.True(t, ok, "%s %s", tc.plugin, tc.fault)
		assert.Equal(t, tc.want, v, "%s %s", tc.plugin, tc.fault)
	}
	v, _ := value(t, m.Registry(), "flowd_plugin_reloads_total", "plugin", "code", "kind", "filter", "version", "1.0.0")
	assert.Equal(t, 2.0, v, "each fault replaced the instance")
}
