package plugins

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/runtime"
)

func jsonFilterManifest(wasm []byte, version, threshold string) *Manifest {
	m := manifest("big-orders", KindFilter, wasm, map[string]string{"threshold": threshold})
	m.Version = version
	m.WantsBody = true
	return m
}

func order(amount string) Message {
	return Message{Topic: "orders", Body: []byte(`{"amount": ` + amount + `}`)}
}

func TestRegistryDeployActivateSwapAndRestart(t *testing.T) {
	wasm := goGuest(t, jsonFilterPkg)
	ctx := context.Background()
	dir := t.TempDir()
	store, err := NewDirStore(dir)
	require.NoError(t, err)
	reg, err := NewRegistry(ctx, newRuntime(t), store, nil)
	require.NoError(t, err)

	v1, v2 := jsonFilterManifest(wasm, "1.0.0", "100"), jsonFilterManifest(wasm, "2.0.0", "200")
	require.NoError(t, reg.Deploy(ctx, v1, wasm))
	require.NoError(t, reg.Deploy(ctx, v1, wasm), "deploying the same version again is a no-op")
	require.NoError(t, reg.Deploy(ctx, v2, wasm))

	list, err := reg.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.False(t, list[0].Active || list[1].Active, "deploying activates nothing")

	f, err := reg.Filter("big-orders")
	require.NoError(t, err)
	keep := []bool{true}
	require.ErrorIs(t, f.Match(ctx, []Message{order("150")}, keep), runtime.ErrClosed, "no version active yet")
	require.False(t, keep[0])

	require.NoError(t, reg.Activate(ctx, "big-orders", "1.0.0"))
	require.NoError(t, f.Match(ctx, []Message{order("150")}, keep))
	require.True(t, keep[0], "v1: 150 > 100")

	require.NoError(t, reg.Activate(ctx, "big-orders", "2.0.0"))
	require.NoError(t, f.Match(ctx, []Message{order("150")}, keep))
	require.False(t, keep[0], "v2: 150 <= 200, the same Filter follows the swap")
	require.Equal(t, "2.0.0", reg.ActiveVersion("big-orders"))
	require.Equal(t, "200", reg.ActiveManifest("big-orders").Parameters["threshold"])
	require.True(t, reg.ActiveManifest("big-orders").WantsBody)
	require.Nil(t, reg.ActiveManifest("nothing"))

	require.ErrorIs(t, reg.Remove(ctx, "big-orders", "2.0.0"), ErrActive)
	require.NoError(t, reg.Remove(ctx, "big-orders", "1.0.0"))
	_, err = reg.Get(ctx, "big-orders", "1.0.0")
	require.ErrorIs(t, err, ErrNotFound)
	require.ErrorIs(t, reg.Remove(ctx, "big-orders", "1.0.0"), ErrNotFound)
	require.NoError(t, reg.Close(ctx))

	// A restart finds the active version on disk and loads it again.
	reg2, err := NewRegistry(ctx, newRuntime(t), store, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg2.Close(ctx) })
	require.Equal(t, "2.0.0", reg2.ActiveVersion("big-orders"))
	f2, err := reg2.Filter("big-orders")
	require.NoError(t, err)
	keep[0] = true
	require.NoError(t, f2.Match(ctx, []Message{order("250")}, keep))
	require.True(t, keep[0])
	list, err = reg2.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.True(t, list[0].Active)
	_, err = reg2.Allocator("big-orders")
	require.ErrorIs(t, err, ErrKind)
}

func TestRegistryRestartRefusesATamperedModule(t *testing.T) {
	wasm := goGuest(t, jsonFilterPkg)
	ctx := context.Background()
	dir := t.TempDir()
	store, err := NewDirStore(dir)
	require.NoError(t, err)
	reg, err := NewRegistry(ctx, newRuntime(t), store, nil)
	require.NoError(t, err)
	require.NoError(t, reg.Deploy(ctx, jsonFilterManifest(wasm, "1.0.0", "100"), wasm))
	require.NoError(t, reg.Activate(ctx, "big-orders", "1.0.0"))
	require.NoError(t, reg.Close(ctx))

	path := filepath.Join(dir, "big-orders", "1.0.0", "module.wasm")
	tampered := append([]byte(nil), wasm...)
	tampered[len(tampered)-1] ^= 0xff
	require.NoError(t, os.WriteFile(path, tampered, 0o644))

	reg2, err := NewRegistry(ctx, newRuntime(t), store, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg2.Close(ctx) })
	require.Empty(t, reg2.ActiveVersion("big-orders"), "a module failing its checksum is not loaded")
	require.ErrorIs(t, reg2.Activate(ctx, "big-orders", "1.0.0"), runtime.ErrChecksum)
	f, err := reg2.Filter("big-orders")
	require.NoError(t, err)
	keep := []bool{true}
	require.Error(t, f.Match(ctx, []Message{order("150")}, keep))
	require.False(t, keep[0])
}

func TestRegistryDeployRefusals(t *testing.T) {
	wasm := goGuest(t, jsonFilterPkg)
	ctx := context.Background()
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	reg, err := NewRegistry(ctx, newRuntime(t), store, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close(ctx) })

	bad := jsonFilterManifest(wasm, "1.0.0", "100")
	bad.SHA256 = sum([]byte("x"))
	require.ErrorIs(t, reg.Deploy(ctx, bad, wasm), runtime.ErrChecksum)

	noThreshold := manifest("big-orders", KindFilter, wasm, nil)
	require.ErrorIs(t, reg.Deploy(ctx, noThreshold, wasm), ErrGuest, "a version failing flowd_init never reaches the store")
	list, err := reg.List(ctx)
	require.NoError(t, err)
	require.Empty(t, list)

	require.NoError(t, reg.Deploy(ctx, jsonFilterManifest(wasm, "1.0.0", "100"), wasm))
	tiny := wasmModule(nil, tinyFilter())
	require.ErrorIs(t, reg.Deploy(ctx, manifest("big-orders", KindFilter, tiny, nil), tiny), ErrExists)
	allocWasm := goGuest(t, averagelyPkg)
	other := manifest("big-orders", KindAllocator, allocWasm, nil)
	other.Version = "3.0.0"
	require.ErrorIs(t, reg.Deploy(ctx, other, allocWasm), ErrKind)
	require.ErrorIs(t, reg.Activate(ctx, "big-orders", "9.9.9"), ErrNotFound)
}

func TestRegistryHotSwapFailsNoCall(t *testing.T) {
	wasm := goGuest(t, jsonFilterPkg)
	ctx := context.Background()
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	reg, err := NewRegistry(ctx, newRuntime(t), store, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close(ctx) })
	versions := []string{"1.0.0", "1.1.0", "1.2.0"}
	for _, v := range versions {
		require.NoError(t, reg.Deploy(ctx, jsonFilterManifest(wasm, v, "100"), wasm))
	}
	require.NoError(t, reg.Activate(ctx, "big-orders", versions[0]))
	f, err := reg.Filter("big-orders")
	require.NoError(t, err)

	var calls atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 3 {
		wg.Go(func() {
			msgs := []Message{order("150"), order("50")}
			keep := make([]bool, 2)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := f.Match(ctx, msgs, keep); err != nil || !keep[0] || keep[1] {
					errs <- err
					return
				}
				calls.Add(1)
			}
		})
	}
	for i := range 6 {
		before := calls.Load()
		require.NoError(t, reg.Activate(ctx, "big-orders", versions[(i+1)%len(versions)]))
		require.Eventually(t, func() bool { return calls.Load() > before+10 }, testTimeout, pollInterval)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err, "a call failed during a swap")
		t.Fatal("a call returned wrong verdicts during a swap")
	}
}

// blockingStore holds Get until released, standing for a deploy that takes long (a large
// module compiled under load).
type blockingStore struct {
	Store
	entered chan struct{}
	release chan struct{}
}

func (s *blockingStore) Get(ctx context.Context, name, version string) (*Manifest, []byte, error) {
	s.entered <- struct{}{}
	<-s.release
	return s.Store.Get(ctx, name, version)
}

// Listing plugins answers while a deploy is under way: plugin.list (and the daemon's
// readiness checks that use it) must not wait for another plugin's compilation.
func TestListDoesNotWaitForADeploy(t *testing.T) {
	ctx := context.Background()
	dir, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	store := &blockingStore{Store: dir, entered: make(chan struct{}), release: make(chan struct{})}
	reg, err := NewRegistry(ctx, newRuntime(t), store, nil)
	require.NoError(t, err)

	wasm := wasmModule(nil, tinyFilter())
	deployed := make(chan error, 1)
	go func() { deployed <- reg.Deploy(ctx, manifest("slow", KindFilter, wasm, nil), wasm) }()
	<-store.entered // the deploy holds the registry's writer lock from here

	listed := make(chan error, 1)
	go func() {
		_, err := reg.List(ctx)
		listed <- err
	}()
	select {
	case err := <-listed:
		require.NoError(t, err)
	case err := <-deployed:
		t.Fatalf("the deploy ended before the list: %v", err)
	case <-time.After(10 * time.Second):
		close(store.release)
		t.Fatal("List waited for the deploy in progress")
	}
	close(store.release)
	require.NoError(t, <-deployed)
}

// A registry whose store was changed by another process follows it: Follow swaps in the
// version the store records without writing the store, leaves an active version alone
// unless told to load it again, and a restart loads what the store records.
func TestRegistryFollowsAnActivationRecordedElsewhere(t *testing.T) {
	wasm := goGuest(t, jsonFilterPkg)
	ctx := context.Background()
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	reg, err := NewRegistry(ctx, newRuntime(t), store, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close(ctx) })

	// Another process stored and activated v1: the store says so, this registry does not.
	v1 := jsonFilterManifest(wasm, "1.0.0", "100")
	require.NoError(t, store.Put(ctx, v1, wasm))
	require.NoError(t, store.SetActive(ctx, "big-orders", "1.0.0"))
	require.Equal(t, "", reg.ActiveVersion("big-orders"))

	swapped, err := reg.Follow(ctx, "big-orders", "1.0.0", false)
	require.NoError(t, err)
	require.True(t, swapped)
	require.Equal(t, "1.0.0", reg.ActiveVersion("big-orders"))
	f, err := reg.Filter("big-orders")
	require.NoError(t, err)
	keep := []bool{false}
	require.NoError(t, f.Match(ctx, []Message{order("150")}, keep))
	require.True(t, keep[0])

	swapped, err = reg.Follow(ctx, "big-orders", "1.0.0", false)
	require.NoError(t, err)
	require.False(t, swapped, "the active version is left as it is")
	swapped, err = reg.Follow(ctx, "big-orders", "1.0.0", true)
	require.NoError(t, err)
	require.True(t, swapped, "again: loaded afresh")

	// Following writes nothing: a store that records no activation stays so.
	require.NoError(t, store.SetActive(ctx, "big-orders", ""))
	v2 := jsonFilterManifest(wasm, "2.0.0", "200")
	require.NoError(t, store.Put(ctx, v2, wasm))
	_, err = reg.Follow(ctx, "big-orders", "2.0.0", false)
	require.NoError(t, err)
	active, err := store.Active(ctx)
	require.NoError(t, err)
	require.Empty(t, active, "Follow does not record the activation")

	_, err = reg.Follow(ctx, "big-orders", "9.9.9", false)
	require.ErrorIs(t, err, ErrNotFound)
	require.Equal(t, "2.0.0", reg.ActiveVersion("big-orders"), "a version that fails to load leaves the active one")
}
