package runtime

import (
	"errors"
	"fmt"
	"strings"
)

// Errors returned when a module is loaded. They are wrapped with the module's name and the
// detail (the import, the export, the checksums); branch on them with [errors.Is].
var (
	// ErrInvalidModule: the bytes are not a WebAssembly module, or one wazero cannot compile.
	ErrInvalidModule = errors.New("invalid WebAssembly module")
	// ErrChecksum: the module's SHA-256 is not the one the caller named.
	ErrChecksum = errors.New("module checksum mismatch")
	// ErrImport: the module imports something the host does not offer, or with another
	// signature.
	ErrImport = errors.New("import not offered by the host")
	// ErrExport: a required export is missing or has another signature.
	ErrExport = errors.New("required export missing or mistyped")
	// ErrABIVersion: the ABI marker export is missing, mistyped, or returns another version.
	ErrABIVersion = errors.New("ABI version mismatch")
	// ErrSelfTest: the module's self-test failed, so it was not activated.
	ErrSelfTest = errors.New("self-test failed")
)

// Errors of a call, or of a borrow after a fault.
var (
	// ErrTrap: the guest trapped (unreachable, out-of-bounds access, a Go panic, an exit).
	ErrTrap = errors.New("guest trapped")
	// ErrTimeout: the call ran past the module's time limit and was stopped.
	ErrTimeout = errors.New("guest call timed out")
	// ErrMemory: the guest was refused memory past the module's memory cap and then failed.
	ErrMemory = errors.New("guest exceeded its memory limit")
	// ErrClosed: the module (or runtime, or slot) is closed or draining after a swap.
	ErrClosed = errors.New("module closed")
	// ErrPolicyClosed: a fault closed the module under [PolicyFailClosed], or used up the
	// restart budget of [PolicyReload]; the caller should refuse the work the module guards.
	ErrPolicyClosed = errors.New("module failed closed")
	// ErrPolicyOpen: a fault stopped the module under [PolicyFailOpen]; the caller should
	// bypass the module (for a filter: let everything through).
	ErrPolicyOpen = errors.New("module failed open")
)

// FaultKind is what went wrong in a faulted call. The runtime detects traps, time-outs and
// memory faults itself; the embedding ABI reports the other kinds with [Instance.Fault], so
// that every fault is counted, spends the restart budget and moves the module's state the
// same way.
type FaultKind uint8

const (
	// FaultTrap: the guest trapped ([ErrTrap]).
	FaultTrap FaultKind = iota
	// FaultTimeout: the call ran past [Spec.CallTimeout] ([ErrTimeout]).
	FaultTimeout
	// FaultMemory: the guest was refused memory past its cap and failed ([ErrMemory]).
	FaultMemory
	// FaultBadOutput: the embedder refused the guest's result as malformed (a pointer outside
	// memory, a length that does not fit the input).
	FaultBadOutput
	// FaultGuestError: the guest returned an error code instead of a result.
	FaultGuestError
	// NumFaultKinds is the number of fault kinds, for arrays indexed by kind.
	NumFaultKinds
)

// String is the kind's name in metrics and logs: trap, timeout, memory, bad_output,
// guest_error.
func (k FaultKind) String() string {
	switch k {
	case FaultTrap:
		return "trap"
	case FaultTimeout:
		return "timeout"
	case FaultMemory:
		return "memory"
	case FaultBadOutput:
		return "bad_output"
	case FaultGuestError:
		return "guest_error"
	}
	return fmt.Sprintf("FaultKind(%d)", uint8(k))
}

// sentinel is the error errors.Is matches for the kinds the runtime detects; the embedder's
// kinds are matched through the cause it reported.
func (k FaultKind) sentinel() error {
	switch k {
	case FaultTrap:
		return ErrTrap
	case FaultTimeout:
		return ErrTimeout
	case FaultMemory:
		return ErrMemory
	}
	return nil
}

// Action is what the fault policy did after a fault. The zero value is no action: the fault
// happened while the module was being loaded, which fails the load instead.
type Action int

const (
	// ActionReloaded: the faulted instance was discarded and the module keeps serving with
	// fresh instances ([PolicyReload] within its budget).
	ActionReloaded Action = iota + 1
	// ActionFailedOpen: the module stopped; borrows return [ErrPolicyOpen].
	ActionFailedOpen
	// ActionFailedClosed: the module stopped; borrows return [ErrPolicyClosed].
	ActionFailedClosed
)

func (a Action) String() string {
	switch a {
	case 0:
		return "none"
	case ActionReloaded:
		return "reloaded"
	case ActionFailedOpen:
		return "failed open"
	case ActionFailedClosed:
		return "failed closed"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// FaultError is the error of a call that faulted. errors.Is matches [ErrTrap], [ErrTimeout]
// or [ErrMemory] for those kinds, whatever the cause matches (an embedder's sentinel for the
// other kinds), and, when the policy stopped the module, [ErrPolicyOpen] or
// [ErrPolicyClosed]; errors.As gives the details.
type FaultError struct {
	Module   string    // Spec.Name
	Version  string    // Spec.Version
	Function string    // the export called
	Kind     FaultKind // what went wrong
	Action   Action    // what the fault policy did; zero while the module was loading
	// Stopped is set on the one fault that moved the module from serving to stopped, so
	// that a stop is reported once however many calls faulted at the same time.
	Stopped bool
	Err     error // the cause: what wazero or the embedder reported
}

// Error names the module, the call, the kind and the policy's verdict, with the first line
// of the cause only: wazero appends a multi-line wasm stack trace, which the runtime logs at
// debug level rather than put in front of a user.
func (e *FaultError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "module %s %s: call %s: ", e.Module, e.Version, e.Function)
	if s := e.Kind.sentinel(); s != nil {
		b.WriteString(s.Error())
		b.WriteString(": ")
	}
	b.WriteString(firstLine(e.Err))
	if e.Action != 0 {
		fmt.Fprintf(&b, " (%s)", e.Action)
	}
	return b.String()
}

// Is reports whether target is the fault's kind or the policy's verdict.
func (e *FaultError) Is(target error) bool {
	switch target {
	case nil:
		return false
	case e.Kind.sentinel():
		return true
	case ErrPolicyOpen:
		return e.Action == ActionFailedOpen
	case ErrPolicyClosed:
		return e.Action == ActionFailedClosed
	}
	return false
}

// Unwrap returns the cause.
func (e *FaultError) Unwrap() error { return e.Err }

// firstLine is err's text up to its first line break.
func firstLine(err error) string {
	if err == nil {
		return "unknown cause"
	}
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return strings.TrimRight(s[:i], " \t:")
	}
	return s
}

// oneLine shows only the first line of the error it wraps, which errors.Is and errors.As
// still see whole.
type oneLine struct{ err error }

func (e oneLine) Error() string { return firstLine(e.err) }
func (e oneLine) Unwrap() error { return e.err }
