package plugins

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/consumer/allocate"
	"github.com/flowd-io/flowd/protocol"
	"github.com/flowd-io/flowd/runtime"
)

// badFilter loads the misbehaving guest as a filter with mode and policy.
func badSlot(t *testing.T, kind Kind, mode, onFault string, edit func(*Manifest)) *runtime.Slot {
	t.Helper()
	wasm := goGuest(t, badGuestPkg)
	m := manifest("bad", kind, wasm, map[string]string{"mode": mode})
	m.Policy.OnFault = onFault
	if edit != nil {
		edit(m)
	}
	return load(t, newRuntime(t), m, wasm)
}

var (
	calm = []Message{{Topic: "calm"}, {Topic: "calm"}, {Topic: "calm"}}
	boom = []Message{{Topic: "calm"}, {Topic: "boom"}, {Topic: "calm"}}
)

func requireAction(t *testing.T, err error, want runtime.Action) {
	t.Helper()
	var fe *runtime.FaultError
	require.True(t, errors.As(err, &fe), "%v is not a fault", err)
	require.Equal(t, want, fe.Action, "%v", err)
}

func TestFilterTrapFailsClosed(t *testing.T) {
	f := NewFilter(badSlot(t, KindFilter, "trap", OnFaultFailClosed, nil))
	ctx := context.Background()
	keep := make([]bool, 3)
	require.NoError(t, f.Match(ctx, calm, keep))
	require.Equal(t, []bool{true, true, true}, keep)

	err := f.Match(ctx, boom, keep)
	require.ErrorIs(t, err, runtime.ErrTrap)
	require.ErrorIs(t, err, runtime.ErrPolicyClosed)
	require.Equal(t, []bool{false, false, false}, keep, "fail closed delivers nothing")

	err = f.Match(ctx, calm, keep)
	require.ErrorIs(t, err, runtime.ErrPolicyClosed, "the module stays stopped")
	require.Equal(t, []bool{false, false, false}, keep)
}

func TestFilterEndlessLoopTimesOutAndFailsOpen(t *testing.T) {
	f := NewFilter(badSlot(t, KindFilter, "loop", OnFaultFailOpen, func(m *Manifest) {
		m.Limits.CallTimeout = Duration(100 * time.Millisecond)
	}))
	keep := make([]bool, 3)
	err := f.Match(context.Background(), boom, keep)
	require.ErrorIs(t, err, runtime.ErrTimeout)
	require.ErrorIs(t, err, runtime.ErrPolicyOpen)
	require.Equal(t, []bool{true, true, true}, keep, "fail open lets everything through")
}

func TestFilterMemoryHogIsContainedAndReloaded(t *testing.T) {
	f := NewFilter(badSlot(t, KindFilter, "grow", OnFaultReload, func(m *Manifest) { m.Limits.MemoryPages = 64 }))
	ctx := context.Background()
	keep := make([]bool, 3)
	err := f.Match(ctx, boom, keep)
	require.ErrorIs(t, err, runtime.ErrMemory)
	requireAction(t, err, runtime.ActionReloaded)
	require.NoError(t, f.Match(ctx, calm, keep), "a fresh instance serves the next call")
	require.Equal(t, []bool{true, true, true}, keep)
}

func TestFilterGarbageBitmapIsRefused(t *testing.T) {
	for _, mode := range []string{"bitmap", "pointer"} {
		t.Run(mode, func(t *testing.T) {
			f := NewFilter(badSlot(t, KindFilter, mode, OnFaultFailClosed, nil))
			keep := []bool{true, true, true}
			err := f.Match(context.Background(), boom, keep)
			require.ErrorIs(t, err, ErrBadOutput)
			require.ErrorIs(t, err, runtime.ErrPolicyClosed)
			require.Equal(t, []bool{false, false, false}, keep)
			require.ErrorIs(t, f.Match(context.Background(), calm, keep), runtime.ErrPolicyClosed)
		})
	}
}

func TestFilterGuestErrorCodeUnderReloadBudget(t *testing.T) {
	f := NewFilter(badSlot(t, KindFilter, "code", OnFaultReload, func(m *Manifest) { m.Policy.RestartBudget = 1 }))
	ctx := context.Background()
	keep := make([]bool, 3)
	err := f.Match(ctx, boom, keep)
	require.ErrorIs(t, err, ErrGuest)
	require.ErrorContains(t, err, "code -2 (bad input)")
	requireAction(t, err, runtime.ActionReloaded)
	require.NoError(t, f.Match(ctx, calm, keep))

	err = f.Match(ctx, boom, keep)
	requireAction(t, err, runtime.ActionFailedClosed)
	require.ErrorIs(t, f.Match(ctx, calm, keep), runtime.ErrPolicyClosed, "past the budget it fails closed")
}

func allocInput(nq, nm int) *AllocInput {
	in := &AllocInput{Group: "g"}
	for k := range nq {
		in.Queues = append(in.Queues, protocol.MessageQueue{Topic: "t", BrokerName: "b", QueueID: k})
	}
	for i := range nm {
		in.Members = append(in.Members, Member{ID: string(rune('a' + i)), Weight: 1})
	}
	return in
}

func TestAllocatorOutputIsValidated(t *testing.T) {
	for mode, want := range map[string]error{"index": ErrBadOutput, "negative": ErrBadOutput, "short": ErrBadOutput, "code": ErrGuest} {
		t.Run(mode, func(t *testing.T) {
			a := NewAllocator(badSlot(t, KindAllocator, mode, OnFaultFailClosed, nil))
			owners := []int32{9, 9, 9}
			owners, err := a.Allocate(context.Background(), allocInput(4, 2), owners)
			require.ErrorIs(t, err, want)
			require.ErrorIs(t, err, runtime.ErrPolicyClosed)
			require.Empty(t, owners, "no partial assignment is returned")
		})
	}
}

func TestTransformMalformedOutput(t *testing.T) {
	for _, mode := range []string{"truncated", "trailing"} {
		t.Run(mode, func(t *testing.T) {
			tr := NewTransform(badSlot(t, KindTransform, mode, OnFaultFailOpen, nil))
			out, err := tr.Apply(context.Background(), []Message{{Topic: "boom", Tags: "x", Body: []byte("b")}})
			require.ErrorIs(t, err, ErrBadOutput)
			require.ErrorIs(t, err, runtime.ErrPolicyOpen)
			require.Equal(t, [][]Output{{{Tags: "x", Body: []byte("b")}}}, out, "fail open passes messages unchanged")
		})
	}
}

func TestLoadRefusesBadModules(t *testing.T) {
	rt := newRuntime(t)
	ctx := context.Background()
	loadErr := func(kind Kind, wasm []byte, edit func(*Manifest)) error {
		m := manifest("x", kind, wasm, nil)
		if edit != nil {
			edit(m)
		}
		_, err := rt.Load(ctx, m.Spec(wasm))
		return err
	}

	t.Run("tiny valid filter loads", func(t *testing.T) {
		require.NoError(t, loadErr(KindFilter, wasmModule(nil, tinyFilter()), nil))
	})
	t.Run("not wasm", func(t *testing.T) {
		err := loadErr(KindFilter, []byte("#!/bin/sh\necho hi\n"), nil)
		require.ErrorIs(t, err, runtime.ErrInvalidModule)
	})
	t.Run("checksum", func(t *testing.T) {
		wasm := wasmModule(nil, tinyFilter())
		err := loadErr(KindFilter, wasm, func(m *Manifest) { m.SHA256 = sum([]byte("other")) })
		require.ErrorIs(t, err, runtime.ErrChecksum)
	})
	t.Run("unknown import", func(t *testing.T) {
		wasm := wasmModule([]wimport{{module: "env", name: "now", results: []byte{vI64}}}, tinyFilter())
		err := loadErr(KindFilter, wasm, nil)
		require.ErrorIs(t, err, runtime.ErrImport)
		require.ErrorContains(t, err, "env.now")
	})
	t.Run("wrong export signature", func(t *testing.T) {
		fs := tinyFilter()
		fs[2] = wfunc{name: ExportFilter, params: []byte{vI32, vI32}, results: []byte{vI32}, body: i32Const(0)}
		err := loadErr(KindFilter, wasmModule(nil, fs), nil)
		require.ErrorIs(t, err, runtime.ErrExport)
		require.ErrorContains(t, err, ExportFilter)
	})
	t.Run("kind export missing", func(t *testing.T) {
		err := loadErr(KindAllocator, wasmModule(nil, tinyFilter()), nil)
		require.ErrorIs(t, err, runtime.ErrExport)
		require.ErrorContains(t, err, ExportAllocate)
	})
	t.Run("other ABI version", func(t *testing.T) {
		fs := tinyFilter()
		fs[0].body = i32Const(2)
		err := loadErr(KindFilter, wasmModule(nil, fs), nil)
		require.ErrorIs(t, err, runtime.ErrABIVersion)
	})
	t.Run("flowd_init refuses parameters", func(t *testing.T) {
		wasm := goGuest(t, badGuestPkg)
		m := manifest("x", KindFilter, wasm, map[string]string{"mode": "refuse"})
		_, err := rt.Load(ctx, m.Spec(wasm))
		require.ErrorIs(t, err, ErrGuest)
		require.ErrorContains(t, err, "code -4")
	})
	t.Run("self-test fails", func(t *testing.T) {
		// A filter whose bitmap has every bit set fails its one-message self-test.
		fs := tinyFilter()
		fs[2].body = []byte{0x41, 0x00, 0x41, 0x7f, 0x3a, 0x00, 0x00, 0x41, 0x00} // mem[0] = 0xff...; return 0
		err := loadErr(KindFilter, wasmModule(nil, fs), nil)
		require.ErrorIs(t, err, runtime.ErrSelfTest)
		require.ErrorIs(t, err, ErrBadOutput)
	})
}

func TestCallingAPluginAsAnotherKindFails(t *testing.T) {
	wasm := wasmModule(nil, tinyFilter())
	slot := load(t, newRuntime(t), manifest("tiny", KindFilter, wasm, nil), wasm)
	_, err := NewAllocator(slot).Allocate(context.Background(), allocInput(1, 1), nil)
	require.ErrorIs(t, err, ErrKind)
	keep := []bool{true}
	require.NoError(t, NewFilter(slot).Match(context.Background(), []Message{{Topic: "t"}}, keep))
	require.False(t, keep[0], "the hand-assembled filter keeps nothing")
}

func TestAllocatorStrategyFallsBackWhenFailedOpen(t *testing.T) {
	a := NewAllocator(badSlot(t, KindAllocator, "trap", OnFaultFailOpen, nil))
	s := &AllocatorStrategy{Allocator: a, Fallback: allocate.Averagely()}
	req := allocate.Request{Group: "g", ClientID: "b", ClientIDs: []string{"a", "b"}, Queues: allocInput(4, 0).Queues}
	got, err := s.Allocate(context.Background(), req)
	require.NoError(t, err)
	want, err := allocate.Averagely().Allocate(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, want, got)

	// Without a fallback the fault is the caller's to see.
	s.Fallback = nil
	_, err = s.Allocate(context.Background(), req)
	require.ErrorIs(t, err, runtime.ErrPolicyOpen)
}
