package control

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker/filter"
	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/plugins/wasmfilter"
	"github.com/flowd-io/flowd/protocol"
	"github.com/flowd-io/flowd/runtime"
)

// panicBarrier is a log handler for guest output that holds each guest printing its panic
// until two have, so that two calls are inside the guest when the first of them faults.
type panicBarrier struct {
	mu      sync.Mutex
	n       int
	release chan struct{}
}

func (b *panicBarrier) Enabled(context.Context, slog.Level) bool { return true }
func (b *panicBarrier) WithAttrs([]slog.Attr) slog.Handler       { return b }
func (b *panicBarrier) WithGroup(string) slog.Handler            { return b }
func (b *panicBarrier) Handle(_ context.Context, r slog.Record) error {
	line := ""
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "line" {
			line = a.Value.String()
		}
		return true
	})
	if !strings.HasPrefix(line, "panic: boom") {
		return nil
	}
	b.mu.Lock()
	b.n++
	if b.n == 2 {
		close(b.release)
	}
	b.mu.Unlock()
	select {
	case <-b.release:
	case <-time.After(10 * time.Second): // the other call never came: the test fails on its error
	}
	return nil
}

// Two queues whose pulls trip a fail-closed filter at the same time publish one
// plugin.failed on NATS, wired as the daemon wires it (the WASM compiler's OnFault to
// Publisher.Plugin).
func TestConcurrentFilterFaultsPublishOnePluginFailed(t *testing.T) {
	out := filepath.Join(t.TempDir(), "badguest.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, "../plugins/testdata/badguest")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	o, err := cmd.CombinedOutput()
	require.NoError(t, err, string(o))
	wasm, err := os.ReadFile(out)
	require.NoError(t, err)

	ctx := context.Background()
	barrier := &panicBarrier{release: make(chan struct{})}
	rt, err := runtime.New(ctx, runtime.Options{Logger: slog.New(barrier)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rt.Close(ctx)) })
	st, err := plugins.NewDirStore(t.TempDir())
	require.NoError(t, err)
	reg, err := plugins.NewRegistry(ctx, rt, st, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, reg.Close(ctx)) })
	sum := sha256.Sum256(wasm)
	m := &plugins.Manifest{Name: "trapper", Kind: plugins.KindFilter, Version: "1.0.0", ABI: plugins.ABIVersion,
		Limits: plugins.Limits{MemoryPages: 128, MaxInstances: 2}, Policy: plugins.FaultPolicy{OnFault: plugins.OnFaultFailClosed},
		Parameters: map[string]string{"mode": "trap"}, SHA256: hex.EncodeToString(sum[:])}
	require.NoError(t, reg.Deploy(ctx, m, wasm))
	require.NoError(t, reg.Activate(ctx, m.Name, m.Version))

	n := openEmbedded(t, nil)
	b := newBroker(t, nil)
	events := subscribeEvents(t, n.ListenURL())
	p := startPublisher(t, n, b, nil)
	filters := filter.NewRegistry(0)
	filters.Register(filter.TypeWasm, wasmfilter.Compiler(reg, wasmfilter.Options{OnFault: func(f wasmfilter.Fault) {
		p.Plugin(PluginEvent{Type: EventPluginFailed, Name: f.Name, Version: f.Version, Kind: string(plugins.KindFilter), Reason: f.Err.Error()})
	}}))
	f, err := filters.Filter(ctx, filter.Subscription{Group: "g", Topic: "orders", ExpressionType: "WASM", Expression: "trapper"})
	require.NoError(t, err)

	errs := make(chan error, 2)
	for q := range int32(2) {
		msg := &protocol.MessageExt{QueueID: q, StoreTimestamp: 1700000000000}
		msg.Topic, msg.Body, msg.Properties = "orders", []byte("boom"), map[string]string{protocol.PropertyTags: "boom"}
		stored, err := protocol.AppendStored(nil, msg)
		require.NoError(t, err)
		go func() {
			errs <- f.Match.MatchBatch(ctx, []store.Candidate{{Topic: "orders", QueueID: q, Stored: stored}}, make([]bool, 1))
		}()
	}
	for range 2 {
		err := <-errs
		require.ErrorIs(t, err, runtime.ErrTrap, "both pulls faulted")
		require.ErrorIs(t, err, runtime.ErrPolicyClosed)
	}
	// An event published after both faults were handled: once it is in, so is anything the
	// faults published before it.
	p.Plugin(PluginEvent{Type: EventPluginRemoved, Name: "marker"})
	events.wait(t, "flowd.evt.local.plugin.removed", func(d EventData) bool { return d.Plugin == "marker" })
	var failed []EventData
	for _, msg := range events.all() {
		if msg.Subject == "flowd.evt.local.plugin.failed" {
			var d EventData
			require.NoError(t, jsonUnmarshal(msg.Data, &d))
			failed = append(failed, d)
		}
	}
	require.Len(t, failed, 1, "one stop, one plugin.failed")
	assert.Equal(t, "trapper", failed[0].Plugin)
	assert.Equal(t, "1.0.0", failed[0].PluginVersion)
	assert.NotContains(t, failed[0].Reason, "\n", "the reason is one line")
	assert.Contains(t, failed[0].Reason, "guest trapped")
}
