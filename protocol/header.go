package protocol

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Sentinel errors of typed header decoding. A decoder returns a *FieldError that wraps one of
// them, so callers can test with errors.Is and still print which field was wrong.
var (
	// ErrMissingField: a required header field is absent from ExtFields.
	ErrMissingField = errors.New("missing header field")
	// ErrBadField: a header field is present but does not parse as its type.
	ErrBadField = errors.New("bad header field")
)

// FieldError reports the header field a decoder could not accept.
type FieldError struct {
	Field string // the ExtFields key, e.g. "queueId" (or "e" in a SEND_MESSAGE_V2 header)
	Value string // the offending value; empty when the field is missing
	Want  string // what the value should have been, e.g. "int32"; empty when missing
	Err   error  // ErrMissingField or ErrBadField
}

func (e *FieldError) Error() string {
	if errors.Is(e.Err, ErrMissingField) {
		return fmt.Sprintf("header field %q: missing", e.Field)
	}
	return fmt.Sprintf("header field %q: %q is not a valid %s", e.Field, truncateForError(e.Value), e.Want)
}

func (e *FieldError) Unwrap() error { return e.Err }

// truncateForError keeps error messages bounded when a peer sends a huge value.
func truncateForError(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "…"
}

// Header is a typed view of a command's ExtFields: every request and response header type in
// this package implements it.
type Header interface {
	// Encode returns the header's fields as a new map.
	Encode() map[string]string
	// EncodeTo writes the header's fields into ext, which must not be nil.
	EncodeTo(ext map[string]string)
	// Decode reads the header's fields from ext. A missing required field or a malformed
	// value is a *FieldError; optional fields that are absent take their documented defaults.
	Decode(ext map[string]string) error
}

// NewRequestWith makes a request command whose ExtFields are h's fields.
func NewRequestWith(code RequestCode, h Header, body []byte) *Command {
	ext := make(map[string]string, 16)
	if h != nil {
		h.EncodeTo(ext)
	}
	return NewRequest(code, ext, body)
}

// DecodeHeader decodes c's ExtFields into h. The error names the command's code as well as
// the field, since a header error usually ends up in a log line far from the request.
func (c *Command) DecodeHeader(h Header) error {
	if err := h.Decode(c.ExtFields); err != nil {
		code := RequestCode(c.Code).String()
		if c.IsResponse() {
			code = ResponseCode(c.Code).String()
		}
		return fmt.Errorf("decode %s header: %w", code, err)
	}
	return nil
}

// fieldReader reads typed values out of ExtFields and keeps the first error, so a decoder is a
// flat list of reads followed by one error check.
//
// # Notes
//
// Numbers are parsed as Java's Integer.parseInt / Long.parseLong would: optional sign, decimal
// digits, no spaces, range-checked. Booleans accept "true" and "false" in any case; Java's
// Boolean.parseBoolean reads every other string as false, but a value such as "yes" is far more
// likely a bug in the sender than a deliberate false, so it is reported.
type fieldReader struct {
	ext map[string]string
	// raw, when ext is nil, holds the fields of a Command.RawExt block.
	raw []rawField
	// letters, when has is not 0, holds instead a RawExt block whose keys are all one lowercase
	// letter (SEND_MESSAGE_V2's), indexed by letter, the last of a repeated key winning as
	// in a map; has marks the letters present. A lookup is then an index, not a scan of
	// every field: on the broker's inline send path the scans were 5 % of the CPU.
	letters *[26]string
	has     uint32 // 0: no letters
	err     error
	// errp, when set, receives the first error instead of err: a caller whose buffers
	// (raw's, letters) are on its stack reads the error from a variable of its own, since
	// reading it from the reader would let escape analysis move those buffers to the heap.
	errp *error
}

// rawField is one field of a Command.RawExt block.
type rawField struct{ key, value string }

// readerOf returns a fieldReader of cmd's header: its ExtFields, or its RawExt block split
// into buf (grown when it holds more fields).
func readerOf(cmd *Command, buf []rawField) fieldReader {
	if cmd.ExtFields != nil || cmd.RawExt == "" {
		return fieldReader{ext: cmd.ExtFields}
	}
	raw := buf[:0]
	for rest := cmd.RawExt; rest != ""; {
		var f rawField
		f.key, f.value, rest = nextRawField(rest)
		raw = append(raw, f)
	}
	return fieldReader{raw: raw}
}

// readLetters indexes the values of a RawExt block by letter into letters, the last of a
// repeated key winning, when every key is one lowercase letter; has marks the letters
// present. It reports false when a key is not one letter. (A function rather than a method
// setting a reader up: a store through a pointer would move letters to the heap.)
func readLetters(raw string, letters *[26]string) (has uint32, ok bool) {
	for rest := raw; rest != ""; {
		k, v, next := nextRawField(rest)
		if len(k) != 1 || k[0] < 'a' || k[0] > 'z' {
			return 0, false
		}
		letters[k[0]-'a'] = v
		has |= 1 << (k[0] - 'a')
		rest = next
	}
	return has, true
}

func (r *fieldReader) fail(name, value, want string, sentinel error) {
	if r.errp != nil {
		if *r.errp == nil {
			*r.errp = &FieldError{Field: name, Value: value, Want: want, Err: sentinel}
		}
		return
	}
	if r.err == nil {
		r.err = &FieldError{Field: name, Value: value, Want: want, Err: sentinel}
	}
}

// lookup returns the field's value and whether it is present; a missing required field is
// recorded as an error.
func (r *fieldReader) lookup(name string, required bool) (string, bool) {
	var v string
	var ok bool
	if r.has != 0 {
		if len(name) == 1 && name[0] >= 'a' && name[0] <= 'z' {
			i := name[0] - 'a'
			v, ok = r.letters[i], r.has&(1<<i) != 0
		}
	} else if r.ext == nil && r.raw != nil {
		for i := range r.raw {
			// Length and first byte first: the one-letter keys of SEND_MESSAGE_V2 are then
			// told apart without a call to compare memory.
			if k := r.raw[i].key; len(k) == len(name) && (k == "" || k[0] == name[0]) && k == name {
				v, ok = r.raw[i].value, true // the last wins, as in a map
			}
		}
	} else {
		v, ok = r.ext[name]
	}
	if !ok && required {
		r.fail(name, "", "", ErrMissingField)
	}
	return v, ok
}

func (r *fieldReader) str(name string, required bool) string {
	v, _ := r.lookup(name, required)
	return v
}

func (r *fieldReader) int(name string, required bool, bits int, def int64) int64 {
	v, ok := r.lookup(name, required)
	if !ok {
		return def
	}
	n, ok := parseSmallInt(v, bits)
	if ok {
		return n
	}
	n, err := strconv.ParseInt(v, 10, bits)
	if err != nil {
		want := "int64"
		if bits == 32 {
			want = "int32"
		}
		r.fail(name, v, want, ErrBadField)
		return def
	}
	return n
}

// parseSmallInt parses the common number of a header, a sign and up to 18 decimal digits
// (which cannot overflow an int64), in a loop cheaper than strconv.ParseInt's; it reports
// false for anything else, which ParseInt then reads or refuses. A send's header has seven
// numbers, its answer two.
func parseSmallInt(s string, bits int) (int64, bool) {
	digits := s
	if len(s) > 0 && (s[0] == '-' || s[0] == '+') {
		digits = s[1:]
	}
	if len(digits) == 0 || len(digits) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(digits); i++ {
		d := digits[i] - '0'
		if d > 9 {
			return 0, false
		}
		n = n*10 + int64(d)
	}
	if s[0] == '-' {
		n = -n
	}
	if bits == 32 && int64(int32(n)) != n {
		return 0, false
	}
	return n, true
}

func (r *fieldReader) i32(name string, required bool) int32 {
	return int32(r.int(name, required, 32, 0))
}

func (r *fieldReader) i32Or(name string, def int32) int32 {
	return int32(r.int(name, false, 32, int64(def)))
}

func (r *fieldReader) i64(name string, required bool) int64 {
	return r.int(name, required, 64, 0)
}

// optBool reads a boolean; present reports whether the field was there at all.
func (r *fieldReader) optBool(name string, required bool) (value, present bool) {
	v, ok := r.lookup(name, required)
	if !ok {
		return false, false
	}
	switch {
	case strings.EqualFold(v, "true"):
		return true, true
	case strings.EqualFold(v, "false"):
		return false, true
	}
	r.fail(name, v, "boolean", ErrBadField)
	return false, true
}

func (r *fieldReader) bool(name string, required bool) bool {
	v, _ := r.optBool(name, required)
	return v
}

// Encoding helpers. Numbers are decimal; booleans "true"/"false", as every RocketMQ client
// writes them.

func putInt(ext map[string]string, name string, v int64) { ext[name] = strconv.FormatInt(v, 10) }

func putBool(ext map[string]string, name string, v bool) { ext[name] = strconv.FormatBool(v) }

// putStr writes an optional string field, omitting it when empty so that absent and empty
// read back the same.
func putStr(ext map[string]string, name, v string) {
	if v != "" {
		ext[name] = v
	}
}
