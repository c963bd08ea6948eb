// Command go-redact is a flowd transform plugin: it replaces the value of one JSON field of
// each message body with "***", e.g. a card number, and passes tags, keys and properties
// through. A body without the field passes unchanged.
//
// Parameter: "field" (default "card").
package main

import (
	"strconv"

	flowd "github.com/flowd-io/flowd/plugins/sdk/go"
)

func main() {}

var (
	key  []byte // `"field"`, quoted
	body []byte // reused: the SDK copies outputs as soon as the transform returns
	out  = make([]flowd.Output, 1)
)

func init() {
	flowd.OnInit(func() error {
		field, ok := flowd.Param("field")
		if !ok {
			field = "card"
		}
		key = []byte(strconv.Quote(field))
		return nil
	})
	flowd.RegisterTransform(func(m flowd.Message) []flowd.Output {
		out[0] = flowd.Output{Tags: m.Tags, Keys: m.Keys, Properties: m.Properties, Body: redact(m.Body)}
		return out
	})
}

// redact returns b with the value after every `"field":` replaced by "***".
func redact(b []byte) []byte {
	body = body[:0]
	i := 0
	for i < len(b) {
		if b[i] != '"' || i+len(key) > len(b) || string(b[i:i+len(key)]) != string(key) {
			body = append(body, b[i])
			i++
			continue
		}
		j := i + len(key)
		for j < len(b) && (b[j] == ' ' || b[j] == '\t' || b[j] == '\n' || b[j] == '\r') {
			j++
		}
		if j >= len(b) || b[j] != ':' {
			body = append(body, b[i])
			i++
			continue
		}
		j++
		for j < len(b) && (b[j] == ' ' || b[j] == '\t' || b[j] == '\n' || b[j] == '\r') {
			j++
		}
		body = append(body, b[i:j]...)
		body = append(body, `"***"`...)
		i = skipValue(b, j)
	}
	return body
}

// skipValue returns the end of the JSON scalar or string starting at b[i]. Objects and
// arrays are redacted up to their first delimiter only; redact scalars.
func skipValue(b []byte, i int) int {
	if i < len(b) && b[i] == '"' {
		for i++; i < len(b); i++ {
			switch b[i] {
			case '\\':
				i++
			case '"':
				return i + 1
			}
		}
		return len(b)
	}
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' {
		i++
	}
	return i
}
