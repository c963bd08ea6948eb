package plugins

import (
	"context"
	"os"
	"os/exec"
	goruntime "runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/runtime"
)

// isolatedEnv names the test a child test process runs for isolated.
const isolatedEnv = "FLOWD_PLUGINS_ISOLATED"

// isolated runs body in a child process of the test binary (sharing this one's guest builds
// and compilation cache), and fails if that process does not finish within limit: a guest
// that cannot be stopped stalls every goroutine at the next stop-the-world pause, the test's
// own timers included, so only another process can tell.
func isolated(t *testing.T, limit time.Duration, pkgs []string, body func(t *testing.T)) {
	t.Helper()
	if os.Getenv(isolatedEnv) == t.Name() {
		body(t)
		return
	}
	for _, pkg := range pkgs {
		goGuest(t, pkg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), isolatedEnv+"="+t.Name(), buildDirEnv+"="+buildDir(t))
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("the test process stalled: no end within %v (a guest call that cannot be stopped?)\n%s", limit, out)
	}
	require.NoError(t, err, "%s", out)
}

// A filter that loops forever on real messages, deployed with the default limits (no
// call_timeout), is stopped at the filter's default limit and fails by its policy; while it
// loops, garbage collections complete and another plugin serves.
func TestFilterLoopWithDefaultLimitsIsStopped(t *testing.T) {
	isolated(t, time.Minute, []string{badGuestPkg, "./testdata/tagfilter"}, func(t *testing.T) {
		f := NewFilter(badSlot(t, KindFilter, "loop", OnFaultFailClosed, nil))
		tagsWasm := goGuest(t, "./testdata/tagfilter")
		tags := NewFilter(load(t, newRuntime(t), manifest("tags", KindFilter, tagsWasm, nil), tagsWasm))
		ctx := context.Background()
		start := time.Now()
		done := make(chan error, 1)
		keep := make([]bool, len(boom))
		go func() { done <- f.Match(ctx, boom, keep) }()
		paid := []Message{{Topic: "t", Tags: "paid"}}
		for loop := true; loop; {
			select {
			case err := <-done:
				require.ErrorIs(t, err, runtime.ErrTimeout)
				require.ErrorIs(t, err, runtime.ErrPolicyClosed)
				loop = false
			default:
				goruntime.GC() // waits for every goroutine, the looping one's too
				other := []bool{false}
				require.NoError(t, tags.Match(ctx, paid, other), "another plugin serves while one loops")
				require.True(t, other[0])
			}
		}
		require.GreaterOrEqual(t, time.Since(start), DefaultFilterTimeout)
		require.Equal(t, []bool{false, false, false}, keep, "fail closed delivers nothing")
	})
}

// Deploying a plugin whose self-test loops forever fails within the self-test's limit, for
// every kind, with no limit in the manifest; the registry then deploys the next plugin and
// closes.
func TestDeployOfLoopingSelfTestFailsInTime(t *testing.T) {
	isolated(t, 2*time.Minute, []string{badGuestPkg, "./testdata/tagfilter"}, func(t *testing.T) {
		ctx := context.Background()
		store, err := NewDirStore(t.TempDir())
		require.NoError(t, err)
		reg, err := NewRegistry(ctx, newRuntime(t), store, nil)
		require.NoError(t, err)
		wasm := goGuest(t, badGuestPkg)
		// Compiled once beforehand, so that only the self-test is timed below.
		require.NoError(t, reg.Deploy(ctx, manifest("calm", KindFilter, wasm, nil), wasm))
		for _, kind := range []Kind{KindFilter, KindAllocator, KindTransform} {
			m := manifest("spin-"+string(kind), kind, wasm, map[string]string{"mode": "spin"})
			m.Limits = Limits{}
			start := time.Now()
			err := reg.Deploy(ctx, m, wasm)
			require.ErrorIs(t, err, runtime.ErrSelfTest, "%s", kind)
			require.ErrorIs(t, err, runtime.ErrTimeout, "%s", kind)
			require.Less(t, time.Since(start), SelfTestTimeout+5*time.Second, "%s: bounded by the self-test limit", kind)
			_, err = reg.Get(ctx, m.Name, m.Version)
			require.ErrorIs(t, err, ErrNotFound, "%s: a version that fails its self-test is not stored", kind)
		}
		tags := goGuest(t, "./testdata/tagfilter")
		require.NoError(t, reg.Deploy(ctx, manifest("tags", KindFilter, tags, nil), tags), "the next deploy goes through")
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		require.NoError(t, reg.Close(cctx))
	})
}

func TestManifestTimeLimits(t *testing.T) {
	wasm := []byte("\x00asm\x01\x00\x00\x00")
	for kind, want := range map[Kind]time.Duration{
		KindFilter:    DefaultFilterTimeout,
		KindAllocator: DefaultAllocatorTimeout,
		KindTransform: DefaultTransformTimeout,
	} {
		m := manifest("limits", kind, wasm, nil)
		require.NoError(t, m.Validate())
		s := m.Spec(wasm)
		require.Equal(t, want, s.CallTimeout, "%s: the kind's default without call_timeout", kind)
		require.Equal(t, SelfTestTimeout, s.StartTimeout, "%s", kind)
		m.Limits.CallTimeout = Duration(250 * time.Millisecond)
		require.Equal(t, 250*time.Millisecond, m.Spec(wasm).CallTimeout, "%s: the manifest's limit", kind)
	}

	m := manifest("greedy", KindFilter, wasm, nil)
	m.Limits.CallTimeout = Duration(MaxCallTimeout)
	require.NoError(t, m.Validate(), "the ceiling itself is allowed")
	m.Limits.CallTimeout = Duration(MaxCallTimeout + time.Millisecond)
	err := m.Validate()
	require.ErrorIs(t, err, ErrManifest)
	require.ErrorContains(t, err, "limits.call_timeout")
	require.ErrorContains(t, err, "ceiling of "+MaxCallTimeout.String())
}
