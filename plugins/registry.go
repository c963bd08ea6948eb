package plugins

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowd-io/flowd/runtime"
)

// Registry holds the deployed plugins: every version in a [Store], and the active version
// of each plugin loaded, so that activating another version swaps it without failing a
// call. It survives restarts: [NewRegistry] loads the recorded active versions again,
// checking their checksums. A Registry is safe for concurrent use.
//
// A plugin name has one kind: every version of "big-orders" is a filter.
type Registry struct {
	rt    *runtime.Runtime
	store Store
	log   *slog.Logger

	mu sync.Mutex // serialises Deploy, Activate, Remove and Close
	// vmu guards the plugins map for the lookups of the read path (ActiveVersion,
	// ActiveManifest, Filter, …). Writers hold mu as well, and hold vmu only to add an
	// entry, never across a load: a deploy compiling a module for a second must not hold up
	// every pull through a Wasm filter. A plugin's active version is an atomic pointer of
	// its own.
	vmu     sync.RWMutex
	plugins map[string]*plugin
	closed  bool

	// Versions swapped out drain in the background: the calls borrowed from them finish,
	// then they are freed. Close waits for those still draining.
	rmu     sync.Mutex
	retired map[*runtime.Module]struct{}
	bg      context.Context // ended by Close: stops the drain watchers
	stop    context.CancelFunc
	wg      sync.WaitGroup
}

// retireWarnAfter is how long a swapped-out version may keep calls in flight before the
// registry logs that it is still draining (it is freed when they end, or at Close).
const retireWarnAfter = time.Minute

type plugin struct {
	name string
	kind Kind
	cur  atomic.Pointer[activeVersion] // nil when no version is active
}

// activeVersion is a plugin's active version: its manifest and the module loaded from it,
// swapped as one value, so that no reader pairs one version's manifest with another's
// module.
type activeVersion struct {
	man *Manifest
	mod *runtime.Module
}

// version is the active version's name, or "".
func (p *plugin) version() string {
	if av := p.cur.Load(); av != nil {
		return av.man.Version
	}
	return ""
}

// Borrow borrows an instance of the active version. A borrower that raced a swap (it read
// the old version just as it closed) retries on the new one, so a swap fails no call.
func (p *plugin) Borrow(ctx context.Context) (*runtime.Instance, error) {
	for {
		av := p.cur.Load()
		if av == nil {
			return nil, fmt.Errorf("plugin %s has no active version: %w", p.name, runtime.ErrClosed)
		}
		inst, err := av.mod.Borrow(ctx)
		if err != nil && errors.Is(err, runtime.ErrClosed) && p.cur.Load() != av {
			continue
		}
		return inst, err
	}
}

// Active is the active version's module, or nil.
func (p *plugin) Active() *runtime.Module {
	if av := p.cur.Load(); av != nil {
		return av.mod
	}
	return nil
}

// source is what a [Filter], [Transform] or [Allocator] borrows instances from: a
// [runtime.Slot], or a registry's plugin following its active version.
type source interface {
	Borrow(ctx context.Context) (*runtime.Instance, error)
	Active() *runtime.Module
}

// Info is one deployed version.
type Info struct {
	Manifest *Manifest
	Active   bool
}

// NewRegistry returns a Registry on store, loading the active version of every plugin into
// rt. A version that fails to load (its module is gone, fails its checksum or its
// self-test) is logged and left inactive: the plugin refuses calls until a version is
// activated. logger may be nil.
func NewRegistry(ctx context.Context, rt *runtime.Runtime, store Store, logger *slog.Logger) (*Registry, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &Registry{rt: rt, store: store, log: logger, plugins: map[string]*plugin{}, retired: map[*runtime.Module]struct{}{}}
	all, err := store.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("plugin registry: %w", err)
	}
	for _, m := range all {
		if p := r.plugins[m.Name]; p == nil {
			r.plugins[m.Name] = &plugin{name: m.Name, kind: m.Kind}
		}
	}
	active, err := store.Active(ctx)
	if err != nil {
		return nil, fmt.Errorf("plugin registry: %w", err)
	}
	r.bg, r.stop = context.WithCancel(context.Background())
	for name, version := range active {
		if err := r.activate(ctx, name, version, false); err != nil {
			logger.LogAttrs(ctx, slog.LevelError, "plugin not activated at start",
				slog.String("plugin", name), slog.String("version", version), slog.Any("err", err))
		}
	}
	return r, nil
}

// Deploy validates and stores a plugin version without activating it: the manifest, the
// module's checksum, and a trial load (imports, exports, ABI marker, flowd_init with the
// parameters, self-test), so that a version that would fail never reaches the store.
// Deploying the same version again with the same module is a no-op; with another module
// it fails with [ErrExists]. A version of another kind than the plugin's earlier versions
// fails with [ErrKind].
func (r *Registry) Deploy(ctx context.Context, m *Manifest, wasm []byte) error {
	if err := m.Validate(); err != nil {
		return err
	}
	if err := checkSum(m, wasm); err != nil {
		return fmt.Errorf("deploy plugin %s: %w", m.ID(), err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("deploy plugin %s: registry: %w", m.ID(), runtime.ErrClosed)
	}
	if p := r.plugins[m.Name]; p != nil && p.kind != m.Kind {
		return fmt.Errorf("deploy plugin %s: a %s, but %s is a %s: %w", m.ID(), m.Kind, m.Name, p.kind, ErrKind)
	}
	old, _, err := r.store.Get(ctx, m.Name, m.Version)
	switch {
	case err == nil && old.SHA256 == m.SHA256:
		return nil
	case err == nil:
		return fmt.Errorf("deploy plugin %s: deployed with sha256 %s: %w", m.ID(), old.SHA256, ErrExists)
	case !errors.Is(err, ErrNotFound):
		return fmt.Errorf("deploy plugin %s: %w", m.ID(), err)
	}
	mod, err := r.rt.Load(ctx, m.Spec(wasm))
	if err != nil {
		return fmt.Errorf("deploy plugin %s: %w", m.ID(), err)
	}
	if err := mod.Close(ctx); err != nil {
		return fmt.Errorf("deploy plugin %s: close the trial load: %w", m.ID(), err)
	}
	if err := r.store.Put(ctx, m, wasm); err != nil {
		return fmt.Errorf("deploy plugin %s: %w", m.ID(), err)
	}
	r.vmu.Lock()
	if r.plugins[m.Name] == nil {
		r.plugins[m.Name] = &plugin{name: m.Name, kind: m.Kind}
	}
	r.vmu.Unlock()
	r.log.LogAttrs(ctx, slog.LevelInfo, "plugin deployed", slog.String("plugin", m.Name), slog.String("version", m.Version), slog.String("kind", string(m.Kind)))
	return nil
}

// Activate makes version the active version of name: it loads it from the store (checking
// the checksum), records it as active, and swaps it in. It succeeds once the swap is done:
// new calls go to the new version at once, and calls in flight finish on the old one, which
// drains in the background (Close waits for it). If loading fails the old version stays
// active. Activating the active version again loads it afresh, which restarts a version its
// fault policy stopped.
func (r *Registry) Activate(ctx context.Context, name, version string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("activate plugin %s@%s: registry: %w", name, version, runtime.ErrClosed)
	}
	return r.activate(ctx, name, version, true)
}

// Follow makes version the active version of name as Activate does, without recording it
// in the store: for a store that other processes change (a cluster's, where another node
// activated the version and the store records it already). With again false a version
// that is active already is left as it is (the echo of this process's own activation);
// with again true it is loaded afresh, as a repeated Activate would, which restarts a
// version its fault policy stopped. It reports whether it swapped a version in.
func (r *Registry) Follow(ctx context.Context, name, version string, again bool) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false, fmt.Errorf("activate plugin %s@%s: registry: %w", name, version, runtime.ErrClosed)
	}
	if !again && r.ActiveVersion(name) == version {
		return false, nil
	}
	if err := r.activate(ctx, name, version, false); err != nil {
		return false, err
	}
	return true, nil
}

func (r *Registry) activate(ctx context.Context, name, version string, record bool) error {
	m, wasm, err := r.store.Get(ctx, name, version)
	if err != nil {
		return fmt.Errorf("activate plugin %s@%s: %w", name, version, err)
	}
	r.vmu.Lock()
	p := r.plugins[name]
	if p == nil {
		p = &plugin{name: name, kind: m.Kind}
		r.plugins[name] = p
	}
	r.vmu.Unlock()
	if p.kind != m.Kind {
		return fmt.Errorf("activate plugin %s: a %s, but %s is a %s: %w", m.ID(), m.Kind, name, p.kind, ErrKind)
	}
	mod, err := r.rt.Load(ctx, m.Spec(wasm))
	if err != nil {
		return fmt.Errorf("activate plugin %s: %w", m.ID(), err)
	}
	if record {
		if err := r.store.SetActive(ctx, name, version); err != nil {
			_ = mod.Close(ctx) // never lent: closes at once
			return fmt.Errorf("activate plugin %s: %w", m.ID(), err)
		}
	}
	if old := p.cur.Swap(&activeVersion{man: m, mod: mod}); old != nil {
		r.retire(old)
	}
	r.log.LogAttrs(ctx, slog.LevelInfo, "plugin activated", slog.String("plugin", name), slog.String("version", version))
	return nil
}

// retire closes a version swapped out: it takes no new borrows, and is freed once the
// calls borrowed from it are released. A watcher logs a version still draining after
// retireWarnAfter; Close waits for every retired version.
func (r *Registry) retire(old *activeVersion) {
	r.rmu.Lock()
	for m := range r.retired {
		select {
		case <-m.Drained():
			delete(r.retired, m)
		default:
		}
	}
	r.retired[old.mod] = struct{}{}
	r.rmu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		ctx, cancel := context.WithTimeout(r.bg, retireWarnAfter)
		defer cancel()
		err := old.mod.Close(ctx)
		switch {
		case err == nil:
			r.rmu.Lock()
			delete(r.retired, old.mod)
			r.rmu.Unlock()
		case r.bg.Err() == nil:
			r.log.LogAttrs(r.bg, slog.LevelWarn, "previous plugin version still has calls in flight; it is freed when they end",
				slog.String("plugin", old.man.Name), slog.String("version", old.man.Version), slog.Any("err", err))
		}
	}()
}

// Remove deletes a version that is not active ([ErrActive] otherwise).
func (r *Registry) Remove(ctx context.Context, name, version string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.plugins[name]; p != nil && p.version() == version {
		return fmt.Errorf("remove plugin %s@%s: %w", name, version, ErrActive)
	}
	if _, _, err := r.store.Get(ctx, name, version); errors.Is(err, ErrNotFound) {
		return fmt.Errorf("remove plugin %s@%s: %w", name, version, err)
	}
	if err := r.store.Delete(ctx, name, version); err != nil {
		return err
	}
	r.log.LogAttrs(ctx, slog.LevelInfo, "plugin removed", slog.String("plugin", name), slog.String("version", version))
	return nil
}

// List returns every deployed version, sorted by name and version string. It does not wait
// for a Deploy or Activate in progress (those hold mu across a compilation): it reads the
// active versions under vmu.
func (r *Registry) List(ctx context.Context) ([]Info, error) {
	all, err := r.store.List(ctx)
	if err != nil {
		return nil, err
	}
	r.vmu.RLock()
	defer r.vmu.RUnlock()
	out := make([]Info, len(all))
	for i, m := range all {
		p := r.plugins[m.Name]
		out[i] = Info{Manifest: m, Active: p != nil && p.version() == m.Version}
	}
	return out, nil
}

// Get returns the manifest of a deployed version, or an error wrapping [ErrNotFound].
func (r *Registry) Get(ctx context.Context, name, version string) (*Manifest, error) {
	m, _, err := r.store.Get(ctx, name, version)
	return m, err
}

// PluginStats are the runtime counters of a plugin's active version.
type PluginStats struct {
	Name, Version string
	Kind          Kind
	runtime.Stats
}

// Stats returns the counters of every plugin's active version, sorted by name; plugins
// without an active version are left out. The counters are the loaded module's, so they
// start again from zero when another version is activated. Metrics read it at scrape time.
func (r *Registry) Stats() []PluginStats {
	r.vmu.RLock()
	defer r.vmu.RUnlock()
	out := make([]PluginStats, 0, len(r.plugins))
	for name, p := range r.plugins {
		av := p.cur.Load()
		if av == nil {
			continue
		}
		out = append(out, PluginStats{Name: name, Version: av.man.Version, Kind: p.kind, Stats: av.mod.Stats()})
	}
	slices.SortFunc(out, func(a, b PluginStats) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// ActiveVersion returns the active version of name, or "".
func (r *Registry) ActiveVersion(name string) string {
	r.vmu.RLock()
	defer r.vmu.RUnlock()
	if p := r.plugins[name]; p != nil {
		return p.version()
	}
	return ""
}

// ActiveManifest returns the manifest of name's active version, or nil. The read path
// asks it whether a filter wants message bodies (WantsBody) before decompressing them.
func (r *Registry) ActiveManifest(name string) *Manifest {
	r.vmu.RLock()
	defer r.vmu.RUnlock()
	if p := r.plugins[name]; p != nil {
		if av := p.cur.Load(); av != nil {
			return av.man
		}
	}
	return nil
}

func (r *Registry) lookup(name string, kind Kind) (*plugin, error) {
	r.vmu.RLock()
	defer r.vmu.RUnlock()
	p := r.plugins[name]
	if p == nil {
		return nil, fmt.Errorf("plugin %s: %w", name, ErrNotFound)
	}
	if p.kind != kind {
		return nil, fmt.Errorf("plugin %s is a %s, not a %s: %w", name, p.kind, kind, ErrKind)
	}
	return p, nil
}

// Filter returns the filter plugin name, following its active version.
func (r *Registry) Filter(name string) (*Filter, error) {
	p, err := r.lookup(name, KindFilter)
	if err != nil {
		return nil, err
	}
	return &Filter{src: p}, nil
}

// Allocator returns the allocator plugin name, following its active version.
func (r *Registry) Allocator(name string) (*Allocator, error) {
	p, err := r.lookup(name, KindAllocator)
	if err != nil {
		return nil, err
	}
	return &Allocator{src: p}, nil
}

// Transform returns the transform plugin name, following its active version.
func (r *Registry) Transform(name string) (*Transform, error) {
	p, err := r.lookup(name, KindTransform)
	if err != nil {
		return nil, err
	}
	return &Transform{src: p}, nil
}

// Close closes every active version and every version still draining from a swap, waiting
// (until ctx is done) for their calls in flight. The runtime is the caller's to close.
func (r *Registry) Close(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	var errs []error
	for _, p := range r.plugins {
		if av := p.cur.Load(); av != nil {
			if err := av.mod.Close(ctx); err != nil {
				errs = append(errs, err)
			}
		}
	}
	r.rmu.Lock()
	retired := make([]*runtime.Module, 0, len(r.retired))
	for m := range r.retired {
		retired = append(retired, m)
	}
	r.rmu.Unlock()
	for _, m := range retired {
		if err := m.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("previous version: %w", err))
		}
	}
	r.stop()
	r.wg.Wait() // the watchers return at once now
	return errors.Join(errs...)
}
