package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
)

// State is where a module stands.
type State int32

const (
	// StateActive: the module serves borrows.
	StateActive State = iota
	// StateFailedOpen: a fault stopped it under [PolicyFailOpen]; borrows return
	// [ErrPolicyOpen].
	StateFailedOpen
	// StateFailedClosed: a fault stopped it under [PolicyFailClosed] or past the restart
	// budget of [PolicyReload]; borrows return [ErrPolicyClosed].
	StateFailedClosed
	// StateClosed: Close was called; borrows return [ErrClosed].
	StateClosed
)

func (s State) String() string {
	switch s {
	case StateActive:
		return "active"
	case StateFailedOpen:
		return "failed-open"
	case StateFailedClosed:
		return "failed-closed"
	case StateClosed:
		return "closed"
	}
	return fmt.Sprintf("State(%d)", int32(s))
}

// Stats are a module's counters since it was loaded.
type Stats struct {
	State     State
	Instances int // instances alive, idle or borrowed
	Borrowed  int // instances borrowed now
	Calls     uint64
	// CallTime is the time spent in calls, faulted ones included: CallTime/Calls is the
	// mean call latency that the console shows (two clock reads a call).
	CallTime time.Duration
	// Faults counts faulted calls by kind (Faults[FaultTrap], …), whoever detected them.
	// Calls stopped by the caller's own context are not faults.
	Faults [NumFaultKinds]uint64
	// Reloads counts faulted instances replaced under [PolicyReload].
	Reloads         uint64
	LogLinesDropped uint64
}

// FaultsTotal is the sum of Faults.
func (s Stats) FaultsTotal() uint64 {
	var n uint64
	for _, f := range s.Faults {
		n += f
	}
	return n
}

// Module is one loaded module version with its pool of instances. It is safe for
// concurrent use; its instances are not, which is why they are borrowed one caller at a
// time.
//
// # Notes
//
//   - The pool is a fixed set of tokens (Spec.MaxInstances) and a stack of idle instances,
//     not a sync.Pool: a sync.Pool is emptied by every GC, and re-instantiating a Go guest
//     costs milliseconds and megabytes.
//   - Instances are created on demand, so a module that is never busy keeps one.
type Module struct {
	rt    *Runtime
	spec  Spec
	wr    wazero.Runtime
	cm    wazero.CompiledModule
	attrs []slog.Attr
	log   *guestLog

	tokens    chan struct{} // one per instance that may exist
	closing   chan struct{} // closed by Close
	closeOnce sync.Once
	drained   chan struct{} // closed when the last instance is gone

	state atomic.Int32 // State
	// serving is set by Load once the module passed its checks: a fault before then fails
	// the load, and no policy applies to a module nobody will use.
	serving atomic.Bool

	mu       sync.Mutex
	idle     []*Instance
	restarts []time.Time // fault times within the restart window

	live, borrowed atomic.Int64
	calls, reloads atomic.Uint64
	callNanos      atomic.Uint64
	faults         [NumFaultKinds]atomic.Uint64
}

func newModule(r *Runtime, spec Spec, wr wazero.Runtime, cm wazero.CompiledModule) *Module {
	m := &Module{
		rt:      r,
		spec:    spec,
		wr:      wr,
		cm:      cm,
		attrs:   []slog.Attr{slog.String("module", spec.Name), slog.String("version", spec.Version)},
		tokens:  make(chan struct{}, spec.MaxInstances),
		closing: make(chan struct{}),
		drained: make(chan struct{}),
	}
	m.log = &guestLog{logger: r.logger, attrs: m.attrs, lines: spec.LogLines, interval: spec.LogInterval}
	for range spec.MaxInstances {
		m.tokens <- struct{}{}
	}
	return m
}

// Name is Spec.Name.
func (m *Module) Name() string { return m.spec.Name }

// Version is Spec.Version.
func (m *Module) Version() string { return m.spec.Version }

// SHA256 is the hex SHA-256 of the module's bytes: two loads with the same name and version
// but different code tell apart by it.
func (m *Module) SHA256() string { return m.spec.SHA256 }

// State is where the module stands.
func (m *Module) State() State { return State(m.state.Load()) }

// Stats returns the module's counters.
func (m *Module) Stats() Stats {
	s := Stats{
		State:           m.State(),
		Instances:       int(m.live.Load()),
		Borrowed:        int(m.borrowed.Load()),
		Calls:           m.calls.Load(),
		CallTime:        time.Duration(m.callNanos.Load()),
		Reloads:         m.reloads.Load(),
		LogLinesDropped: m.log.dropped.Load(),
	}
	for k := range s.Faults {
		s.Faults[k] = m.faults[k].Load()
	}
	return s
}

// unavailable says why the module cannot serve, or nil.
func (m *Module) unavailable() error {
	switch State(m.state.Load()) {
	case StateActive:
		return nil
	case StateFailedOpen:
		return fmt.Errorf("module %s %s: %w", m.spec.Name, m.spec.Version, ErrPolicyOpen)
	case StateFailedClosed:
		return fmt.Errorf("module %s %s: %w", m.spec.Name, m.spec.Version, ErrPolicyClosed)
	default:
		return fmt.Errorf("module %s %s: %w", m.spec.Name, m.spec.Version, ErrClosed)
	}
}

// Borrow takes an instance for the caller's exclusive use, creating one if none is idle and
// fewer than Spec.MaxInstances exist, and otherwise waiting until one is released or ctx is
// done. It fails with [ErrClosed] once Close was called (a waiting borrower is woken), and
// with [ErrPolicyOpen] or [ErrPolicyClosed] after a fault stopped the module. Release the
// instance when done.
func (m *Module) Borrow(ctx context.Context) (*Instance, error) {
	if err := m.unavailable(); err != nil {
		return nil, err
	}
	select {
	case <-m.tokens:
	case <-m.closing:
		return nil, m.unavailable()
	case <-ctx.Done():
		return nil, fmt.Errorf("module %s %s: wait for an instance: %w", m.spec.Name, m.spec.Version, context.Cause(ctx))
	}
	if err := m.unavailable(); err != nil {
		m.tokens <- struct{}{}
		return nil, err
	}
	m.mu.Lock()
	var inst *Instance
	if n := len(m.idle); n > 0 {
		inst = m.idle[n-1]
		m.idle[n-1] = nil
		m.idle = m.idle[:n-1]
	}
	m.mu.Unlock()
	if inst == nil {
		sctx, cancel := m.startContext(ctx, "start")
		var err error
		inst, err = m.newInstance(sctx)
		cancel()
		if err != nil {
			m.tokens <- struct{}{}
			return nil, fmt.Errorf("module %s %s: %w", m.spec.Name, m.spec.Version, err)
		}
	}
	inst.borrowed = true
	m.borrowed.Add(1)
	return inst, nil
}

// Do borrows an instance, runs fn with it and releases it.
func (m *Module) Do(ctx context.Context, fn func(*Instance) error) error {
	inst, err := m.Borrow(ctx)
	if err != nil {
		return err
	}
	defer inst.Release()
	return fn(inst)
}

// release takes back a borrowed instance: a healthy one goes back to the idle stack, a
// faulted one (or any, once the module stopped serving) is closed.
func (m *Module) release(inst *Instance) {
	m.borrowed.Add(-1)
	if inst.faulted || inst.mod.IsClosed() || m.State() != StateActive {
		inst.discard(context.Background())
	} else {
		m.mu.Lock()
		m.idle = append(m.idle, inst)
		m.mu.Unlock()
	}
	m.tokens <- struct{}{}
}

// fault is the one fault path: it counts a fault of kind and applies the policy, and
// reports whether this fault is the one that stopped the module. cause is logged in full at
// debug level (wazero's traps carry a multi-line stack trace).
func (m *Module) fault(ctx context.Context, kind FaultKind, fn string, cause error) (Action, bool) {
	attrs := append(m.attrs[:len(m.attrs):len(m.attrs)], slog.String("function", fn), slog.String("kind", kind.String()))
	if !m.serving.Load() {
		m.rt.logger.LogAttrs(ctx, slog.LevelDebug, "wasm module fault while loading", append(attrs, slog.String("err", cause.Error()))...)
		return 0, false
	}
	m.faults[kind].Add(1)
	m.mu.Lock()
	action := m.decide()
	stopped := false
	var idle []*Instance
	if action != ActionReloaded {
		to := StateFailedClosed
		if action == ActionFailedOpen {
			to = StateFailedOpen
		}
		stopped = m.state.CompareAndSwap(int32(StateActive), int32(to))
		idle, m.idle = m.idle, nil
	}
	m.mu.Unlock()
	for _, inst := range idle {
		inst.discard(ctx)
	}
	m.rt.logger.LogAttrs(ctx, slog.LevelWarn, "wasm module fault",
		append(attrs, slog.String("action", action.String()), slog.String("err", firstLine(cause)))...)
	if full := cause.Error(); strings.Contains(full, "\n") {
		m.rt.logger.LogAttrs(ctx, slog.LevelDebug, "wasm module fault detail", append(attrs, slog.String("err", full))...)
	}
	return action, stopped
}

// decide applies the policy to a fault; m.mu is held. A module stopped already stays as it
// is, and every fault of PolicyReload spends the same budget, whatever its kind.
func (m *Module) decide() Action {
	switch State(m.state.Load()) {
	case StateFailedOpen:
		return ActionFailedOpen
	case StateFailedClosed:
		return ActionFailedClosed
	}
	// Active, or closed and draining: the policy still decides what the caller does.
	switch m.spec.Policy {
	case PolicyFailOpen:
		return ActionFailedOpen
	case PolicyReload:
		now := time.Now()
		kept := m.restarts[:0]
		for _, t := range m.restarts {
			if now.Sub(t) < m.spec.RestartWindow {
				kept = append(kept, t)
			}
		}
		m.restarts = kept
		if len(m.restarts) >= m.spec.RestartBudget {
			return ActionFailedClosed
		}
		m.restarts = append(m.restarts, now)
		m.reloads.Add(1)
		return ActionReloaded
	}
	return ActionFailedClosed
}

// Close stops the module taking new borrows (a waiting borrower gets [ErrClosed]), waits for
// borrowed instances to be released, so calls in flight complete, and then frees the
// instances and the compiled code. If ctx ends first Close returns its error and the module
// finishes draining in the background. Close may be called more than once.
func (m *Module) Close(ctx context.Context) error {
	m.closeOnce.Do(func() {
		m.state.Store(int32(StateClosed))
		close(m.closing)
		go m.drain()
	})
	select {
	case <-m.drained:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close module %s %s: %d instances still borrowed: %w", m.spec.Name, m.spec.Version, m.borrowed.Load(), context.Cause(ctx))
	}
}

// Drained is closed when a closed module has no instance left.
func (m *Module) Drained() <-chan struct{} { return m.drained }

func (m *Module) drain() {
	for range m.spec.MaxInstances {
		<-m.tokens
	}
	m.mu.Lock()
	idle := m.idle
	m.idle = nil
	m.mu.Unlock()
	ctx := context.Background()
	for _, inst := range idle {
		inst.discard(ctx)
	}
	// The compiled code is reference-counted in the shared cache's engine: closing the
	// compiled module drops this version's reference, so the code is freed unless another
	// version with the same bytes still uses it.
	_ = m.cm.Close(ctx)
	if err := m.wr.Close(ctx); err != nil && !errors.Is(err, context.Canceled) {
		m.rt.logger.LogAttrs(ctx, slog.LevelWarn, "close wasm runtime", append(m.attrs[:len(m.attrs):len(m.attrs)], slog.Any("err", err))...)
	}
	m.rt.forget(m)
	close(m.drained)
}
