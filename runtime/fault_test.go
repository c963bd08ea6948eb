package runtime

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var errRefused = errors.New("result refused")

// A fault the embedder reports (bad output, a guest error code) takes the trap's path: it
// is counted under its kind, spends the one restart budget, replaces the instance and, past
// the budget, stops the module.
func TestEmbedderFaultSharesThePolicyPath(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t, nil)
	m, err := rt.Load(ctx, Spec{Name: "abi", Wasm: cModule(1), Policy: PolicyReload, RestartBudget: 2, RestartWindow: time.Hour, MaxInstances: 1})
	require.NoError(t, err)
	defer m.Close(ctx)

	refuse := func(kind FaultKind) error {
		return m.Do(ctx, func(inst *Instance) error {
			stack := []uint64{2, 3}
			require.NoError(t, inst.Call(ctx, inst.Function("add"), stack))
			return inst.Fault(ctx, kind, "add", errRefused)
		})
	}
	err = refuse(FaultBadOutput)
	require.ErrorIs(t, err, errRefused)
	var fe *FaultError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, FaultBadOutput, fe.Kind)
	require.Equal(t, ActionReloaded, fe.Action)
	st := m.Stats()
	require.Equal(t, uint64(1), st.Faults[FaultBadOutput])
	require.Equal(t, uint64(1), st.Reloads)
	require.Equal(t, 0, st.Instances, "the instance that gave bad output was discarded, not reused")

	_, err = call(ctx, m, "trap")
	require.ErrorIs(t, err, ErrTrap)
	requireAction(t, err, ActionReloaded)

	err = refuse(FaultGuestError)
	requireAction(t, err, ActionFailedClosed)
	require.ErrorIs(t, err, ErrPolicyClosed, "the third fault, whatever its kind, is past the budget of two")
	st = m.Stats()
	require.Equal(t, StateFailedClosed, st.State)
	require.Equal(t, uint64(1), st.Faults[FaultGuestError])
	require.Equal(t, uint64(1), st.Faults[FaultTrap])
	require.Equal(t, uint64(3), st.FaultsTotal())
	_, err = call(ctx, m, "add", 1, 1)
	require.ErrorIs(t, err, ErrPolicyClosed)
}

func requireAction(t *testing.T, err error, want Action) {
	t.Helper()
	var fe *FaultError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, want, fe.Action, "%v", err)
}

// Two calls faulting on a module at the same time both get the policy's verdict, but only
// one of them is the fault that stopped it: a stop is reported once.
func TestConcurrentFaultsStopTheModuleOnce(t *testing.T) {
	for _, policy := range []Policy{PolicyFailClosed, PolicyFailOpen} {
		t.Run(policy.String(), func(t *testing.T) {
			ctx := context.Background()
			m, err := newRuntime(t, nil).Load(ctx, Spec{Name: "twice", Wasm: cModule(1), Policy: policy, MaxInstances: 2})
			require.NoError(t, err)
			defer m.Close(ctx)
			// Both instances are out before either call faults, as two queues' pulls are.
			a, err := m.Borrow(ctx)
			require.NoError(t, err)
			b, err := m.Borrow(ctx)
			require.NoError(t, err)
			errs := make(chan error, 2)
			for _, inst := range []*Instance{a, b} {
				go func() {
					defer inst.Release()
					errs <- inst.Call(ctx, inst.Function("trap"), nil)
				}()
			}
			stopped := 0
			for range 2 {
				err := <-errs
				var fe *FaultError
				require.ErrorAs(t, err, &fe)
				require.NotZero(t, fe.Action)
				require.NotEqual(t, ActionReloaded, fe.Action)
				if fe.Stopped {
					stopped++
				}
			}
			require.Equal(t, 1, stopped, "exactly one fault stopped the module")
			require.Equal(t, uint64(2), m.Stats().Faults[FaultTrap])
		})
	}
}

// What a user reads of a trap is one line; wazero's stack trace goes to the debug log.
func TestFaultTextIsOneLine(t *testing.T) {
	ctx := context.Background()
	sink := &logSink{}
	m, err := newRuntime(t, slog.New(sink)).Load(ctx, Spec{Name: "trace", Wasm: cModule(1)})
	require.NoError(t, err)
	defer m.Close(ctx)
	_, err = call(ctx, m, "trap")
	require.ErrorIs(t, err, ErrTrap)
	require.NotContains(t, err.Error(), "\n")
	require.NotContains(t, err.Error(), "stack trace")
	require.Contains(t, err.Error(), "unreachable")
	require.Contains(t, err.Error(), "(failed closed)")

	var fe *FaultError
	require.ErrorAs(t, err, &fe)
	require.Contains(t, fe.Err.Error(), "wasm stack trace", "the cause itself keeps the trace")
	detail := sink.lines("wasm module fault detail")
	require.Len(t, detail, 1)
	require.Contains(t, detail[0]["err"], "wasm stack trace")
	warn := sink.lines("wasm module fault")
	require.Len(t, warn, 1)
	require.Equal(t, "trap", warn[0]["kind"])
	require.NotContains(t, warn[0]["err"], "\n")
}

// A fault while a module loads fails the load; no policy applies to a module that never
// served, so the error says nothing of reloading or failing open or closed.
func TestFaultWhileLoadingAppliesNoPolicy(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t, nil)
	for _, policy := range []Policy{PolicyReload, PolicyFailOpen, PolicyFailClosed} {
		t.Run(policy.String(), func(t *testing.T) {
			_, err := rt.Load(ctx, Spec{Name: "refused", Wasm: cModule(1), Policy: policy,
				SelfTest: func(ctx context.Context, inst *Instance) error {
					return inst.Call(ctx, inst.Function("trap"), nil)
				}})
			require.ErrorIs(t, err, ErrSelfTest)
			require.ErrorIs(t, err, ErrTrap)
			require.False(t, errors.Is(err, ErrPolicyOpen) || errors.Is(err, ErrPolicyClosed))
			for _, word := range []string{"reload", "failed open", "failed closed", "stack trace", "\n"} {
				require.False(t, strings.Contains(err.Error(), word), "%q in %q", word, err)
			}
			var fe *FaultError
			require.ErrorAs(t, err, &fe)
			require.Zero(t, fe.Action)
			require.False(t, fe.Stopped)
		})
	}
}

func TestFaultKindNames(t *testing.T) {
	var names []string
	for k := range NumFaultKinds {
		names = append(names, k.String())
	}
	require.Equal(t, []string{"trap", "timeout", "memory", "bad_output", "guest_error"}, names)
}

// A guest that traps while it starts is refused in one line too, its cause still reachable.
func TestStartTrapIsOneLine(t *testing.T) {
	sink := &logSink{}
	wasm := wmod{memPages: 1, funcs: []wfunc{{name: "_initialize", body: bodyTrap}}}.bytes()
	_, err := newRuntime(t, slog.New(sink)).Load(context.Background(), Spec{Name: "start", Wasm: wasm})
	require.Error(t, err)
	require.Contains(t, err.Error(), "unreachable")
	require.NotContains(t, err.Error(), "\n")
	traced := false
	for e := err; e != nil; e = errors.Unwrap(e) {
		traced = traced || strings.Contains(e.Error(), "wasm stack trace")
	}
	require.True(t, traced, "the wrapped cause keeps the trace")
	detail := sink.lines("wasm instantiate failed")
	require.Len(t, detail, 1)
	require.Contains(t, detail[0]["err"], "wasm stack trace")
}
