package runtime

import (
	"context"
	"fmt"
	goruntime "runtime"
	"time"

	"github.com/tetratelabs/wazero/api"
)

// Spec describes one module version to load. Zero values take the documented defaults.
type Spec struct {
	// Name names the module in logs, errors and stats. Required.
	Name string
	// Version names this version of the module in logs and errors (free form).
	Version string
	// Wasm is the module's binary.
	Wasm []byte
	// SHA256, when set, is the hex SHA-256 the module must have (from a manifest); a
	// mismatch fails the load with [ErrChecksum], naming both sums.
	SHA256 string

	// MaxInstances bounds the instances of this version, and so the calls in flight on it.
	// Instances are created on demand; a borrower waits when all are in use. Instances are
	// not thread-safe, and a Go guest costs about 10 MB each. Default: GOMAXPROCS.
	MaxInstances int
	// MemoryLimitPages caps each instance's linear memory, in 64 KiB pages. A guest refused
	// memory past the cap that then fails is an [ErrMemory] fault. A Go wasip1 guest needs at
	// least 37 pages to start. Default: 512 (32 MiB).
	MemoryLimitPages uint32
	// CallTimeout limits each call: a guest still running at the limit is stopped, its
	// instance discarded, and the call fails with [ErrTimeout], a fault like a trap. Every
	// call has a limit, so that no guest can hold a goroutine, or the process, for good
	// (see RATIONALE.md). Default: [DefaultCallTimeout]; at most [MaxCallTimeout], and a
	// larger value fails the load.
	CallTimeout time.Duration
	// StartTimeout bounds what a guest runs before it serves: on the first instance its
	// _initialize, Init, the ABI marker and SelfTest together; on every later instance its
	// _initialize and Init. A guest still running at the limit fails the load (or the
	// borrow that made the instance) with [ErrTimeout]. Calls made meanwhile are limited
	// by CallTimeout as well. Default: [DefaultStartTimeout]; at most [MaxCallTimeout].
	StartTimeout time.Duration

	// Policy is applied after a fault. Default: [PolicyFailClosed].
	Policy Policy
	// RestartBudget and RestartWindow bound [PolicyReload]: more than RestartBudget faults
	// within RestartWindow fail the module closed. Defaults: 3 per minute.
	RestartBudget int
	RestartWindow time.Duration

	// Exports are the exports the module must have, with these exact signatures.
	Exports []Export
	// ABI, when ABI.Export is set, is the version marker the module must export.
	ABI ABI
	// Host are host modules offered to the guest besides WASI.
	Host []HostModule

	// Init runs on every new instance after the guest's own initialisation (_initialize),
	// before it is first borrowed: the place to look exported functions up once and keep
	// them, with guest buffers allocated once, in [Instance.SetData]. An error fails the
	// instance (and the load, for the first one).
	Init func(ctx context.Context, inst *Instance) error
	// SelfTest runs once, on the first instance, before the module is activated. An error
	// fails the load with [ErrSelfTest].
	SelfTest func(ctx context.Context, inst *Instance) error

	// LogLines bounds the guest output lines logged per LogInterval, for all instances of the
	// version together; lines past it are dropped and counted ([Stats].LogLinesDropped), and
	// the count is logged when logging resumes. Defaults: 100 lines per second. A line is
	// cut at 4 KiB.
	LogLines    int
	LogInterval time.Duration
}

// Export is a function the module must export.
type Export struct {
	Name    string
	Params  []api.ValueType
	Results []api.ValueType
}

// ABI names the version marker a module must export: a function of no parameters returning
// one i32 or i64, called once on the first instance.
type ABI struct {
	Export  string
	Version uint64
}

// HostModule is a module of host functions offered to guests.
type HostModule struct {
	Name      string
	Functions []HostFunction
}

// HostFunction is one host function. Fn reads its parameters from the stack and writes its
// results there (see [api.GoModuleFunction]).
type HostFunction struct {
	Name    string
	Params  []api.ValueType
	Results []api.ValueType
	Fn      api.GoModuleFunc
}

// Policy is what happens to a module after one of its calls faulted. Whatever the policy,
// the faulted instance is discarded: its memory may be corrupt.
type Policy int

const (
	// PolicyFailClosed stops the module: borrows return [ErrPolicyClosed] until the module is
	// replaced (for a filter: deliver nothing rather than unfiltered data).
	PolicyFailClosed Policy = iota
	// PolicyFailOpen stops the module: borrows return [ErrPolicyOpen] until it is replaced
	// (for a filter: let everything through).
	PolicyFailOpen
	// PolicyReload keeps the module serving with fresh instances, up to Spec.RestartBudget
	// faults per Spec.RestartWindow; one more fails it closed.
	PolicyReload
)

func (p Policy) String() string {
	switch p {
	case PolicyFailClosed:
		return "fail-closed"
	case PolicyFailOpen:
		return "fail-open"
	case PolicyReload:
		return "reload"
	}
	return "Policy(?)"
}

// Time limits of guest code, whatever the Spec says: every call and every start is
// bounded.
const (
	// DefaultCallTimeout is Spec.CallTimeout when it is zero.
	DefaultCallTimeout = time.Second
	// DefaultStartTimeout is Spec.StartTimeout when it is zero.
	DefaultStartTimeout = 2 * time.Second
	// MaxCallTimeout is the most Spec.CallTimeout and Spec.StartTimeout may be: a call
	// holds its caller's goroutine (a pull, a rebalance, a pipeline batch) and a module
	// being closed waits for it.
	MaxCallTimeout = 10 * time.Second
)

const (
	defaultMemoryLimitPages = 512
	defaultRestartBudget    = 3
	defaultRestartWindow    = time.Minute
	defaultLogLines         = 100
	defaultLogInterval      = time.Second
	maxLogLine              = 4 << 10
	maxMemoryPages          = 65536
)

// checkLimits refuses time limits past the ceiling, naming the field.
func (s Spec) checkLimits() error {
	for _, l := range []struct {
		field string
		d     time.Duration
	}{{"CallTimeout", s.CallTimeout}, {"StartTimeout", s.StartTimeout}} {
		if l.d < 0 {
			return fmt.Errorf("spec: %s %v is negative", l.field, l.d)
		}
		if l.d > MaxCallTimeout {
			return fmt.Errorf("spec: %s %v is over the ceiling of %v", l.field, l.d, MaxCallTimeout)
		}
	}
	return nil
}

func (s Spec) withDefaults() Spec {
	if s.CallTimeout == 0 {
		s.CallTimeout = DefaultCallTimeout
	}
	if s.StartTimeout == 0 {
		s.StartTimeout = DefaultStartTimeout
	}
	if s.MaxInstances <= 0 {
		s.MaxInstances = goruntime.GOMAXPROCS(0)
	}
	if s.MemoryLimitPages == 0 {
		s.MemoryLimitPages = defaultMemoryLimitPages
	}
	if s.MemoryLimitPages > maxMemoryPages {
		s.MemoryLimitPages = maxMemoryPages
	}
	if s.RestartBudget <= 0 {
		s.RestartBudget = defaultRestartBudget
	}
	if s.RestartWindow <= 0 {
		s.RestartWindow = defaultRestartWindow
	}
	if s.LogLines <= 0 {
		s.LogLines = defaultLogLines
	}
	if s.LogInterval <= 0 {
		s.LogInterval = defaultLogInterval
	}
	return s
}
