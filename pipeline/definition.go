package pipeline

import (
	"fmt"

	"github.com/flowd-io/flowd/pipeline/definition"
)

// A pipeline's definition is plain data in package definition, which the daemon's config
// imports without what running a pipeline takes (consumer, Wasm runtime, NATS). These
// aliases keep pipeline's API as it was, so that pipeline's own code and its callers need
// no change.

type (
	// Definition is definition.Definition.
	Definition = definition.Definition
	// Selector is definition.Selector.
	Selector = definition.Selector
	// SinkDefinition is definition.SinkDefinition.
	SinkDefinition = definition.SinkDefinition
	// Duration is definition.Duration.
	Duration = definition.Duration
	// FieldError is definition.FieldError.
	FieldError = definition.FieldError
)

// ErrInvalidDefinition is wrapped by every validation error of a Definition.
var ErrInvalidDefinition = definition.ErrInvalidDefinition

// Selector types, start positions, sink types and the defaults of the optional fields, as
// in package definition.
const (
	SelectorTag   = definition.SelectorTag
	SelectorSQL92 = definition.SelectorSQL92
	SelectorWasm  = definition.SelectorWasm

	StartFirst     = definition.StartFirst
	StartLast      = definition.StartLast
	StartTimestamp = definition.StartTimestamp

	SinkTopic   = definition.SinkTopic
	SinkNATS    = definition.SinkNATS
	SinkWebhook = definition.SinkWebhook
	SinkFile    = definition.SinkFile
	SinkStdout  = definition.SinkStdout

	DefaultParallelism  = definition.DefaultParallelism
	DefaultMaxAttempts  = definition.DefaultMaxAttempts
	DefaultRetryBackoff = definition.DefaultRetryBackoff
	DefaultMaxBackoff   = definition.DefaultMaxBackoff
	DefaultSinkTimeout  = definition.DefaultSinkTimeout
)

// FieldErrors returns the field errors err holds (definition.FieldErrors).
func FieldErrors(err error) []*FieldError { return definition.FieldErrors(err) }

// invalid is a definition field in error.
func invalid(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...), Kind: ErrInvalidDefinition}
}

// badArgument is a request field in error: it wraps ErrInvalidArgument and err.
func badArgument(field string, err error) error {
	return &FieldError{Field: field, Err: err, Kind: ErrInvalidArgument}
}

// badRequestField is a request field in error, said by a message: it wraps
// ErrInvalidArgument.
func badRequestField(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...), Kind: ErrInvalidArgument}
}
