package runtime

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCallFaults(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t, nil)
	goWasm := goGuestWasm(t)
	tests := []struct {
		name   string
		spec   Spec
		export string
		args   []uint64
		want   error
		stat   func(Stats) uint64
	}{
		{name: "unreachable", spec: Spec{Wasm: cModule(1)}, export: "trap", want: ErrTrap, stat: func(s Stats) uint64 { return s.Faults[FaultTrap] }},
		{name: "Go panic", spec: Spec{Wasm: goWasm}, export: "boom", want: ErrTrap, stat: func(s Stats) uint64 { return s.Faults[FaultTrap] }},
		{name: "loop past the time limit", spec: Spec{Wasm: cModule(1), CallTimeout: 50 * time.Millisecond}, export: "loop",
			want: ErrTimeout, stat: func(s Stats) uint64 { return s.Faults[FaultTimeout] }},
		{name: "Go loop past the time limit", spec: Spec{Wasm: goWasm, CallTimeout: 50 * time.Millisecond}, export: "spin", args: []uint64{1},
			want: ErrTimeout, stat: func(s Stats) uint64 { return s.Faults[FaultTimeout] }},
		{name: "growth past the memory cap", spec: Spec{Wasm: cModule(1), MemoryLimitPages: 4}, export: "grow_or_die", args: []uint64{8},
			want: ErrMemory, stat: func(s Stats) uint64 { return s.Faults[FaultMemory] }},
		{name: "Go allocation past the memory cap", spec: Spec{Wasm: goWasm, MemoryLimitPages: 128}, export: "hog", args: []uint64{64},
			want: ErrMemory, stat: func(s Stats) uint64 { return s.Faults[FaultMemory] }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.spec.Name = "faulty"
			tt.spec.Policy = PolicyReload
			tt.spec.MaxInstances = 1
			m, err := rt.Load(ctx, tt.spec)
			require.NoError(t, err)
			defer m.Close(ctx)
			args := append(tt.args, 0)
			_, err = call(ctx, m, tt.export, args...)
			require.ErrorIs(t, err, tt.want)
			var fe *FaultError
			require.ErrorAs(t, err, &fe)
			require.Equal(t, tt.export, fe.Function)
			require.Equal(t, ActionReloaded, fe.Action)
			st := m.Stats()
			require.Equal(t, uint64(1), tt.stat(st))
			require.Equal(t, 0, st.Instances, "the faulted instance was discarded")
			require.Equal(t, uint64(1), st.Calls)
			require.Positive(t, st.CallTime, "a faulted call's time counts too")
			// The module keeps serving on a fresh instance.
			inst, err := m.Borrow(ctx)
			require.NoError(t, err)
			require.NotNil(t, inst.Function(tt.export))
			inst.Release()
			require.Equal(t, 1, m.Stats().Instances)
		})
	}
}

func TestMemoryRefusedWithoutTrapIsNoFault(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t, nil)
	m, err := rt.Load(ctx, Spec{Name: "grow", Wasm: cModule(1), MemoryLimitPages: 4})
	require.NoError(t, err)
	st, err := call(ctx, m, "grow", 8)
	require.NoError(t, err)
	require.Equal(t, uint32(0xffffffff), uint32(st[0]), "memory.grow past the cap returns -1")
	st, err = call(ctx, m, "grow", 3)
	require.NoError(t, err)
	require.Equal(t, uint64(1), st[0], "growth up to the cap is allowed")
	require.Zero(t, m.Stats().Faults[FaultMemory])
}

func TestTimeoutLeavesOtherInstancesWorking(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t, nil)
	m, err := rt.Load(ctx, Spec{Name: "loop", Wasm: cModule(1), MaxInstances: 2, CallTimeout: 300 * time.Millisecond, Policy: PolicyReload})
	require.NoError(t, err)
	defer m.Close(ctx)

	looping := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- m.Do(ctx, func(inst *Instance) error {
			close(looping)
			return inst.Call(ctx, inst.Function("loop"), nil)
		})
	}()
	<-looping
	calls := 0
	for {
		st, err := call(ctx, m, "add", 2, 3)
		require.NoError(t, err)
		require.Equal(t, uint64(5), st[0])
		calls++
		select {
		case err := <-done:
			require.ErrorIs(t, err, ErrTimeout)
			require.Positive(t, calls)
			require.Equal(t, uint64(1), m.Stats().Faults[FaultTimeout])
			return
		default:
		}
	}
}

func TestCallerCancelIsNotAFault(t *testing.T) {
	rt := newRuntime(t, nil)
	m, err := rt.Load(context.Background(), Spec{Name: "loop", Wasm: cModule(1), CallTimeout: MaxCallTimeout})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	err = m.Do(ctx, func(inst *Instance) error {
		go cancel()
		return inst.Call(ctx, inst.Function("loop"), nil)
	})
	require.ErrorIs(t, err, context.Canceled)
	var fe *FaultError
	require.False(t, errors.As(err, &fe))
	st := m.Stats()
	require.Zero(t, st.Faults[FaultTimeout]+st.Faults[FaultTrap])
	require.Equal(t, StateActive, st.State)
	require.Equal(t, 0, st.Instances, "the stopped instance was discarded")
}

func TestPolicy(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t, nil)
	tests := []struct {
		name    string
		policy  Policy
		faults  []error // what each successive trapping call returns, beyond ErrTrap
		actions []Action
		borrow  error // what a borrow returns after the last fault (nil: serves)
		state   State
	}{
		{name: "fail open", policy: PolicyFailOpen, faults: []error{ErrPolicyOpen}, actions: []Action{ActionFailedOpen},
			borrow: ErrPolicyOpen, state: StateFailedOpen},
		{name: "fail closed", policy: PolicyFailClosed, faults: []error{ErrPolicyClosed}, actions: []Action{ActionFailedClosed},
			borrow: ErrPolicyClosed, state: StateFailedClosed},
		{name: "reload within budget", policy: PolicyReload, faults: []error{ErrTrap, ErrTrap},
			actions: []Action{ActionReloaded, ActionReloaded}, state: StateActive},
		{name: "reload past budget", policy: PolicyReload, faults: []error{ErrTrap, ErrTrap, ErrPolicyClosed},
			actions: []Action{ActionReloaded, ActionReloaded, ActionFailedClosed}, borrow: ErrPolicyClosed, state: StateFailedClosed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := rt.Load(ctx, Spec{Name: "p", Wasm: cModule(1), Policy: tt.policy, RestartBudget: 2, RestartWindow: time.Hour, MaxInstances: 2})
			require.NoError(t, err)
			defer m.Close(ctx)
			for i, want := range tt.faults {
				_, err := call(ctx, m, "trap")
				require.ErrorIs(t, err, ErrTrap)
				require.ErrorIs(t, err, want)
				var fe *FaultError
				require.ErrorAs(t, err, &fe)
				require.Equal(t, tt.actions[i], fe.Action)
			}
			_, err = call(ctx, m, "add", 1, 1)
			if tt.borrow == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tt.borrow)
			}
			st := m.Stats()
			require.Equal(t, tt.state, st.State)
			require.Equal(t, uint64(len(tt.faults)), st.Faults[FaultTrap])
		})
	}
}

func TestPoolBound(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t, nil)
	m, err := rt.Load(ctx, Spec{Name: "pool", Wasm: cModule(1), MaxInstances: 2})
	require.NoError(t, err)
	defer m.Close(ctx)
	a, err := m.Borrow(ctx)
	require.NoError(t, err)
	b, err := m.Borrow(ctx)
	require.NoError(t, err)
	require.NotSame(t, a, b)
	require.Equal(t, 2, m.Stats().Instances)

	t.Run("context cancels the waiting borrower", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		got := make(chan error, 1)
		go func() {
			inst, err := m.Borrow(cctx)
			if inst != nil {
				inst.Release()
			}
			got <- err
		}()
		select {
		case err := <-got:
			t.Fatalf("the third borrower did not wait: %v", err)
		default:
		}
		cancel()
		require.ErrorIs(t, <-got, context.Canceled)
	})
	t.Run("a release hands the instance to the waiting borrower", func(t *testing.T) {
		got := make(chan *Instance, 1)
		go func() {
			inst, err := m.Borrow(ctx)
			if err != nil {
				inst = nil
			}
			got <- inst
		}()
		a.Release()
		inst := <-got
		require.Same(t, a, inst, "an idle instance is reused")
		inst.Release()
		b.Release()
		require.Equal(t, 2, m.Stats().Instances, "no instance past the bound")
	})
}

func TestGuestOutputIsLoggedAndRateLimited(t *testing.T) {
	ctx := context.Background()
	sink := &logSink{}
	rt := newRuntime(t, slog.New(sink))
	m, err := rt.Load(ctx, Spec{Name: "chatty", Version: "v3", Wasm: goGuestWasm(t), LogLines: 5, LogInterval: time.Hour})
	require.NoError(t, err)
	_, err = call(ctx, m, "say", 12)
	require.NoError(t, err)
	require.NoError(t, m.Close(ctx)) // flushes the partial stderr line, which is dropped too
	lines := sink.lines("wasm guest output")
	require.Len(t, lines, 5)
	for i, l := range lines {
		require.Equal(t, "chatty", l["module"])
		require.Equal(t, "v3", l["version"])
		require.Equal(t, "stdout", l["stream"])
		require.Equal(t, "line "+string(rune('0'+i)), l["line"])
	}
	require.Equal(t, uint64(12+1-5), m.Stats().LogLinesDropped)
}

func TestSandbox(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t, nil)
	m, err := rt.Load(ctx, Spec{Name: "sandbox", Wasm: goGuestWasm(t)})
	require.NoError(t, err)
	st, err := call(ctx, m, "now")
	require.NoError(t, err)
	require.Equal(t, uint64(sandboxEpoch), st[0], "the guest sees the fixed wall clock")
	st, err = call(ctx, m, "files")
	require.NoError(t, err)
	require.Zero(t, st[0], "the guest cannot open host files")

	first, err := call(ctx, m, "random")
	require.NoError(t, err)
	other, err := rt.Load(ctx, Spec{Name: "sandbox", Wasm: goGuestWasm(t)})
	require.NoError(t, err)
	second, err := call(ctx, other, "random")
	require.NoError(t, err)
	require.Equal(t, first[0], second[0], "randomness is deterministic: a fresh instance draws the same bytes")
}

func TestCloseDrainsBorrowedInstances(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t, nil)
	m, err := rt.Load(ctx, Spec{Name: "drain", Wasm: cModule(1), MaxInstances: 2})
	require.NoError(t, err)
	inst, err := m.Borrow(ctx)
	require.NoError(t, err)

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, m.Close(cctx), context.Canceled, "Close waits for the borrowed instance")
	_, err = m.Borrow(ctx)
	require.ErrorIs(t, err, ErrClosed)
	// The borrowed instance still works until released.
	st := []uint64{3, 4}
	require.NoError(t, inst.Call(ctx, inst.Function("add"), st))
	require.Equal(t, uint64(7), st[0])
	inst.Release()
	<-m.Drained()
	require.NoError(t, m.Close(ctx))
	require.Equal(t, 0, m.Stats().Instances)
}

func TestWaitingBorrowerWokenByClose(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t, nil)
	m, err := rt.Load(ctx, Spec{Name: "wake", Wasm: cModule(1), MaxInstances: 1})
	require.NoError(t, err)
	inst, err := m.Borrow(ctx)
	require.NoError(t, err)
	got := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		_, err := m.Borrow(ctx)
		got <- err
	})
	closed := make(chan error, 1)
	go func() { closed <- m.Close(ctx) }()
	require.ErrorIs(t, <-got, ErrClosed)
	inst.Release()
	require.NoError(t, <-closed)
	wg.Wait()
}

func TestInitRunsOnEveryInstance(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t, nil)
	var inits atomic.Int32
	m, err := rt.Load(ctx, Spec{Name: "init", Wasm: cModule(1), MaxInstances: 2,
		Init: func(ctx context.Context, inst *Instance) error {
			inst.SetData(inits.Add(1))
			return nil
		}})
	require.NoError(t, err)
	require.Equal(t, int32(1), inits.Load(), "the first instance is made at load")
	a, err := m.Borrow(ctx)
	require.NoError(t, err)
	b, err := m.Borrow(ctx)
	require.NoError(t, err)
	require.Equal(t, int32(2), inits.Load(), "the second is made when first needed")
	require.ElementsMatch(t, []any{int32(1), int32(2)}, []any{a.Data(), b.Data()})
	a.Release()
	b.Release()
}

func TestClosedRuntimeRefusesLoads(t *testing.T) {
	ctx := context.Background()
	rt, err := New(ctx, Options{})
	require.NoError(t, err)
	m, err := rt.Load(ctx, Spec{Name: "x", Wasm: cModule(1)})
	require.NoError(t, err)
	require.NoError(t, rt.Close(ctx))
	require.Equal(t, StateClosed, m.State(), "closing the runtime closes its modules")
	_, err = rt.Load(ctx, Spec{Name: "x", Wasm: cModule(1)})
	require.ErrorIs(t, err, ErrClosed)
}

// OnCall sees every call with the module's name, a duration and the call's outcome, and
// costs the call no allocation.
func TestOnCallObservesEveryCall(t *testing.T) {
	ctx := context.Background()
	type obs struct {
		module string
		d      time.Duration
		err    error
	}
	var mu sync.Mutex
	var seen []obs
	rt, err := New(ctx, Options{CacheDir: sharedCacheDir(t), OnCall: func(module string, d time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, obs{module, d, err})
	}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rt.Close(ctx)) })
	m, err := rt.Load(ctx, Spec{Name: "observed", Wasm: cModule(1), MaxInstances: 1, Policy: PolicyReload})
	require.NoError(t, err)
	defer m.Close(ctx)
	mu.Lock()
	seen = nil // the load's own calls (ABI version) are not this test's
	mu.Unlock()

	out, err := call(ctx, m, "add", 2, 3)
	require.NoError(t, err)
	require.EqualValues(t, 5, out[0])
	_, err = call(ctx, m, "trap")
	require.ErrorIs(t, err, ErrTrap)
	mu.Lock()
	require.Len(t, seen, 2)
	require.Equal(t, "observed", seen[0].module)
	require.NoError(t, seen[0].err)
	require.Positive(t, seen[0].d)
	require.ErrorIs(t, seen[1].err, ErrTrap)
	seen = make([]obs, 0, 128) // room, so the observer itself does not allocate below
	mu.Unlock()

	// What a call allocates (the time limit's context and wazero's watch of it), with and
	// without the observer: the observer adds nothing.
	allocs := func(m *Module) float64 {
		inst, err := m.Borrow(ctx)
		require.NoError(t, err)
		defer inst.Release()
		fn := inst.Function("add")
		stack := []uint64{1, 2}
		return testing.AllocsPerRun(50, func() {
			stack[0], stack[1] = 1, 2
			_ = inst.Call(ctx, fn, stack)
		})
	}
	plain, err := newRuntime(t, nil).Load(ctx, Spec{Name: "plain", Wasm: cModule(1), MaxInstances: 1})
	require.NoError(t, err)
	defer plain.Close(ctx)
	require.Equal(t, allocs(plain), allocs(m))
}
