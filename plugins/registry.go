package plugins

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/flowd-io/flowd/runtime"
)

// Registry holds the deployed plugins: every version in a [Store], and the active version
// of each plugin loaded in a [runtime.Slot], so that activating another version swaps it
// without failing a call. It survives restarts: [NewRegistry] loads the recorded active
// versions again, checking their checksums. A Registry is safe for concurrent use.
//
// A plugin name has one kind: every version of "big-orders" is a filter.
type Registry struct {
	rt    *runtime.Runtime
	store Store
	log   *slog.Logger

	mu sync.Mutex // serialises Deploy, Activate, Remove and Close
	// vmu guards the plugins map and each plugin's active and man for the lookups of the
	// read path (ActiveVersion, ActiveManifest, Filter, …). Writers hold mu as well, and
	// hold vmu only for the assignment, never across a load: a deploy compiling a module
	// for a second must not hold up every pull through a Wasm filter.
	vmu     sync.RWMutex
	plugins map[string]*plugin
	closed  bool
}

type plugin struct {
	kind   Kind
	slot   runtime.Slot
	active string    // version, "" when none
	man    *Manifest // of the active version
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
	r := &Registry{rt: rt, store: store, log: logger, plugins: map[string]*plugin{}}
	all, err := store.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("plugin registry: %w", err)
	}
	for _, m := range all {
		if p := r.plugins[m.Name]; p == nil {
			r.plugins[m.Name] = &plugin{kind: m.Kind}
		}
	}
	active, err := store.Active(ctx)
	if err != nil {
		return nil, fmt.Errorf("plugin registry: %w", err)
	}
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
		r.plugins[m.Name] = &plugin{kind: m.Kind}
	}
	r.vmu.Unlock()
	r.log.LogAttrs(ctx, slog.LevelInfo, "plugin deployed", slog.String("plugin", m.Name), slog.String("version", m.Version), slog.String("kind", string(m.Kind)))
	return nil
}

// Activate makes version the active version of name: it loads it from the store (checking
// the checksum), records it as active, and swaps it in: calls in flight finish on the old
// version, new calls go to the new one. If loading fails the old version stays active.
func (r *Registry) Activate(ctx context.Context, name, version string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("activate plugin %s@%s: registry: %w", name, version, runtime.ErrClosed)
	}
	return r.activate(ctx, name, version, true)
}

func (r *Registry) activate(ctx context.Context, name, version string, record bool) error {
	m, wasm, err := r.store.Get(ctx, name, version)
	if err != nil {
		return fmt.Errorf("activate plugin %s@%s: %w", name, version, err)
	}
	r.vmu.Lock()
	p := r.plugins[name]
	if p == nil {
		p = &plugin{kind: m.Kind}
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
			_ = mod.Close(ctx)
			return fmt.Errorf("activate plugin %s: %w", m.ID(), err)
		}
	}
	r.vmu.Lock()
	p.active, p.man = version, m
	r.vmu.Unlock()
	if err := p.slot.Swap(ctx, mod); err != nil {
		return fmt.Errorf("activate plugin %s: %w", m.ID(), err)
	}
	r.log.LogAttrs(ctx, slog.LevelInfo, "plugin activated", slog.String("plugin", name), slog.String("version", version))
	return nil
}

// Remove deletes a version that is not active ([ErrActive] otherwise).
func (r *Registry) Remove(ctx context.Context, name, version string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.plugins[name]; p != nil && p.active == version {
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
		out[i] = Info{Manifest: m, Active: p != nil && p.active == m.Version}
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
		m := p.slot.Active()
		if p.active == "" || m == nil {
			continue
		}
		out = append(out, PluginStats{Name: name, Version: p.active, Kind: p.kind, Stats: m.Stats()})
	}
	slices.SortFunc(out, func(a, b PluginStats) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// ActiveVersion returns the active version of name, or "".
func (r *Registry) ActiveVersion(name string) string {
	r.vmu.RLock()
	defer r.vmu.RUnlock()
	if p := r.plugins[name]; p != nil {
		return p.active
	}
	return ""
}

// ActiveManifest returns the manifest of name's active version, or nil. The read path
// asks it whether a filter wants message bodies (WantsBody) before decompressing them.
func (r *Registry) ActiveManifest(name string) *Manifest {
	r.vmu.RLock()
	defer r.vmu.RUnlock()
	if p := r.plugins[name]; p != nil {
		return p.man
	}
	return nil
}

func (r *Registry) slot(name string, kind Kind) (*runtime.Slot, error) {
	r.vmu.RLock()
	defer r.vmu.RUnlock()
	p := r.plugins[name]
	if p == nil {
		return nil, fmt.Errorf("plugin %s: %w", name, ErrNotFound)
	}
	if p.kind != kind {
		return nil, fmt.Errorf("plugin %s is a %s, not a %s: %w", name, p.kind, kind, ErrKind)
	}
	return &p.slot, nil
}

// Filter returns the filter plugin name, following its active version.
func (r *Registry) Filter(name string) (*Filter, error) {
	s, err := r.slot(name, KindFilter)
	if err != nil {
		return nil, err
	}
	return NewFilter(s), nil
}

// Allocator returns the allocator plugin name, following its active version.
func (r *Registry) Allocator(name string) (*Allocator, error) {
	s, err := r.slot(name, KindAllocator)
	if err != nil {
		return nil, err
	}
	return NewAllocator(s), nil
}

// Transform returns the transform plugin name, following its active version.
func (r *Registry) Transform(name string) (*Transform, error) {
	s, err := r.slot(name, KindTransform)
	if err != nil {
		return nil, err
	}
	return NewTransform(s), nil
}

// Close closes every active version, waiting (until ctx is done) for calls in flight. The
// runtime is the caller's to close.
func (r *Registry) Close(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	var errs []error
	for _, p := range r.plugins {
		if err := p.slot.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
