package fields

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration written as a Go duration string ("250ms", "5s") in JSON and
// YAML, the duration of pipeline definitions and plugin manifests. JSON also takes a whole
// number of nanoseconds, as pipeline definitions always did; YAML takes strings only.
type Duration time.Duration

// durationWant is what FromJSON says a Duration must be.
const durationWant = `a duration such as "250ms" (or whole nanoseconds)`

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a duration string or a whole number of nanoseconds. Its error is a
// *json.UnmarshalTypeError, so that encoding/json adds the key path of the field to it.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return durationTypeError("null")
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n int64
		if err := json.Unmarshal(b, &n); err != nil {
			return durationTypeError(jsonValue(b))
		}
		*d = Duration(n)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return durationTypeError("string " + strconv.Quote(s))
	}
	*d = Duration(v)
	return nil
}

func durationTypeError(value string) error {
	return &json.UnmarshalTypeError{Value: value, Type: reflect.TypeFor[Duration]()}
}

// jsonValue describes a JSON value as encoding/json does in its type errors ("number 1.5",
// "bool", "object").
func jsonValue(b []byte) string {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return "value"
	}
	switch v.(type) {
	case bool:
		return "bool"
	case float64:
		return "number " + string(b)
	case map[string]any:
		return "object"
	case []any:
		return "array"
	}
	return "value"
}

// MarshalYAML writes d as a duration string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// UnmarshalYAML reads a duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		// A type error, which yaml collects with the others of the document and passes on
		// as it is: the line says where the value is.
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: duration %q: %v", n.Line, n.Value, err)}}
	}
	*d = Duration(v)
	return nil
}
