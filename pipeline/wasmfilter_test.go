package pipeline_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/broker/filter"
	"github.com/flowd-io/flowd/pipeline"
	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/plugins/wasmfilter"
	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/runtime"
)

// A WASM selector names a filter plugin deployed on the broker (the committed C property
// filter): only the messages it keeps reach the sink.
func TestWasmFilterSelector(t *testing.T) {
	ctx := context.Background()
	rt, err := runtime.New(ctx, runtime.Options{CacheDir: filepath.Join(t.TempDir(), "cache")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rt.Close(ctx) })
	st, err := plugins.NewDirStore(filepath.Join(t.TempDir(), "plugins"))
	require.NoError(t, err)
	reg, err := plugins.NewRegistry(ctx, rt, st, quiet())
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close(ctx) })
	wasm, err := os.ReadFile("../examples/wasm/c-propfilter/propfilter.wasm")
	require.NoError(t, err)
	sum := sha256.Sum256(wasm)
	require.NoError(t, reg.Deploy(ctx, &plugins.Manifest{
		Name: "eu-only", Kind: plugins.KindFilter, Version: "1.0.0", ABI: plugins.ABIVersion,
		Limits: plugins.Limits{MemoryPages: 16, MaxInstances: 1}, SHA256: hex.EncodeToString(sum[:]),
		Parameters: map[string]string{"property": "region", "value": "eu"},
	}, wasm))
	require.NoError(t, reg.Activate(ctx, "eu-only", "1.0.0"))

	b := startBroker(t, func(c *broker.Config) {
		c.Filters = filter.NewRegistry(0)
		c.Filters.Register(filter.TypeWasm, wasmfilter.Compiler(reg, wasmfilter.Options{}))
	})
	createTopic(t, b, "regions", 2)
	var out lines
	m := newManager(t, b, func(o *pipeline.Options) { o.Stdout = &out })
	require.NoError(t, m.Start(ctx, pipeline.Definition{
		Name: "eu", Topics: []string{"regions"}, StartFrom: pipeline.StartFirst,
		Selector: pipeline.Selector{Type: pipeline.SelectorWasm, Expression: "eu-only"},
		Sink:     pipeline.SinkDefinition{Type: pipeline.SinkStdout},
	}))
	p := newProducer(t, b)
	for i := range 12 {
		region := []string{"eu", "us", "apac"}[i%3]
		send(t, p, &producer.Message{Topic: "regions", Properties: map[string]string{"region": region}, Body: []byte(region)})
	}
	require.Eventually(t, func() bool { return out.len() == 4 }, wait, 10*time.Millisecond)
	for _, r := range out.records() {
		assert.Equal(t, "eu", r.Properties["region"])
		assert.Equal(t, "eu", string(r.Body))
	}
	status, err := m.Get(ctx, "eu")
	require.NoError(t, err)
	assert.EqualValues(t, 4, status.Counters.In, "the broker dropped the others before they were polled")
}
