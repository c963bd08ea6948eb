package plugins

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// Stats lists the active versions only, with the counters of their loaded module.
func TestRegistryStatsReportsActiveVersions(t *testing.T) {
	ctx := context.Background()
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	reg, err := NewRegistry(ctx, newRuntime(t), store, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close(ctx) })

	wasm := wasmModule(nil, tinyFilter())
	m := manifest("tiny", KindFilter, wasm, nil)
	require.NoError(t, reg.Deploy(ctx, m, wasm))
	require.Empty(t, reg.Stats(), "deployed but not active")

	require.NoError(t, reg.Activate(ctx, "tiny", m.Version))
	f, err := reg.Filter("tiny")
	require.NoError(t, err)
	before := reg.Stats()
	require.Len(t, before, 1)
	require.Equal(t, "tiny", before[0].Name)
	require.Equal(t, m.Version, before[0].Version)
	require.Equal(t, KindFilter, before[0].Kind)

	keep := []bool{true}
	require.NoError(t, f.Match(ctx, []Message{{Topic: "t", Body: []byte("x")}}, keep))
	after := reg.Stats()
	require.Equal(t, before[0].Calls+1, after[0].Calls)
}
