package runtime

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// BenchmarkCall compares a call of a trivial export through Instance.Call (as every module
// is loaded: interruptible under its time limit; with an OnCall hook; compiled without the
// interruption checks) with wazero's CallWithStack on an instance of the same module, in
// the same run.
func BenchmarkCall(b *testing.B) {
	ctx := context.Background()
	wasm := goGuestWasm(b)
	bench := func(b *testing.B, opts Options) {
		opts.CacheDir = sharedCacheDir(b)
		rt, err := New(ctx, opts)
		require.NoError(b, err)
		defer rt.Close(ctx)
		m, err := rt.Load(ctx, Spec{Name: "bench", Wasm: wasm})
		require.NoError(b, err)
		inst, err := m.Borrow(ctx)
		require.NoError(b, err)
		defer inst.Release()
		fn := inst.Function("noop")
		stack := make([]uint64, 1)
		b.ReportAllocs()
		for b.Loop() {
			if err := inst.Call(ctx, fn, stack); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("runtime", func(b *testing.B) { bench(b, Options{}) })
	b.Run("runtime observed", func(b *testing.B) { // with an OnCall hook, as flowd serve sets
		var calls int
		bench(b, Options{OnCall: func(string, time.Duration, error) { calls++ }})
	})
	b.Run("runtime uninterruptible", func(b *testing.B) { bench(b, Options{Uninterruptible: true}) })
	b.Run("wazero", func(b *testing.B) {
		cache, err := wazero.NewCompilationCacheWithDir(sharedCacheDir(b))
		require.NoError(b, err)
		r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().WithCompilationCache(cache))
		defer r.Close(ctx)
		wasi_snapshot_preview1.MustInstantiate(ctx, r)
		mod, err := r.InstantiateWithConfig(ctx, wasm, wazero.NewModuleConfig().WithStartFunctions("_initialize"))
		require.NoError(b, err)
		fn := mod.ExportedFunction("noop")
		stack := make([]uint64, 1)
		b.ReportAllocs()
		for b.Loop() {
			if err := fn.CallWithStack(ctx, stack); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkBorrowRelease is the cost of taking an idle instance from the pool and giving it
// back.
func BenchmarkBorrowRelease(b *testing.B) {
	ctx := context.Background()
	m, err := newRuntime(b, nil).Load(ctx, Spec{Name: "bench", Wasm: cModule(1), MaxInstances: 4})
	require.NoError(b, err)
	b.ReportAllocs()
	for b.Loop() {
		inst, err := m.Borrow(ctx)
		if err != nil {
			b.Fatal(err)
		}
		inst.Release()
	}
}

// batchABI is what an ABI layer keeps per instance: handles and a guest buffer.
type batchABI struct {
	heads api.Function
	buf   uint32
}

// BenchmarkBatch writes 32 messages of 256 bytes into a guest buffer allocated once per
// instance through the guest's flowd_alloc, and makes one call over the batch, in which the
// guest reads the first byte of each message: with the guest compiled with the interruption
// checks (as every module is) and without.
func BenchmarkBatch(b *testing.B) {
	b.Run("interruptible", func(b *testing.B) { benchBatch(b, false) })
	b.Run("uninterruptible", func(b *testing.B) { benchBatch(b, true) })
}

func benchBatch(b *testing.B, uninterruptible bool) {
	const n, size = 32, 256
	ctx := context.Background()
	rt, err := New(ctx, Options{CacheDir: sharedCacheDir(b), Uninterruptible: uninterruptible})
	require.NoError(b, err)
	defer rt.Close(ctx)
	m, err := rt.Load(ctx, Spec{Name: "bench", Wasm: goGuestWasm(b),
		Init: func(ctx context.Context, inst *Instance) error {
			st := []uint64{n * size}
			if err := inst.Call(ctx, inst.Function("flowd_alloc"), st); err != nil {
				return err
			}
			inst.SetData(&batchABI{heads: inst.Function("heads"), buf: uint32(st[0])})
			return nil
		}})
	require.NoError(b, err)
	msg := make([]byte, size)
	for i := range msg {
		msg[i] = 1
	}
	stack := make([]uint64, 3)
	b.SetBytes(n * size)
	b.ReportAllocs()
	for b.Loop() {
		inst, err := m.Borrow(ctx)
		if err != nil {
			b.Fatal(err)
		}
		abi := inst.Data().(*batchABI)
		mem := inst.Memory()
		for i := range uint32(n) {
			if !mem.Write(abi.buf+i*size, msg) {
				b.Fatal("write out of range")
			}
		}
		stack[0], stack[1], stack[2] = uint64(abi.buf), n, size
		if err := inst.Call(ctx, abi.heads, stack); err != nil {
			b.Fatal(err)
		}
		if stack[0] != n {
			b.Fatalf("sum %d", stack[0])
		}
		inst.Release()
	}
}
