package runtime

import (
	"context"
	"errors"
	"os"
	"os/exec"
	goruntime "runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// isolatedEnv names the test a child test process runs for isolated.
const isolatedEnv = "FLOWD_RUNTIME_ISOLATED"

// isolated runs body in a child process of the test binary, and fails if that process does
// not finish within limit. A guest that cannot be stopped stalls every goroutine at the next
// stop-the-world pause, the test's own timers included; only another process can notice.
func isolated(t *testing.T, limit time.Duration, body func(t *testing.T)) {
	t.Helper()
	if os.Getenv(isolatedEnv) == t.Name() {
		body(t)
		return
	}
	sharedCacheDir(t) // the guest is built, and compiled, once: here, not again in the child
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), isolatedEnv+"="+t.Name(), guestEnv+"="+goGuest.dir)
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("the test process stalled: no end within %v (a guest call that cannot be stopped?)\n%s", limit, out)
	}
	require.NoError(t, err, "%s", out)
}

// A Go guest that loops forever, loaded without a time limit, is stopped at the default
// limit, and while it loops the process keeps running: garbage collections complete and
// another instance of the module serves calls.
func TestRunawayGuestWithoutLimitIsStopped(t *testing.T) {
	isolated(t, time.Minute, func(t *testing.T) {
		ctx := context.Background()
		rt := newRuntime(t, nil)
		m, err := rt.Load(ctx, Spec{Name: "runaway", Wasm: goGuestWasm(t), MaxInstances: 2, Policy: PolicyReload})
		require.NoError(t, err)
		defer m.Close(ctx)

		start := time.Now()
		done := make(chan error, 1)
		go func() {
			_, err := call(ctx, m, "spin", 1)
			done <- err
		}()
		var gcs int
		for loop := true; loop; {
			select {
			case err = <-done:
				loop = false
			default:
				goruntime.GC() // stops the world: waits for every goroutine, the guest's too
				gcs++
				st, cerr := call(ctx, m, "add", 2, 3)
				require.NoError(t, cerr, "another instance serves while the guest loops")
				require.Equal(t, uint64(5), st[0])
			}
		}
		took := time.Since(start)
		require.ErrorIs(t, err, ErrTimeout)
		var fe *FaultError
		require.ErrorAs(t, err, &fe)
		require.Equal(t, "spin", fe.Function)
		require.GreaterOrEqual(t, took, DefaultCallTimeout, "stopped at the default limit, not before")
		require.Positive(t, gcs)
		require.Equal(t, uint64(1), m.Stats().Faults[FaultTimeout])
	})
}

// A self-test that never returns fails the load within the start limit; so does a module
// whose _initialize never returns. Neither needs a time limit in the spec.
func TestRunawayStartFailsTheLoad(t *testing.T) {
	isolated(t, time.Minute, func(t *testing.T) {
		ctx := context.Background()
		rt := newRuntime(t, nil)
		spin := func(ctx context.Context, inst *Instance) error {
			return inst.Call(ctx, inst.Function("spin"), []uint64{1})
		}
		warm, err := rt.Load(ctx, Spec{Name: "warm", Wasm: goGuestWasm(t)}) // compiled, so that only the start is timed
		require.NoError(t, err)
		require.NoError(t, warm.Close(ctx))
		start := time.Now()
		_, err = rt.Load(ctx, Spec{Name: "selftest", Wasm: goGuestWasm(t), SelfTest: spin, CallTimeout: MaxCallTimeout})
		require.ErrorIs(t, err, ErrSelfTest)
		require.ErrorIs(t, err, ErrTimeout)
		require.ErrorContains(t, err, DefaultStartTimeout.String())
		require.Less(t, time.Since(start), MaxCallTimeout, "the start limit ends it, not the call limit")

		looping := wmod{memPages: 1, funcs: []wfunc{{name: "_initialize", body: bodyLoop}}}.bytes()
		_, err = rt.Load(ctx, Spec{Name: "init", Wasm: looping, StartTimeout: 200 * time.Millisecond})
		require.ErrorIs(t, err, ErrTimeout)
		require.ErrorContains(t, err, "200ms")
	})
}

func TestLoadRefusesTimeLimitsPastTheCeiling(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t, nil)
	for name, spec := range map[string]Spec{
		"CallTimeout":  {CallTimeout: MaxCallTimeout + time.Millisecond},
		"StartTimeout": {StartTimeout: MaxCallTimeout + time.Millisecond},
	} {
		t.Run(name, func(t *testing.T) {
			spec.Name, spec.Wasm = "greedy", cModule(1)
			_, err := rt.Load(ctx, spec)
			require.Error(t, err)
			require.ErrorContains(t, err, name)
			require.ErrorContains(t, err, MaxCallTimeout.String())
			require.False(t, errors.Is(err, ErrTimeout))
		})
	}
}
