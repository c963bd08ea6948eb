package plugins

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/runtime"
)

// badRegistry deploys and activates the misbehaving guest as the filter "bad" 1.0.0 with
// mode and policy, in a registry of its own.
func badRegistry(t *testing.T, mode, onFault string, edit func(*Manifest)) *Registry {
	t.Helper()
	ctx := context.Background()
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	reg, err := NewRegistry(ctx, newRuntime(t), store, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close(ctx) })
	wasm := goGuest(t, badGuestPkg)
	m := manifest("bad", KindFilter, wasm, map[string]string{"mode": mode})
	m.Policy.OnFault = onFault
	if edit != nil {
		edit(m)
	}
	require.NoError(t, reg.Deploy(ctx, m, wasm))
	require.NoError(t, reg.Activate(ctx, m.Name, m.Version))
	return reg
}

func statsOf(t *testing.T, reg *Registry, name string) PluginStats {
	t.Helper()
	for _, s := range reg.Stats() {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no stats for %s in %v", name, reg.Stats())
	return PluginStats{}
}

// Bad output and guest error codes are faults like a trap: counted under their kind in the
// module's stats, and under fail_closed they stop the module, which its state says.
func TestABIFaultsAreCountedAndStopTheModule(t *testing.T) {
	for mode, kind := range map[string]runtime.FaultKind{
		"pointer": runtime.FaultBadOutput,  // bitmap outside memory
		"bitmap":  runtime.FaultBadOutput,  // bits past the batch
		"code":    runtime.FaultGuestError, // an error code
	} {
		t.Run(mode, func(t *testing.T) {
			reg := badRegistry(t, mode, OnFaultFailClosed, nil)
			f, err := reg.Filter("bad")
			require.NoError(t, err)
			keep := make([]bool, 3)
			err = f.Match(context.Background(), boom, keep)
			require.ErrorIs(t, err, runtime.ErrPolicyClosed)
			var fe *runtime.FaultError
			require.ErrorAs(t, err, &fe)
			require.Equal(t, kind, fe.Kind)
			require.True(t, fe.Stopped)

			st := statsOf(t, reg, "bad")
			require.Equal(t, runtime.StateFailedClosed, st.State, "the module says it stopped")
			require.Equal(t, uint64(1), st.Faults[kind])
			require.Equal(t, uint64(1), st.FaultsTotal())
			require.ErrorIs(t, f.Match(context.Background(), calm, keep), runtime.ErrPolicyClosed)
		})
	}
}

// Under reload a guest error replaces the instance: the next call runs on a fresh one,
// not on the instance whose state the fault left behind.
func TestReloadAfterAGuestErrorGivesAFreshInstance(t *testing.T) {
	reg := badRegistry(t, "poison", OnFaultReload, nil)
	f, err := reg.Filter("bad")
	require.NoError(t, err)
	ctx := context.Background()
	keep := make([]bool, 3)
	require.NoError(t, f.Match(ctx, calm, keep))
	require.Equal(t, []bool{true, true, true}, keep)

	err = f.Match(ctx, boom, keep)
	require.ErrorIs(t, err, ErrGuest)
	requireAction(t, err, runtime.ActionReloaded)

	require.NoError(t, f.Match(ctx, calm, keep))
	require.Equal(t, []bool{true, true, true}, keep, "a fresh instance, not the poisoned one")
	st := statsOf(t, reg, "bad")
	require.Equal(t, runtime.StateActive, st.State)
	require.Equal(t, uint64(1), st.Reloads)
	require.Equal(t, uint64(1), st.Faults[runtime.FaultGuestError])
}

// Traps and ABI faults spend one restart budget: two faults of different kinds use up a
// budget of two, and the third fails the plugin closed.
func TestTrapsAndABIFaultsShareOneBudget(t *testing.T) {
	reg := badRegistry(t, "code", OnFaultReload, func(m *Manifest) {
		m.Policy.RestartBudget = 2
		m.Policy.RestartWindow = Duration(time.Hour)
	})
	f, err := reg.Filter("bad")
	require.NoError(t, err)
	ctx := context.Background()
	keep := make([]bool, 3)
	err = f.Match(ctx, []Message{{Topic: "panic"}}, keep)
	require.ErrorIs(t, err, runtime.ErrTrap)
	requireAction(t, err, runtime.ActionReloaded)
	err = f.Match(ctx, boom, keep)
	require.ErrorIs(t, err, ErrGuest)
	requireAction(t, err, runtime.ActionReloaded)

	err = f.Match(ctx, boom, keep)
	requireAction(t, err, runtime.ActionFailedClosed)
	require.ErrorIs(t, f.Match(ctx, calm, keep), runtime.ErrPolicyClosed)
	st := statsOf(t, reg, "bad")
	require.Equal(t, runtime.StateFailedClosed, st.State)
	require.Equal(t, uint64(2), st.Reloads)
	require.Equal(t, uint64(1), st.Faults[runtime.FaultTrap])
	require.Equal(t, uint64(2), st.Faults[runtime.FaultGuestError])
}

// Activate succeeds once the new version is swapped in, whatever the old one still runs: a
// call in flight on the old version finishes there, in the background, and Close waits for
// it.
func TestActivateDoesNotWaitForCallsInFlight(t *testing.T) {
	ctx := context.Background()
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	reg, err := NewRegistry(ctx, newRuntime(t), store, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close(ctx) })
	wasm := goGuest(t, badGuestPkg)
	v1 := manifest("slow", KindFilter, wasm, map[string]string{"mode": "loop"})
	// The loop ends when its caller gives up or at the ceiling, twice the activation's
	// deadline below: the test ends it.
	v1.Limits.CallTimeout = Duration(MaxCallTimeout)
	v2 := manifest("slow", KindFilter, wasm, map[string]string{"mode": "pointer"})
	v2.Version = "2.0.0"
	require.NoError(t, reg.Deploy(ctx, v1, wasm))
	require.NoError(t, reg.Deploy(ctx, v2, wasm))
	require.NoError(t, reg.Activate(ctx, "slow", v1.Version))
	f, err := reg.Filter("slow")
	require.NoError(t, err)

	callCtx, stopCall := context.WithCancel(ctx)
	defer stopCall()
	inFlight := make(chan error, 1)
	go func() { inFlight <- f.Match(callCtx, boom, make([]bool, 3)) }()
	require.Eventually(t, func() bool { return statsOf(t, reg, "slow").Borrowed == 1 }, testTimeout, pollInterval)

	// The caller's deadline is far shorter than the call in flight.
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, reg.Activate(actx, "slow", v2.Version))
	require.Equal(t, "2.0.0", reg.ActiveVersion("slow"))
	require.Equal(t, "2.0.0", reg.ActiveManifest("slow").Version)
	keep := make([]bool, 3)
	require.NoError(t, f.Match(ctx, calm, keep), "new calls run on the new version")
	require.Equal(t, []bool{true, true, true}, keep)
	select {
	case err := <-inFlight:
		t.Fatalf("the call in flight ended: %v", err)
	default:
	}

	// Shutdown waits for the old version's call.
	cctx, ccancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer ccancel()
	require.ErrorIs(t, reg.Close(cctx), context.DeadlineExceeded, "Close waits for the version still draining")
	stopCall()
	err = <-inFlight
	require.ErrorIs(t, err, context.Canceled)
	var fe *runtime.FaultError
	require.False(t, errors.As(err, &fe), "a call its caller stopped is no fault")
	require.NoError(t, reg.Close(ctx))
}
