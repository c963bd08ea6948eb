// Command go-jsonfilter is a flowd filter plugin: it keeps messages whose JSON body has a
// numeric field above a threshold, e.g. orders with "amount" > 100.
//
// Parameters: "threshold" (required, a decimal number) and "field" (default "amount"). The
// manifest must set "wants_body": true. A message whose body lacks the field, or holds
// something other than a number there, is dropped.
//
// The body is scanned, not unmarshalled: no allocation per message, which matters in a Go
// guest whose garbage collector may not run between calls.
package main

import (
	"errors"
	"strconv"

	flowd "github.com/flowd-io/flowd/plugins/sdk/go"
)

func main() {}

var (
	key       []byte // `"field"`, quoted
	threshold float64
)

func init() {
	flowd.OnInit(func() error {
		t, ok := flowd.Param("threshold")
		if !ok {
			return errors.New("parameter threshold is required")
		}
		v, err := strconv.ParseFloat(t, 64)
		if err != nil {
			return err
		}
		threshold = v
		field, ok := flowd.Param("field")
		if !ok {
			field = "amount"
		}
		key = []byte(strconv.Quote(field))
		return nil
	})
	flowd.RegisterFilter(func(m flowd.Message) bool {
		v, ok := number(m.Body, key)
		return ok && v > threshold
	})
}

// number finds key (a quoted JSON string) followed by a colon in body and parses the
// number after it.
func number(body, key []byte) (float64, bool) {
	for i := 0; i+len(key) <= len(body); i++ {
		if body[i] != '"' || string(body[i:i+len(key)]) != string(key) {
			continue
		}
		j := skipSpace(body, i+len(key))
		if j >= len(body) || body[j] != ':' {
			continue
		}
		return parseNumber(body[skipSpace(body, j+1):])
	}
	return 0, false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// parseNumber parses an optionally signed decimal with an optional fraction at the start
// of b (exponents are not supported).
func parseNumber(b []byte) (float64, bool) {
	i, neg := 0, false
	if i < len(b) && b[i] == '-' {
		neg, i = true, i+1
	}
	var v float64
	digits := 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		v = v*10 + float64(b[i]-'0')
		digits++
	}
	if i < len(b) && b[i] == '.' {
		scale := 0.1
		for i++; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
			v += float64(b[i]-'0') * scale
			scale /= 10
			digits++
		}
	}
	if digits == 0 {
		return 0, false
	}
	if neg {
		v = -v
	}
	return v, true
}
