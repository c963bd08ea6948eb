package fields

import (
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
)

// FromJSON is the field error of kind that a strict decoding error of encoding/json is
// about: a value of the wrong type ("limits.memory_pages: must be a number, not string"), a
// Duration that does not parse, or an unknown field (with DisallowUnknownFields). It is nil
// for an error that names no field: not JSON, the document itself of the wrong type.
func FromJSON(kind, err error) *Error {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		if typeErr.Field == "" {
			return nil
		}
		want := jsonKind(typeErr.Type)
		if typeErr.Type == reflect.TypeFor[Duration]() {
			want = durationWant
		}
		return &Error{Field: typeErr.Field, Msg: "must be " + want + ", not " + typeErr.Value, Err: err, Kind: kind}
	}
	// encoding/json reports an unknown field with this message alone (no error type, no key
	// path): this is the one place flowd reads it.
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if f, uerr := strconv.Unquote(name); uerr == nil {
			name = f
		}
		return &Error{Field: name, Msg: "unknown field", Err: err, Kind: kind}
	}
	return nil
}

// jsonKind names a Go type the way a JSON user knows it.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "a " + t.Kind().String()
}
