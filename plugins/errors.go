package plugins

import (
	"errors"
	"fmt"
)

// Errors callers branch on, with [errors.Is]. They are wrapped with the plugin's name and
// the detail.
var (
	// ErrGuest: the guest returned a negative error code (see [GuestError]).
	ErrGuest = errors.New("plugin reported an error")
	// ErrBadOutput: the guest's result is malformed: a pointer outside its memory, a bitmap
	// with bits past the batch, an allocation of the wrong length or naming a member that
	// does not exist, transform output that does not parse.
	ErrBadOutput = errors.New("plugin output malformed")
	// ErrTooLarge: a field does not fit its length prefix (a u16 string over 65 535 bytes).
	ErrTooLarge = errors.New("field too large for the plugin ABI")
	// ErrKind: the plugin is of another kind than the caller needs (a filter used as an
	// allocator).
	ErrKind = errors.New("plugin of another kind")
	// ErrManifest: the manifest is invalid; the message names the field.
	ErrManifest = errors.New("invalid plugin manifest")
	// ErrNotFound: no such plugin or version in the registry.
	ErrNotFound = errors.New("plugin not found")
	// ErrActive: the version is active and cannot be removed.
	ErrActive = errors.New("plugin version is active")
	// ErrExists: the version is already deployed with other contents.
	ErrExists = errors.New("plugin version already deployed")
)

// Error codes of ABI version 1 (see ABI.md).
const (
	CodeGeneric     int32 = -1
	CodeInput       int32 = -2
	CodeNoMemory    int32 = -3
	CodeParams      int32 = -4
	CodeUnsupported int32 = -5
)

// GuestError is the error code a guest returned. errors.Is matches [ErrGuest].
type GuestError struct {
	Code int64
}

func (e *GuestError) Error() string {
	name := "generic"
	switch int32(e.Code) {
	case CodeInput:
		name = "bad input"
	case CodeNoMemory:
		name = "out of memory"
	case CodeParams:
		name = "bad parameters"
	case CodeUnsupported:
		name = "unsupported"
	}
	return fmt.Sprintf("%v: code %d (%s)", ErrGuest, e.Code, name)
}

// Is matches ErrGuest.
func (e *GuestError) Is(target error) bool { return target == ErrGuest }
