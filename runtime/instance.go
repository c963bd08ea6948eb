package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"
)

// sandboxEpoch is the guests' wall clock: 2020-01-01T00:00:00Z, always. Guests must not
// depend on real time, so a replayed batch gives the same result.
const sandboxEpoch = 1577836800

// errCallLimit is the cause of a call context ended by Spec.CallTimeout, which tells a
// timeout apart from the caller's own deadline.
var errCallLimit = errors.New("wasm call time limit")

// Instance is one instance of a module, borrowed by one caller at a time (instances are not
// safe for concurrent use). Look exported functions up once (Function caches them, but
// [Spec.Init] with [Instance.SetData] avoids even the map lookup) and call them with Call.
type Instance struct {
	m    *Module
	mod  api.Module
	mem  api.Memory
	fns  map[string]api.Function
	data any

	borrowed bool
	faulted  bool
	// memRefused is set by the memory allocator when the guest asked for memory past the
	// cap; it runs on the calling goroutine, so no synchronisation is needed.
	memRefused bool
	lm         *linearMemory // nil if the module has no memory
	clock      int64

	stdout, stderr lineWriter
}

func (m *Module) newInstance(ctx context.Context) (*Instance, error) {
	i := &Instance{m: m, fns: make(map[string]api.Function)}
	i.stdout = lineWriter{log: m.log, stream: "stdout"}
	i.stderr = lineWriter{log: m.log, stream: "stderr"}
	cfg := wazero.NewModuleConfig().
		WithName(""). // anonymous, so one compiled module has many instances
		WithStartFunctions("_initialize").
		WithStdout(&i.stdout).
		WithStderr(&i.stderr).
		WithWalltime(func() (int64, int32) { return sandboxEpoch, 0 }, sys.ClockResolution(1000)).
		WithNanotime(i.nanotime, sys.ClockResolution(1000)).
		WithNanosleep(func(int64) {}).
		WithOsyield(func() {}).
		WithRandSource(rand.NewChaCha8([32]byte{}))
	limit := uint64(m.spec.MemoryLimitPages) * 65536
	actx := experimental.WithMemoryAllocator(ctx, experimental.MemoryAllocatorFunc(func(capacity, _ uint64) experimental.LinearMemory {
		i.lm = &linearMemory{buf: make([]byte, 0, min(capacity, limit)), limit: limit, refused: &i.memRefused}
		return i.lm
	}))
	mod, err := m.wr.InstantiateModule(actx, m.cm, cfg)
	if err != nil {
		// A trap in _initialize carries wazero's multi-line stack trace: the error keeps its
		// first line, the log the rest.
		if full := err.Error(); strings.Contains(full, "\n") {
			m.rt.logger.LogAttrs(ctx, slog.LevelDebug, "wasm instantiate failed", append(m.attrs[:len(m.attrs):len(m.attrs)], slog.String("err", full))...)
		}
		if i.memRefused {
			return nil, fmt.Errorf("instantiate: %w: %w", ErrMemory, oneLine{err})
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("instantiate: _initialize stopped: %w", context.Cause(ctx))
		}
		return nil, fmt.Errorf("instantiate: %w", oneLine{err})
	}
	i.mod = mod
	if i.lm != nil { // mod.Memory() is a non-nil interface even without a memory
		i.mem = mod.Memory()
		if uint64(i.mem.Size()) > limit {
			_ = mod.Close(ctx)
			return nil, fmt.Errorf("instantiate: memory of %d bytes exceeds the limit of %d pages: %w", i.mem.Size(), m.spec.MemoryLimitPages, ErrMemory)
		}
	}
	m.live.Add(1)
	if m.spec.Init != nil {
		if err := m.spec.Init(ctx, i); err != nil {
			i.discard(ctx)
			return nil, fmt.Errorf("init instance: %w", err)
		}
	}
	return i, nil
}

// nanotime is the guest's monotonic clock: it advances 1 µs per reading, whatever the real
// time, so guest timing is deterministic.
func (i *Instance) nanotime() int64 {
	i.clock += 1000
	return i.clock
}

// Module is the module this instance belongs to.
func (i *Instance) Module() *Module { return i.m }

// Function returns the exported function name, or nil if there is none. The first lookup
// per name allocates; later ones do not.
func (i *Instance) Function(name string) api.Function {
	if f, ok := i.fns[name]; ok {
		return f
	}
	f := i.mod.ExportedFunction(name)
	if f != nil {
		i.fns[name] = f
	}
	return f
}

// Memory is the guest's linear memory (nil if it has none). Read and write through it
// between calls; views it returns are invalid after a call that grows memory.
func (i *Instance) Memory() api.Memory { return i.mem }

// Data returns what SetData stored.
func (i *Instance) Data() any { return i.data }

// SetData keeps per-instance state for the ABI layered on top: function handles, the
// address of a guest buffer. It lives as long as the instance.
func (i *Instance) SetData(v any) { i.data = v }

// Call calls fn, an export of this instance (from Function, never another instance's), with
// params in stack and results written back
// into it (see [api.Function.CallWithStack]; stack must hold max(params, results) values).
//
// A trap, a timeout (past [Spec.CallTimeout]) or a memory fault returns a [*FaultError]:
// the instance is marked faulted (Release discards it) and the module's policy is applied.
// A call stopped because ctx ended returns ctx's error (its cause) and also discards the
// instance, but is not the guest's fault.
func (i *Instance) Call(ctx context.Context, fn api.Function, stack []uint64) error {
	if fn == nil {
		return fmt.Errorf("module %s %s: call of a function the module does not export", i.m.spec.Name, i.m.spec.Version)
	}
	if i.faulted {
		return fmt.Errorf("module %s %s: call on a faulted instance: %w", i.m.spec.Name, i.m.spec.Version, ErrClosed)
	}
	i.m.calls.Add(1)
	start := time.Now()
	err := i.call(ctx, fn, stack)
	d := time.Since(start)
	i.m.callNanos.Add(uint64(d))
	if onCall := i.m.rt.onCall; onCall != nil {
		onCall(i.m.spec.Name, d, err)
	}
	return err
}

// call is Call after its checks.
func (i *Instance) call(ctx context.Context, fn api.Function, stack []uint64) error {
	i.memRefused = false
	if i.m.rt.uninterruptible {
		err := fn.CallWithStack(ctx, stack)
		if err == nil {
			return nil
		}
		return i.fault(ctx, fn, err, false)
	}
	cctx, cancel := context.WithTimeoutCause(ctx, i.m.spec.CallTimeout, errCallLimit)
	err := fn.CallWithStack(cctx, stack)
	limited := err != nil && context.Cause(cctx) == errCallLimit
	cancel()
	if err == nil {
		return nil
	}
	return i.fault(ctx, fn, err, limited)
}

func (i *Instance) fault(ctx context.Context, fn api.Function, err error, limited bool) error {
	name := fn.Definition().Name()
	if names := fn.Definition().ExportNames(); len(names) > 0 {
		name = names[0]
	}
	var exit *sys.ExitError
	ctxStop := errors.As(err, &exit) &&
		(exit.ExitCode() == sys.ExitCodeDeadlineExceeded || exit.ExitCode() == sys.ExitCodeContextCanceled)
	var kind FaultKind
	switch {
	case i.memRefused:
		kind = FaultMemory
	case ctxStop && limited:
		kind = FaultTimeout
		err = fmt.Errorf("stopped at the time limit of %v: %w", i.m.spec.CallTimeout, err)
	case ctxStop && ctx.Err() != nil:
		i.faulted = true // stopped mid-call: its memory may be half-written
		return fmt.Errorf("module %s %s: call %s stopped: %w", i.m.spec.Name, i.m.spec.Version, name, context.Cause(ctx))
	default:
		kind = FaultTrap
	}
	return i.Fault(ctx, kind, name, err)
}

// Fault reports a fault the runtime cannot see itself: the embedder refused the result of
// the call it just made ([FaultBadOutput]) or the guest returned an error code
// ([FaultGuestError]). It takes the same path as a trap: the instance is marked faulted
// (Release discards it, so a reload really gets a fresh instance), the fault is counted in
// [Stats].Faults, the module's policy is applied with the one restart budget, and the
// [*FaultError] to return is built, wrapping cause. fn names the export. A second fault on
// an instance already faulted is not counted again.
func (i *Instance) Fault(ctx context.Context, kind FaultKind, fn string, cause error) error {
	m := i.m
	if kind >= NumFaultKinds {
		return fmt.Errorf("module %s %s: call %s: fault of unknown kind %d: %w", m.spec.Name, m.spec.Version, fn, kind, cause)
	}
	if i.faulted {
		return fmt.Errorf("module %s %s: call %s on a faulted instance: %w", m.spec.Name, m.spec.Version, fn, cause)
	}
	i.faulted = true
	action, stopped := m.fault(ctx, kind, fn, cause)
	return &FaultError{Module: m.spec.Name, Version: m.spec.Version, Function: fn, Kind: kind, Action: action, Stopped: stopped, Err: cause}
}

// Release gives the instance back to its module. A faulted instance is discarded, never
// reused. Releasing twice is a no-op.
func (i *Instance) Release() {
	if !i.borrowed {
		return
	}
	i.borrowed = false
	i.m.release(i)
}

// discard closes the instance for good.
func (i *Instance) discard(ctx context.Context) {
	i.stdout.flush()
	i.stderr.flush()
	_ = i.mod.Close(context.WithoutCancel(ctx))
	i.m.live.Add(-1)
}
