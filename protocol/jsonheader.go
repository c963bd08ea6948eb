package protocol

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// The JSON header codec is hand-written: every request and response goes through it, and
// encoding/json took 5 µs to encode and 11 µs to decode a typical pull request header (28 and
// 52 allocations). This one writes the same JSON and accepts exactly what encoding/json
// accepts when decoding into the header struct with extFields values taken as their text (see
// extFields) — the fuzz tests check both claims against encoding/json — including its quirks:
// field names match case-insensitively, the last of duplicate fields wins, null leaves a field
// alone (but resets extFields), invalid UTF-8 in strings becomes U+FFFD.

// maxJSONNesting is encoding/json's own nesting limit, kept so that the two accept the same
// inputs.
const maxJSONNesting = 10000

func (c *Command) appendJSONHeader(dst []byte) ([]byte, error) {
	dst = append(dst, `{"code":`...)
	dst = strconv.AppendInt(dst, int64(c.Code), 10)
	dst = append(dst, `,"language":"`...)
	dst = append(dst, c.Language.String()...)
	dst = append(dst, `","version":`...)
	dst = strconv.AppendInt(dst, int64(c.Version), 10)
	dst = append(dst, `,"opaque":`...)
	dst = strconv.AppendInt(dst, int64(c.Opaque), 10)
	dst = append(dst, `,"flag":`...)
	dst = strconv.AppendInt(dst, int64(c.Flag), 10)
	if c.Remark != "" {
		dst = append(dst, `,"remark":`...)
		dst = appendJSONString(dst, c.Remark)
	}
	if len(c.ExtFields) > 0 || c.Fields != nil {
		dst = append(dst, `,"extFields":{`...)
		var stack [24]string
		for i, k := range sortedKeys(c.ExtFields, stack[:0]) {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendJSONString(dst, k)
			dst = append(dst, ':')
			dst = appendJSONString(dst, c.ExtFields[k])
		}
		if c.Fields != nil {
			var err error
			if dst, err = c.appendFields(dst, true, len(c.ExtFields)); err != nil {
				return dst, err
			}
		}
		dst = append(dst, '}')
	}
	return append(dst, '}'), nil
}

// sortedKeys returns m's keys in order, in buf when it is large enough. Sorted keys make
// encodings deterministic, which golden tests and byte-level comparisons rely on.
func sortedKeys(m map[string]string, buf []string) []string {
	keys := buf[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

var errJSONSyntax = errors.New("JSON syntax error")

// jsonReader is a strict JSON scanner over one header.
type jsonReader struct {
	b   []byte
	pos int
	// whole is b as one string, made on the first string value: strings without escapes
	// are sliced out of it, so a header costs one allocation for all its strings.
	whole string
}

func (r *jsonReader) syntaxf(format string, args ...any) error {
	return fmt.Errorf("%w at byte %d: %s", errJSONSyntax, r.pos, fmt.Sprintf(format, args...))
}

func (r *jsonReader) ws() {
	for r.pos < len(r.b) {
		switch r.b[r.pos] {
		case ' ', '\t', '\n', '\r':
			r.pos++
		default:
			return
		}
	}
}

func (r *jsonReader) peek() byte {
	if r.pos < len(r.b) {
		return r.b[r.pos]
	}
	return 0
}

// literal consumes "true", "false" or "null".
func (r *jsonReader) literal() (string, error) {
	for _, lit := range [...]string{"true", "false", "null"} {
		if bytes.HasPrefix(r.b[r.pos:], []byte(lit)) {
			r.pos += len(lit)
			return lit, nil
		}
	}
	return "", r.syntaxf("invalid character %q looking for a value", r.peek())
}

// number consumes a JSON number and returns its text.
func (r *jsonReader) number() ([]byte, error) {
	start := r.pos
	if r.peek() == '-' {
		r.pos++
	}
	switch c := r.peek(); {
	case c == '0':
		r.pos++
	case c >= '1' && c <= '9':
		for r.pos < len(r.b) && r.b[r.pos] >= '0' && r.b[r.pos] <= '9' {
			r.pos++
		}
	default:
		return nil, r.syntaxf("invalid number")
	}
	if r.peek() == '.' {
		r.pos++
		if !r.digits() {
			return nil, r.syntaxf("invalid number: no digits after '.'")
		}
	}
	if c := r.peek(); c == 'e' || c == 'E' {
		r.pos++
		if c := r.peek(); c == '+' || c == '-' {
			r.pos++
		}
		if !r.digits() {
			return nil, r.syntaxf("invalid number: no digits in exponent")
		}
	}
	return r.b[start:r.pos], nil
}

func (r *jsonReader) digits() bool {
	start := r.pos
	for r.pos < len(r.b) && r.b[r.pos] >= '0' && r.b[r.pos] <= '9' {
		r.pos++
	}
	return r.pos > start
}

// str consumes a string literal and returns its value, unescaped, with invalid UTF-8 replaced
// by U+FFFD byte by byte as encoding/json does.
func (r *jsonReader) str() (string, error) {
	if r.peek() != '"' {
		return "", r.syntaxf("expected a string")
	}
	r.pos++
	start := r.pos
	for r.pos < len(r.b) {
		c := r.b[r.pos]
		switch {
		case c == '"':
			s := r.b[start:r.pos]
			r.pos++
			return r.substring(start, len(s)), nil
		case c == '\\' || c < 0x20:
			return r.strSlow(start)
		case c < utf8.RuneSelf:
			r.pos++
		default:
			ch, size := utf8.DecodeRune(r.b[r.pos:])
			if ch == utf8.RuneError && size == 1 {
				return r.strSlow(start)
			}
			r.pos += size
		}
	}
	return "", r.syntaxf("unterminated string")
}

// substring returns b[start:start+n] as a string sharing r.whole's memory.
func (r *jsonReader) substring(start, n int) string {
	if n == 0 {
		return ""
	}
	if r.whole == "" {
		r.whole = string(r.b)
	}
	return r.whole[start : start+n]
}

// strSlow decodes a string that has escapes or invalid UTF-8; start is just after the quote.
func (r *jsonReader) strSlow(start int) (string, error) {
	// Unescaped, a string is no longer than the rest of the header (but for invalid UTF-8,
	// each byte of which grows to three): one allocation for a properties value full of
	// \u0001 and \u0002 escapes, where growing from a small buffer took two or three.
	// A strings.Builder hands its buffer over as the string: one allocation, not two.
	var out strings.Builder
	out.Grow(len(r.b) - start)
	out.Write(r.b[start:r.pos])
	for r.pos < len(r.b) {
		c := r.b[r.pos]
		switch {
		case c == '"':
			r.pos++
			return out.String(), nil
		case c < 0x20:
			return "", r.syntaxf("invalid character %q in string literal", c)
		case c == '\\':
			if r.pos+1 >= len(r.b) {
				return "", r.syntaxf("unterminated escape")
			}
			e := r.b[r.pos+1]
			r.pos += 2
			switch e {
			case '"', '\\', '/':
				out.WriteByte(e)
			case 'b':
				out.WriteByte('\b')
			case 'f':
				out.WriteByte('\f')
			case 'n':
				out.WriteByte('\n')
			case 'r':
				out.WriteByte('\r')
			case 't':
				out.WriteByte('\t')
			case 'u':
				ch, ok := hex4(r.b[r.pos:])
				if !ok {
					return "", r.syntaxf("invalid \\u escape")
				}
				r.pos += 4
				if utf16.IsSurrogate(ch) {
					// A valid pair is consumed whole; anything else makes this half
					// U+FFFD and leaves what follows to be read on its own.
					if len(r.b) >= r.pos+6 && r.b[r.pos] == '\\' && r.b[r.pos+1] == 'u' {
						if lo, ok := hex4(r.b[r.pos+2:]); ok {
							if dec := utf16.DecodeRune(ch, lo); dec != utf8.RuneError {
								r.pos += 6
								out.WriteRune(dec)
								continue
							}
						}
					}
					ch = utf8.RuneError
				}
				out.WriteRune(ch)
			default:
				return "", r.syntaxf("invalid escape '\\%c'", e)
			}
		case c < utf8.RuneSelf:
			out.WriteByte(c)
			r.pos++
		default:
			ch, size := utf8.DecodeRune(r.b[r.pos:])
			out.WriteRune(ch) // RuneError for each invalid byte
			r.pos += size
		}
	}
	return "", r.syntaxf("unterminated string")
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var v rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		v = v<<4 | rune(c)
	}
	return v, true
}

// skip consumes and validates any value; depth is the number of objects and arrays already
// open around it, and like encoding/json it refuses to open more than maxJSONNesting.
func (r *jsonReader) skip(depth int) error {
	if c := r.peek(); (c == '{' || c == '[') && depth >= maxJSONNesting {
		return r.syntaxf("exceeded max depth")
	}
	switch c := r.peek(); {
	case c == '"':
		_, err := r.str()
		return err
	case c == '{':
		r.pos++
		r.ws()
		if r.peek() == '}' {
			r.pos++
			return nil
		}
		for {
			if _, err := r.str(); err != nil {
				return err
			}
			if err := r.colon(); err != nil {
				return err
			}
			if err := r.skip(depth + 1); err != nil {
				return err
			}
			if end, err := r.next('}'); end || err != nil {
				return err
			}
		}
	case c == '[':
		r.pos++
		r.ws()
		if r.peek() == ']' {
			r.pos++
			return nil
		}
		for {
			r.ws()
			if err := r.skip(depth + 1); err != nil {
				return err
			}
			if end, err := r.next(']'); end || err != nil {
				return err
			}
		}
	case c == '-' || (c >= '0' && c <= '9'):
		_, err := r.number()
		return err
	default:
		_, err := r.literal()
		return err
	}
}

func (r *jsonReader) colon() error {
	r.ws()
	if r.peek() != ':' {
		return r.syntaxf("expected ':' after object key")
	}
	r.pos++
	r.ws()
	return nil
}

// next consumes the ',' or the closing byte after a member; it reports whether the object or
// array ended.
func (r *jsonReader) next(closing byte) (bool, error) {
	r.ws()
	switch r.peek() {
	case ',':
		r.pos++
		r.ws()
		return false, nil
	case closing:
		r.pos++
		return true, nil
	}
	return false, r.syntaxf("expected ',' or %q", closing)
}

// intField reads a number into an integer field of the given width; null leaves it alone. A
// value of another type or out of range is a *fieldTypeError (the value has been consumed, so
// the caller may go on reading); any other error is a syntax error.
func (r *jsonReader) intField(name string, bits int, old int64) (int64, error) {
	start := r.pos
	switch c := r.peek(); {
	case c == 'n':
		lit, err := r.literal()
		if err != nil {
			return old, err
		}
		if lit != "null" {
			return old, r.fieldType(name, fmt.Sprintf("an int%d", bits), start)
		}
		return old, nil
	case c == '-' || (c >= '0' && c <= '9'):
		lit, err := r.number()
		if err != nil {
			return old, err
		}
		n, err := strconv.ParseInt(string(lit), 10, bits)
		if err != nil {
			return old, r.fieldType(name, fmt.Sprintf("an int%d", bits), start)
		}
		return n, nil
	}
	if err := r.skip(1); err != nil {
		return old, err
	}
	return old, r.fieldType(name, fmt.Sprintf("an int%d", bits), start)
}

// strField reads a string field; null leaves it alone.
func (r *jsonReader) strField(name, old string) (string, error) {
	start := r.pos
	switch r.peek() {
	case '"':
		return r.str()
	case 'n':
		lit, err := r.literal()
		if err != nil {
			return old, err
		}
		if lit == "null" {
			return old, nil
		}
	default:
		if err := r.skip(1); err != nil {
			return old, err
		}
	}
	return old, r.fieldType(name, "a string", start)
}

// fieldTypeError is a header field whose JSON value is well formed but of the wrong type or
// out of range. It is not a syntax error: the value was consumed, and the rest of the header
// can still be read (its opaque, to answer the request).
type fieldTypeError struct {
	field, value, want string
}

func (e *fieldTypeError) Error() string {
	return fmt.Sprintf("header field %q: %s is not %s", e.field, e.value, e.want)
}

// fieldType reports that the value read since start does not fit field name.
func (r *jsonReader) fieldType(name, want string, start int) error {
	return &fieldTypeError{field: name, value: truncateForError(string(r.b[start:r.pos])), want: want}
}

// language reads the "language" field: a name, or (from some old clients) a number.
func (r *jsonReader) language() (LanguageCode, error) {
	switch c := r.peek(); {
	case c == '"':
		s, err := r.str()
		return ParseLanguage(s), err
	case c == '-' || (c >= '0' && c <= '9'):
		lit, err := r.number()
		if err != nil {
			return LangOther, err
		}
		if n, err := strconv.ParseInt(string(lit), 10, 8); err == nil {
			return LanguageCode(n), nil
		}
		return LangOther, nil
	}
	return LangOther, r.skip(1)
}

// extFields reads the extFields object into m (created when nil); null resets it to nil.
//
// A value may be of any JSON type, as the Java broker accepts it (fastjson reads extFields
// into a HashMap<String,String>, turning every value into its text): a string is its value; a
// number, true or false is its literal text exactly as sent ("0", "-1", "1.5", "1e3"); an
// object or an array is its raw JSON text; null removes the key, as if it were absent. The
// typed headers then parse the text as they parse a string.
func (r *jsonReader) extFields(m map[string]string) (map[string]string, error) {
	start := r.pos
	switch r.peek() {
	case 'n':
		lit, err := r.literal()
		if err != nil {
			return m, err
		}
		if lit == "null" {
			return nil, nil
		}
		return m, r.fieldType("extFields", "an object", start)
	case '{':
	default:
		if err := r.skip(1); err != nil {
			return m, err
		}
		return m, r.fieldType("extFields", "an object", start)
	}
	r.pos++
	if m == nil {
		m = make(map[string]string, 16)
	}
	r.ws()
	if r.peek() == '}' {
		r.pos++
		return m, nil
	}
	for {
		k, err := r.str()
		if err != nil {
			return m, err
		}
		if err := r.colon(); err != nil {
			return m, err
		}
		v, present, err := r.extValue()
		if err != nil {
			return m, fmt.Errorf("%w (key %q)", err, truncateForError(k))
		}
		if present {
			m[k] = v
		} else {
			delete(m, k)
		}
		if end, err := r.next('}'); end || err != nil {
			return m, err
		}
	}
}

// extValue reads one extFields value as its text (see extFields); present is false for null.
func (r *jsonReader) extValue() (v string, present bool, err error) {
	if r.peek() == '"' {
		v, err = r.str()
		return v, true, err
	}
	start := r.pos
	// Two levels are open around the value: the header and extFields.
	if err := r.skip(2); err != nil {
		return "", false, err
	}
	if raw := r.b[start:r.pos]; string(raw) == "null" {
		return "", false, nil
	}
	return r.substring(start, r.pos-start), true, nil
}

// Field names of the JSON header, for case-insensitive matching.
var (
	jsonKeyCode      = []byte("code")
	jsonKeyLanguage  = []byte("language")
	jsonKeyVersion   = []byte("version")
	jsonKeyOpaque    = []byte("opaque")
	jsonKeyFlag      = []byte("flag")
	jsonKeyRemark    = []byte("remark")
	jsonKeyExtFields = []byte("extFields")
)

// decodeJSONHeader decodes a JSON header. Unknown fields (Java's serializeTypeCurrentRPC, for
// one) are skipped; the whole input must still be valid JSON. An error is a *HeaderError.
func decodeJSONHeader(b []byte) (*Command, error) {
	c, opaqueKnown, err := parseJSONHeader(b)
	if err != nil {
		he := &HeaderError{Serialize: JSON, Err: fmt.Errorf("decode JSON header: %w", err)}
		if c != nil {
			he.Code, he.Flag = c.Code, c.Flag
			he.Opaque, he.OpaqueKnown = c.Opaque, opaqueKnown
		}
		return nil, he
	}
	if c.ExtFields == nil {
		c.ExtFields = map[string]string{}
	}
	return c, nil
}

// parseJSONHeader reads a header. A field of the wrong type does not stop it: like
// encoding/json it reads on and reports the first such error at the end, so that the opaque
// of a header with one bad field is still known and the request can be answered. A syntax
// error stops it; the command then holds the fields read before it. opaqueKnown reports
// whether c.Opaque is the opaque the peer sent (or its absence, 0, in a header read to its
// end).
func parseJSONHeader(b []byte) (c *Command, opaqueKnown bool, err error) {
	r := jsonReader{b: b}
	c = &Command{Language: LangOther}
	r.ws()
	if r.peek() == 'n' {
		// encoding/json accepts a top-level null and leaves everything unset.
		lit, err := r.literal()
		if err == nil && lit != "null" {
			err = r.fieldType("header", "an object", 0)
		}
		if err == nil {
			err = r.end()
		}
		return c, false, err
	}
	if r.peek() != '{' {
		if err := r.skip(0); err != nil {
			return c, false, err
		}
		if err := r.end(); err != nil {
			return c, false, err
		}
		return c, false, errors.New("JSON header is not an object")
	}
	r.pos++
	r.ws()
	if r.peek() == '}' {
		r.pos++
		return c, true, r.end()
	}
	var keyBuf [32]byte
	var n int64
	var fieldErr error // the first field of the wrong type
	opaqueSeen, opaqueBad := false, false
	for {
		key, err := r.key(keyBuf[:0])
		if err != nil {
			return c, opaqueSeen && !opaqueBad, err
		}
		if err := r.colon(); err != nil {
			return c, opaqueSeen && !opaqueBad, err
		}
		switch {
		case bytes.EqualFold(key, jsonKeyCode):
			n, err = r.intField("code", 32, int64(c.Code))
			c.Code = int32(n)
		case bytes.EqualFold(key, jsonKeyLanguage):
			c.Language, err = r.language()
		case bytes.EqualFold(key, jsonKeyVersion):
			n, err = r.intField("version", 16, int64(c.Version))
			c.Version = int16(n)
		case bytes.EqualFold(key, jsonKeyOpaque):
			n, err = r.intField("opaque", 32, int64(c.Opaque))
			c.Opaque = int32(n)
			opaqueSeen = true
			if err != nil {
				opaqueBad = true
			}
		case bytes.EqualFold(key, jsonKeyFlag):
			n, err = r.intField("flag", 32, int64(c.Flag))
			c.Flag = int32(n)
		case bytes.EqualFold(key, jsonKeyRemark):
			c.Remark, err = r.strField("remark", c.Remark)
		case bytes.EqualFold(key, jsonKeyExtFields):
			c.ExtFields, err = r.extFields(c.ExtFields)
		default:
			err = r.skip(1)
		}
		if err != nil {
			var fe *fieldTypeError
			if !errors.As(err, &fe) {
				return c, opaqueSeen && !opaqueBad, err
			}
			if fieldErr == nil {
				fieldErr = err
			}
		}
		end, err := r.next('}')
		if err != nil {
			return c, opaqueSeen && !opaqueBad, err
		}
		if end {
			if err := r.end(); err != nil {
				return c, opaqueSeen && !opaqueBad, err
			}
			return c, !opaqueBad, fieldErr
		}
	}
}

// key reads an object key into buf without allocating when it is short and unescaped.
func (r *jsonReader) key(buf []byte) ([]byte, error) {
	if r.peek() != '"' {
		return nil, r.syntaxf("expected a string for an object key")
	}
	for i := r.pos + 1; i < len(r.b); i++ {
		c := r.b[i]
		if c == '"' {
			k := append(buf, r.b[r.pos+1:i]...)
			r.pos = i + 1
			return k, nil
		}
		if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			break
		}
	}
	s, err := r.str()
	return []byte(s), err
}

// end checks that nothing but whitespace follows the top-level value.
func (r *jsonReader) end() error {
	r.ws()
	if r.pos != len(r.b) {
		return r.syntaxf("invalid character %q after top-level value", r.b[r.pos])
	}
	return nil
}
