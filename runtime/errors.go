package runtime

import (
	"errors"
	"fmt"
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

// Action is what the fault policy did after a fault.
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
	case ActionReloaded:
		return "reloaded"
	case ActionFailedOpen:
		return "failed open"
	case ActionFailedClosed:
		return "failed closed"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// FaultError is the error of a call that faulted. errors.Is matches its Kind ([ErrTrap],
// [ErrTimeout] or [ErrMemory]) and, when the fault stopped the module, [ErrPolicyOpen] or
// [ErrPolicyClosed]; errors.As gives the details.
type FaultError struct {
	Module   string // Spec.Name
	Version  string // Spec.Version
	Function string // the export called
	Kind     error  // ErrTrap, ErrTimeout or ErrMemory
	Action   Action // what the fault policy did
	Err      error  // what wazero reported
}

func (e *FaultError) Error() string {
	return fmt.Sprintf("module %s %s: call %s: %v (%s): %v", e.Module, e.Version, e.Function, e.Kind, e.Action, e.Err)
}

// Is reports whether target is the fault's kind or the policy's verdict.
func (e *FaultError) Is(target error) bool {
	switch target {
	case e.Kind:
		return true
	case ErrPolicyOpen:
		return e.Action == ActionFailedOpen
	case ErrPolicyClosed:
		return e.Action == ActionFailedClosed
	}
	return false
}

// Unwrap returns wazero's error.
func (e *FaultError) Unwrap() error { return e.Err }
