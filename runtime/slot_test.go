package runtime

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSlotSwapUnderConcurrentCalls(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t, nil)
	spec := func(v byte) Spec {
		return Spec{Name: "swap", Version: string('0' + rune(v)), Wasm: cModule(v), MaxInstances: 2,
			ABI: ABI{Export: "flowd_abi_version", Version: 1}}
	}
	v1, err := rt.Load(ctx, spec(1))
	require.NoError(t, err)
	var slot Slot
	require.NoError(t, slot.Swap(ctx, v1))

	const workers = 6
	var (
		swapped  atomic.Bool
		seen     [3]atomic.Int64
		stop     = make(chan struct{})
		wg       sync.WaitGroup
		errs     = make(chan error, workers)
		staleMu  sync.Mutex
		staleV1s int
	)
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				after := swapped.Load()
				st := []uint64{0}
				err := slot.Do(ctx, func(inst *Instance) error { return inst.Call(ctx, inst.Function("version"), st) })
				if err != nil {
					errs <- err
					return
				}
				seen[st[0]].Add(1)
				if after && st[0] == 1 {
					staleMu.Lock()
					staleV1s++
					staleMu.Unlock()
				}
			}
		})
	}
	require.Eventually(t, func() bool { return seen[1].Load() >= 100 }, 10*time.Second, time.Millisecond)

	v2, err := rt.Load(ctx, spec(2))
	require.NoError(t, err)
	require.NoError(t, slot.Swap(ctx, v2))
	swapped.Store(true)
	select {
	case <-v1.Drained():
	default:
		t.Fatal("Swap returned before the old version drained")
	}
	require.Equal(t, StateClosed, v1.State())
	require.Equal(t, 0, v1.Stats().Instances)
	require.Same(t, v2, slot.Active())

	base := seen[2].Load()
	require.Eventually(t, func() bool { return seen[2].Load() >= base+100 }, 10*time.Second, time.Millisecond)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("call failed during the swap: %v", err)
	}
	require.Zero(t, staleV1s, "a call started after Swap returned ran on the old version")
	require.NoError(t, slot.Close(ctx))
	_, err = slot.Borrow(ctx)
	require.ErrorIs(t, err, ErrClosed)
}

func TestSlotSwapWaitsForInFlightCalls(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t, nil)
	v1, err := rt.Load(ctx, Spec{Name: "swap", Wasm: cModule(1)})
	require.NoError(t, err)
	var slot Slot
	require.NoError(t, slot.Swap(ctx, v1))
	held, err := slot.Borrow(ctx)
	require.NoError(t, err)

	v2, err := rt.Load(ctx, Spec{Name: "swap", Wasm: cModule(2)})
	require.NoError(t, err)
	swapped := make(chan error, 1)
	go func() { swapped <- slot.Swap(ctx, v2) }()
	require.Eventually(t, func() bool { return slot.Active() == v2 }, 10*time.Second, time.Millisecond)

	// New calls go to v2 while the borrowed v1 instance still works.
	st, err := call(ctx, v2, "version")
	require.NoError(t, err)
	require.Equal(t, uint64(2), st[0])
	st = []uint64{0}
	require.NoError(t, held.Call(ctx, held.Function("version"), st))
	require.Equal(t, uint64(1), st[0])
	select {
	case err := <-swapped:
		t.Fatalf("Swap returned while an old instance was borrowed: %v", err)
	default:
	}
	held.Release()
	require.NoError(t, <-swapped)
	require.Equal(t, StateClosed, v1.State())
}

// cacheFiles lists the files under dir with their size and modification time.
func cacheFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		files[path] = fmt.Sprint(info.ModTime(), " ", info.Size())
		return nil
	}))
	return files
}

func TestCompilationCacheReusedAcrossRuntimes(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	wasm := goGuestWasm(t)
	load := func(dir string) {
		rt, err := New(ctx, Options{CacheDir: dir})
		require.NoError(t, err)
		m, err := rt.Load(ctx, Spec{Name: "cached", Wasm: wasm})
		require.NoError(t, err)
		_, err = call(ctx, m, "noop")
		require.NoError(t, err)
		require.NoError(t, rt.Close(ctx))
	}
	load(dir)
	first := cacheFiles(t, dir)
	require.NotEmpty(t, first, "the first load writes compiled code to the cache")

	load(dir)
	require.Equal(t, first, cacheFiles(t, dir), "the second load is served from the cache: nothing written")

	// A cache entry that is gone is compiled and written again, so the comparison above
	// would have seen a miss.
	for path := range first {
		require.NoError(t, os.Remove(path))
	}
	load(dir)
	again := cacheFiles(t, dir)
	require.Len(t, again, len(first))
	for path := range first {
		require.Contains(t, again, path)
	}
}
