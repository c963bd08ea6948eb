package wasmfilter_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/netip"
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

// wait bounds what happens at once on a healthy machine.
const wait = 15 * time.Second

func newRegistry(t testing.TB) *plugins.Registry {
	t.Helper()
	rt, err := runtime.New(context.Background(), runtime.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rt.Close(context.Background())) })
	return newRegistryOn(t, rt)
}

// newRegistryOn is a registry on rt, whose compilation cache it shares.
func newRegistryOn(t testing.TB, rt *runtime.Runtime) *plugins.Registry {
	t.Helper()
	ctx := context.Background()
	st, err := plugins.NewDirStore(filepath.Join(t.TempDir(), "plugins"))
	require.NoError(t, err)
	reg, err := plugins.NewRegistry(ctx, rt, st, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, reg.Close(ctx)) })
	return reg
}

func propfilter(t testing.TB) []byte {
	t.Helper()
	wasm, err := os.ReadFile("../../examples/wasm/c-propfilter/propfilter.wasm")
	require.NoError(t, err)
	return wasm
}

func deploy(t testing.TB, reg *plugins.Registry, m plugins.Manifest, wasm []byte, activate bool) {
	t.Helper()
	sum := sha256.Sum256(wasm)
	m.Kind, m.ABI, m.SHA256 = plugins.KindFilter, plugins.ABIVersion, hex.EncodeToString(sum[:])
	require.NoError(t, reg.Deploy(context.Background(), &m, wasm))
	if activate {
		require.NoError(t, reg.Activate(context.Background(), m.Name, m.Version))
	}
}

// candidate is a stored message as the store hands it to a filter.
func candidate(t testing.TB, qoff int64, region string) store.Candidate {
	t.Helper()
	m := &protocol.MessageExt{QueueID: 1, QueueOffset: qoff, StoreTimestamp: 1700000000000,
		BornHost: netip.MustParseAddrPort("10.0.0.1:1"), StoreHost: netip.MustParseAddrPort("10.0.0.2:10911")}
	m.Topic, m.Body, m.Properties = "orders", []byte(region+" order"), map[string]string{"region": region, protocol.PropertyTags: "boom"}
	b, err := protocol.AppendStored(nil, m)
	require.NoError(t, err)
	return store.Candidate{Topic: "orders", QueueID: 1, QueueOffset: qoff, Stored: b}
}

func match(t testing.TB, f *store.Filter, regions ...string) ([]bool, error) {
	t.Helper()
	cands := make([]store.Candidate, len(regions))
	for i, r := range regions {
		cands[i] = candidate(t, int64(i), r)
	}
	keep := make([]bool, len(cands))
	return keep, f.Match.MatchBatch(context.Background(), cands, keep)
}

func TestParseExpression(t *testing.T) {
	for expr, want := range map[string]wasmfilter.Expression{
		"region":           {Name: "region"},
		" region@1.2.0 ":   {Name: "region", Version: "1.2.0"},
		"big-orders@2.0.0": {Name: "big-orders", Version: "2.0.0"},
	} {
		got, err := wasmfilter.ParseExpression(expr)
		require.NoError(t, err, expr)
		assert.Equal(t, want, got, expr)
	}
	for _, expr := range []string{"", "@1.0.0", "region@"} {
		_, err := wasmfilter.ParseExpression(expr)
		assert.Error(t, err, expr)
	}
	_, err := wasmfilter.ParseExpression("region@1.0.0?value=us")
	assert.ErrorIs(t, err, wasmfilter.ErrParameters)
}

// Subscriptions the compiler refuses fail in the registry, so the pull is answered
// SUBSCRIPTION_PARSE_FAILED with the error naming the filter.
func TestUnknownFiltersAndParametersAreRefused(t *testing.T) {
	reg := newRegistry(t)
	deploy(t, reg, plugins.Manifest{Name: "region", Version: "1.0.0", Parameters: map[string]string{"property": "region", "value": "eu"}}, propfilter(t), false)
	filters := filter.NewRegistry(0)
	filters.Register(filter.TypeWasm, wasmfilter.Compiler(reg, wasmfilter.Options{}))
	ctx := context.Background()
	sub := func(expr string) filter.Subscription {
		return filter.Subscription{Group: "g", Topic: "orders", ExpressionType: "WASM", Expression: expr}
	}
	_, err := filters.Filter(ctx, sub("nosuch"))
	require.ErrorIs(t, err, plugins.ErrNotFound)
	assert.ErrorContains(t, err, `"nosuch"`)
	_, err = filters.Filter(ctx, sub("region"))
	assert.ErrorIs(t, err, wasmfilter.ErrNotActive, "deployed, not active")

	require.NoError(t, reg.Activate(ctx, "region", "1.0.0"))
	_, err = filters.Filter(ctx, sub("region?value=us"))
	assert.ErrorIs(t, err, wasmfilter.ErrParameters)
	_, err = filters.Filter(ctx, sub("region@2.0.0"))
	assert.ErrorIs(t, err, wasmfilter.ErrNotActive)
	assert.ErrorContains(t, err, "region@2.0.0")
	f, err := filters.Filter(ctx, sub("region@1.0.0"))
	require.NoError(t, err)
	keep, err := match(t, f, "eu", "us")
	require.NoError(t, err)
	assert.Equal(t, []bool{true, false}, keep)
}

// A compiled filter follows the active version: a subscription naming just the plugin sees
// the new version's verdicts at once; one pinned to the old version stops (fails closed).
func TestCompiledFilterFollowsTheActiveVersion(t *testing.T) {
	reg := newRegistry(t)
	wasm := propfilter(t)
	deploy(t, reg, plugins.Manifest{Name: "region", Version: "1.0.0", Parameters: map[string]string{"property": "region", "value": "eu"}}, wasm, true)
	filters := filter.NewRegistry(0)
	filters.Register(filter.TypeWasm, wasmfilter.Compiler(reg, wasmfilter.Options{}))
	ctx := context.Background()
	follow, err := filters.Filter(ctx, filter.Subscription{Group: "g", Topic: "orders", ExpressionType: "WASM", Expression: "region"})
	require.NoError(t, err)
	pinned, err := filters.Filter(ctx, filter.Subscription{Group: "p", Topic: "orders", ExpressionType: "WASM", Expression: "region@1.0.0"})
	require.NoError(t, err)
	keep, err := match(t, follow, "eu", "us", "eu")
	require.NoError(t, err)
	assert.Equal(t, []bool{true, false, true}, keep)

	deploy(t, reg, plugins.Manifest{Name: "region", Version: "2.0.0", Parameters: map[string]string{"property": "region", "value": "us"}}, wasm, true)
	again, err := filters.Filter(ctx, filter.Subscription{Group: "g", Topic: "orders", ExpressionType: "WASM", Expression: "region"})
	require.NoError(t, err)
	assert.Same(t, follow, again, "the cached filter is kept")
	keep, err = match(t, follow, "eu", "us", "eu")
	require.NoError(t, err)
	assert.Equal(t, []bool{false, true, false}, keep)

	assert.Equal(t, store.FailClosed, pinned.OnError)
	_, err = match(t, pinned, "eu")
	assert.ErrorIs(t, err, wasmfilter.ErrNotActive)
}

var badguest = sync.OnceValues(func() ([]byte, error) {
	dir, err := os.MkdirTemp("", "flowd-wasmfilter-test-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "badguest.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, "../testdata/badguest")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if o, err := cmd.CombinedOutput(); err != nil {
		return nil, &buildError{string(o), err}
	}
	return os.ReadFile(out)
})

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return e.err.Error() + ": " + e.out }

// The plugin's fault policy decides: fail_open delivers the batch (no error reaches the
// read path), fail_closed fails it; either way OnFault hears of the fault once.
func TestFaultPolicies(t *testing.T) {
	wasm, err := badguest()
	require.NoError(t, err)
	rt, err := runtime.New(context.Background(), runtime.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rt.Close(context.Background())) })
	for _, tc := range []struct {
		policy string
		open   bool
	}{{plugins.OnFaultFailOpen, true}, {plugins.OnFaultFailClosed, false}} {
		t.Run(tc.policy, func(t *testing.T) {
			reg := newRegistryOn(t, rt)
			deploy(t, reg, plugins.Manifest{Name: "trapper", Version: "1.0.0", Limits: plugins.Limits{MemoryPages: 128, MaxInstances: 1, CallTimeout: plugins.Duration(10 * time.Second)},
				Policy: plugins.FaultPolicy{OnFault: tc.policy}, Parameters: map[string]string{"mode": "trap"}}, wasm, true)
			var mu sync.Mutex
			var faults []wasmfilter.Fault
			filters := filter.NewRegistry(0)
			filters.Register(filter.TypeWasm, wasmfilter.Compiler(reg, wasmfilter.Options{OnFault: func(f wasmfilter.Fault) {
				mu.Lock()
				defer mu.Unlock()
				faults = append(faults, f)
			}}))
			f, err := filters.Filter(context.Background(), filter.Subscription{Group: "g", Topic: "orders", ExpressionType: "WASM", Expression: "trapper"})
			require.NoError(t, err)
			for range 2 {
				keep, err := match(t, f, "eu", "us")
				if tc.open {
					require.NoError(t, err)
					assert.Equal(t, []bool{true, true}, keep)
				} else {
					require.ErrorIs(t, err, runtime.ErrPolicyClosed)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, faults, 1, "the call that tripped the policy reports it; the stopped version does not again")
			assert.Equal(t, "trapper", faults[0].Name)
			assert.Equal(t, "1.0.0", faults[0].Version)
			assert.ErrorIs(t, faults[0].Err, runtime.ErrTrap)
		})
	}
}

// bodyCandidate is a stored message with only a body, zlib-compressed when compressed.
func bodyCandidate(t testing.TB, body string, compressed bool) store.Candidate {
	t.Helper()
	m := &protocol.MessageExt{StoreTimestamp: 1700000000000,
		BornHost: netip.MustParseAddrPort("10.0.0.1:1"), StoreHost: netip.MustParseAddrPort("10.0.0.2:10911")}
	m.Topic, m.Body = "orders", []byte(body)
	if compressed {
		b, err := protocol.CompressBody(m.Body, 6)
		require.NoError(t, err)
		m.Body, m.SysFlag = b, protocol.MsgFlagCompressed
	}
	b, err := protocol.AppendStored(nil, m)
	require.NoError(t, err)
	return store.Candidate{Topic: "orders", Stored: b}
}

// A filter that wants bodies gets them decompressed; one that does not never sees them.
// The guest traps when its input mentions "boom", which only a decompressed body does.
func TestBodiesOnlyWhenWantedAndDecompressed(t *testing.T) {
	wasm, err := badguest()
	require.NoError(t, err)
	rt, err := runtime.New(context.Background(), runtime.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rt.Close(context.Background())) })
	reg := newRegistryOn(t, rt)
	limits := plugins.Limits{MemoryPages: 128, MaxInstances: 1}
	params := map[string]string{"mode": "trap"}
	deploy(t, reg, plugins.Manifest{Name: "reader", Version: "1.0.0", Limits: limits, Parameters: params, WantsBody: true}, wasm, true)
	deploy(t, reg, plugins.Manifest{Name: "blind", Version: "1.0.0", Limits: limits, Parameters: params}, wasm, true)
	filters := filter.NewRegistry(0)
	filters.Register(filter.TypeWasm, wasmfilter.Compiler(reg, wasmfilter.Options{}))
	compile := func(name string) *store.Filter {
		f, err := filters.Filter(context.Background(), filter.Subscription{Group: name, Topic: "orders", ExpressionType: "WASM", Expression: name})
		require.NoError(t, err)
		return f
	}

	keep := make([]bool, 1)
	blind := compile("blind")
	require.NoError(t, blind.Match.MatchBatch(context.Background(), []store.Candidate{bodyCandidate(t, "boom", false)}, keep), "no body, no boom")
	assert.True(t, keep[0])

	reader := compile("reader")
	require.NoError(t, reader.Match.MatchBatch(context.Background(), []store.Candidate{bodyCandidate(t, "quiet", true)}, keep))
	assert.True(t, keep[0])
	err = reader.Match.MatchBatch(context.Background(), []store.Candidate{bodyCandidate(t, "boom boom boom", true)}, keep)
	assert.ErrorIs(t, err, runtime.ErrTrap, "the guest saw the decompressed body")
}

// gatedStore holds up Get of the plugin "slow" until release closes, as a slow disk or a
// long trial load would hold up a deploy.
type gatedStore struct {
	plugins.Store
	entered chan struct{}
	release chan struct{}
}

func (s *gatedStore) Get(ctx context.Context, name, version string) (*plugins.Manifest, []byte, error) {
	if name == "slow" {
		s.entered <- struct{}{}
		<-s.release
	}
	return s.Store.Get(ctx, name, version)
}

// A deploy in progress holds the registry, but not the read path: pulls through a
// compiled Wasm filter, and new subscriptions, go on meanwhile.
func TestDeployDoesNotHoldUpFiltering(t *testing.T) {
	ctx := context.Background()
	rt, err := runtime.New(ctx, runtime.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rt.Close(ctx)) })
	dir, err := plugins.NewDirStore(filepath.Join(t.TempDir(), "plugins"))
	require.NoError(t, err)
	st := &gatedStore{Store: dir, entered: make(chan struct{}), release: make(chan struct{})}
	reg, err := plugins.NewRegistry(ctx, rt, st, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, reg.Close(ctx)) })
	release := sync.OnceFunc(func() { close(st.release) })
	t.Cleanup(release) // before Close, should the test fail with the deploy held up
	wasm := propfilter(t)
	params := map[string]string{"property": "region", "value": "eu"}
	deploy(t, reg, plugins.Manifest{Name: "region", Version: "1.0.0", Parameters: params}, wasm, true)
	filters := filter.NewRegistry(0)
	filters.Register(filter.TypeWasm, wasmfilter.Compiler(reg, wasmfilter.Options{}))
	f, err := filters.Filter(ctx, filter.Subscription{Group: "g", Topic: "orders", ExpressionType: "WASM", Expression: "region"})
	require.NoError(t, err)

	deployed := make(chan error, 1)
	go func() {
		m := plugins.Manifest{Name: "slow", Version: "1.0.0", Kind: plugins.KindFilter, ABI: plugins.ABIVersion, Parameters: params}
		sum := sha256.Sum256(wasm)
		m.SHA256 = hex.EncodeToString(sum[:])
		deployed <- reg.Deploy(ctx, &m, wasm)
	}()
	<-st.entered // the deploy holds the registry now
	done := make(chan error, 1)
	go func() {
		keep, err := match(t, f, "eu", "us")
		if err == nil && (!keep[0] || keep[1]) {
			err = assert.AnError
		}
		if err == nil {
			_, err = filters.Filter(ctx, filter.Subscription{Group: "h", Topic: "orders", ExpressionType: "WASM", Expression: "region"})
		}
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(wait):
		t.Fatal("filtering waited for a deploy")
	}
	release()
	require.NoError(t, <-deployed)
}

// panicBarrier is a log handler that holds each guest printing its panic until two have,
// so that two calls are in the guest when the first of them faults.
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
	case <-time.After(wait): // the other call never came: the test fails on its error
	}
	return nil
}

// Two queues whose pulls fault at the same time stop the plugin once: OnFault, which the
// daemon turns into plugin.failed, is called once, though both calls faulted.
func TestConcurrentFaultsReportOneStop(t *testing.T) {
	wasm, err := badguest()
	require.NoError(t, err)
	barrier := &panicBarrier{release: make(chan struct{})}
	rt, err := runtime.New(context.Background(), runtime.Options{Logger: slog.New(barrier)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rt.Close(context.Background())) })
	reg := newRegistryOn(t, rt)
	deploy(t, reg, plugins.Manifest{Name: "trapper", Version: "1.0.0", Limits: plugins.Limits{MemoryPages: 128, MaxInstances: 2},
		Policy: plugins.FaultPolicy{OnFault: plugins.OnFaultFailClosed}, Parameters: map[string]string{"mode": "trap"}}, wasm, true)
	var mu sync.Mutex
	var faults []wasmfilter.Fault
	filters := filter.NewRegistry(0)
	filters.Register(filter.TypeWasm, wasmfilter.Compiler(reg, wasmfilter.Options{OnFault: func(f wasmfilter.Fault) {
		mu.Lock()
		defer mu.Unlock()
		faults = append(faults, f)
	}}))
	f, err := filters.Filter(context.Background(), filter.Subscription{Group: "g", Topic: "orders", ExpressionType: "WASM", Expression: "trapper"})
	require.NoError(t, err)

	errs := make(chan error, 2)
	for q := range 2 {
		go func() {
			c := candidate(t, 0, "eu")
			c.QueueID = int32(q)
			errs <- f.Match.MatchBatch(context.Background(), []store.Candidate{c}, make([]bool, 1))
		}()
	}
	for range 2 {
		err := <-errs
		require.ErrorIs(t, err, runtime.ErrTrap, "both calls faulted")
		require.ErrorIs(t, err, runtime.ErrPolicyClosed)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, faults, 1, "one stop, one report")
	assert.Equal(t, "trapper", faults[0].Name)
}
