// Package fields is what flowd's documents (the daemon's configuration, pipeline
// definitions, plugin manifests) and control requests share about their fields: Error, the
// error naming the field at fault, which a caller reads with errors.As (or Errors) instead
// of taking the message apart, and Duration, the one duration type of their JSON and YAML.
// It imports nothing of flowd, so that config, pipeline/definition, plugins and control
// may all import it.
package fields

import (
	"fmt"
	"strings"
)

// Error names the field at fault in a document or a request.
type Error struct {
	// Field is the field's key path: "sink.topic", "topics[1]", "limits.call_timeout".
	Field string
	// Msg says what is wrong with it; empty when Err says it.
	Msg string
	// Err is the failure behind it, if any; errors.Is sees it.
	Err error
	// Kind is the sentinel of the document or package (ErrManifest, ErrInvalidDefinition,
	// …): the message starts with it, and errors.Is sees it. Nil for none.
	Kind error
}

// Errorf is a field error of kind: field's detail is the formatted message.
func Errorf(kind error, field, format string, args ...any) *Error {
	return &Error{Field: field, Msg: fmt.Sprintf(format, args...), Kind: kind}
}

// Detail says what is wrong with the field, without the field's name.
func (e *Error) Detail() string {
	if e.Msg == "" && e.Err != nil {
		return e.Err.Error()
	}
	return e.Msg
}

// Error reads "<kind>: <field>: <detail>", leaving out what is empty.
func (e *Error) Error() string {
	var b strings.Builder
	if e.Kind != nil {
		b.WriteString(e.Kind.Error() + ": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Detail())
	return b.String()
}

// Unwrap returns Kind and Err, those that are set.
func (e *Error) Unwrap() []error {
	var out []error
	for _, err := range []error{e.Kind, e.Err} {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// Errors returns the field errors err holds, in order, looking through the errors that
// wrap or join them (errors.Join of a document's every problem).
func Errors(err error) []*Error {
	var out []*Error
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case *Error:
			out = append(out, e)
		case interface{ Unwrap() []error }:
			for _, x := range e.Unwrap() {
				walk(x)
			}
		case interface{ Unwrap() error }:
			walk(e.Unwrap())
		}
	}
	walk(err)
	return out
}

// Join is the key path of field within parent: Join("manifest", "limits.call_timeout") is
// "manifest.limits.call_timeout", Join("topics", "[1]") "topics[1]"; an empty side is left out.
func Join(parent, field string) string {
	switch {
	case parent == "":
		return field
	case field == "":
		return parent
	case strings.HasPrefix(field, "["):
		return parent + field
	}
	return parent + "." + field
}
