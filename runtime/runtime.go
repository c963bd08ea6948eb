package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
)

// Options configure a [Runtime].
type Options struct {
	// CacheDir keeps compiled machine code between runs (for example <data-dir>/wasm-cache):
	// a large Go guest compiles in about a second but loads from the cache in tens of
	// milliseconds. Empty: compiled code is cached in memory only, for the Runtime's life.
	CacheDir string
	// Logger receives guest stdout and stderr (see [Spec.LogLines]) and the runtime's own
	// events. Default: a logger that discards everything.
	Logger *slog.Logger
	// OnCall, when set, is called after every call into a guest ([Instance.Call]) with the
	// module's name ([Spec.Name]), how long the call took and its error (nil, a
	// [*FaultError], or the caller's context error). It runs on the calling goroutine, so
	// it must be quick and must not block; it is how an embedding program measures plugin
	// latency without the runtime knowing what measures it. The call is timed whether or
	// not OnCall is set (for [Stats].CallTime); OnCall itself allocates nothing. Default:
	// none.
	OnCall func(module string, d time.Duration, err error)
	// Uninterruptible compiles guests without the checks that let a running call be
	// stopped, and enforces no time limit, so that a benchmark can measure what the checks
	// cost. A guest that loops then never returns and stalls the whole process at its next
	// garbage collection: never set it outside a benchmark. Default false.
	Uninterruptible bool
}

// Runtime compiles and hosts modules. It owns the compilation cache shared by every module
// it loads; each loaded module version gets a wazero runtime of its own (see RATIONALE.md:
// limits are per wazero runtime). Every module is compiled with wazero's checks for a done
// context, so every call can be stopped (see [Spec.CallTimeout]). A Runtime is safe for
// concurrent use.
type Runtime struct {
	cache           wazero.CompilationCache
	logger          *slog.Logger
	onCall          func(module string, d time.Duration, err error)
	uninterruptible bool

	mu      sync.Mutex
	closed  bool
	modules map[*Module]struct{}
}

// New creates a Runtime. With Options.CacheDir it creates the directory if needed.
func New(ctx context.Context, opts Options) (*Runtime, error) {
	_ = ctx // reserved: compilation cache setup does not block today
	r := &Runtime{logger: opts.Logger, onCall: opts.OnCall, uninterruptible: opts.Uninterruptible, modules: make(map[*Module]struct{})}
	if r.logger == nil {
		r.logger = slog.New(slog.DiscardHandler)
	}
	if opts.CacheDir != "" {
		c, err := wazero.NewCompilationCacheWithDir(opts.CacheDir)
		if err != nil {
			return nil, fmt.Errorf("open wasm compilation cache %s: %w", opts.CacheDir, err)
		}
		r.cache = c
	} else {
		r.cache = wazero.NewCompilationCache()
	}
	return r, nil
}

// Close closes every module still loaded, waiting (until ctx is done) for their borrowed
// instances to come back, then the compilation cache. Loads after Close fail with
// [ErrClosed].
func (r *Runtime) Close(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	mods := make([]*Module, 0, len(r.modules))
	for m := range r.modules {
		mods = append(mods, m)
	}
	r.mu.Unlock()
	var errs []error
	for _, m := range mods {
		if err := m.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		// Modules still draining use the cache's engine; leave it to the GC.
		return errors.Join(errs...)
	}
	if err := r.cache.Close(ctx); err != nil {
		return fmt.Errorf("close wasm compilation cache: %w", err)
	}
	return nil
}

func (r *Runtime) forget(m *Module) {
	r.mu.Lock()
	delete(r.modules, m)
	r.mu.Unlock()
}
