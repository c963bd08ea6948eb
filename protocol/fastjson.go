package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// ErrMalformedJSON is wrapped by every JSON body decoding error.
var ErrMalformedJSON = errors.New("malformed JSON body")

// maxJSONDepth bounds the nesting the key normalizer follows. The bodies it reads nest four
// levels deep at most; the bound only keeps hostile input from exhausting the stack.
const maxJSONDepth = 128

// quoteObjectKeys rewrites fastjson's non-standard object keys into JSON strings so that
// encoding/json can read the result:
//
//	{0:"127.0.0.1:10911"}                               → {"0":"127.0.0.1:10911"}
//	{{"brokerName":"b","queueId":0,"topic":"t"}:42}     → {"{\"brokerName\":\"b\",\"queueId\":0,\"topic\":\"t\"}":42}
//
// fastjson writes a Map<Integer, String> with bare integer keys and a Map<MessageQueue, Long>
// with object keys. Everything else passes through unchanged, and encoding/json still
// validates the result. A key that is itself an object is normalized too before it is quoted.
func quoteObjectKeys(b []byte) ([]byte, error) {
	n := keyNormalizer{in: b, out: make([]byte, 0, len(b)+len(b)/8+16)}
	n.ws()
	if err := n.value(0); err != nil {
		return nil, err
	}
	n.ws()
	if n.pos != len(n.in) {
		return nil, n.errorf("unexpected %q after the top-level value", n.in[n.pos])
	}
	return n.out, nil
}

type keyNormalizer struct {
	in  []byte
	pos int
	out []byte
}

func (n *keyNormalizer) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: at byte %d: %s", ErrMalformedJSON, n.pos, fmt.Sprintf(format, args...))
}

func (n *keyNormalizer) ws() {
	for n.pos < len(n.in) {
		switch n.in[n.pos] {
		case ' ', '\t', '\n', '\r':
			n.out = append(n.out, n.in[n.pos])
			n.pos++
		default:
			return
		}
	}
}

func (n *keyNormalizer) value(depth int) error {
	if depth > maxJSONDepth {
		return n.errorf("nested deeper than %d", maxJSONDepth)
	}
	if n.pos >= len(n.in) {
		return n.errorf("unexpected end of input")
	}
	switch n.in[n.pos] {
	case '{':
		return n.object(depth)
	case '[':
		return n.array(depth)
	case '"':
		return n.str()
	default:
		return n.bare()
	}
}

func (n *keyNormalizer) object(depth int) error {
	n.out = append(n.out, '{')
	n.pos++
	n.ws()
	if n.pos < len(n.in) && n.in[n.pos] == '}' {
		n.out = append(n.out, '}')
		n.pos++
		return nil
	}
	for {
		if err := n.key(depth); err != nil {
			return err
		}
		n.ws()
		if n.pos >= len(n.in) || n.in[n.pos] != ':' {
			return n.errorf("expected ':' after an object key")
		}
		n.out = append(n.out, ':')
		n.pos++
		n.ws()
		if err := n.value(depth + 1); err != nil {
			return err
		}
		n.ws()
		if n.pos >= len(n.in) {
			return n.errorf("unterminated object")
		}
		switch n.in[n.pos] {
		case ',':
			n.out = append(n.out, ',')
			n.pos++
			n.ws()
		case '}':
			n.out = append(n.out, '}')
			n.pos++
			return nil
		default:
			return n.errorf("expected ',' or '}' in an object, found %q", n.in[n.pos])
		}
	}
}

// key copies a string key as is and turns any other value into a string holding its
// (normalized) JSON text.
func (n *keyNormalizer) key(depth int) error {
	if n.pos < len(n.in) && n.in[n.pos] == '"' {
		return n.str()
	}
	outer := n.out
	n.out = nil
	if err := n.value(depth + 1); err != nil {
		return err
	}
	raw := n.out
	n.out = appendJSONString(outer, raw)
	return nil
}

func (n *keyNormalizer) array(depth int) error {
	n.out = append(n.out, '[')
	n.pos++
	n.ws()
	if n.pos < len(n.in) && n.in[n.pos] == ']' {
		n.out = append(n.out, ']')
		n.pos++
		return nil
	}
	for {
		if err := n.value(depth + 1); err != nil {
			return err
		}
		n.ws()
		if n.pos >= len(n.in) {
			return n.errorf("unterminated array")
		}
		switch n.in[n.pos] {
		case ',':
			n.out = append(n.out, ',')
			n.pos++
			n.ws()
		case ']':
			n.out = append(n.out, ']')
			n.pos++
			return nil
		default:
			return n.errorf("expected ',' or ']' in an array, found %q", n.in[n.pos])
		}
	}
}

// str copies a string literal, escapes included; encoding/json validates it later.
func (n *keyNormalizer) str() error {
	start := n.pos
	n.pos++
	for n.pos < len(n.in) {
		switch n.in[n.pos] {
		case '\\':
			n.pos += 2
			continue
		case '"':
			n.pos++
			n.out = append(n.out, n.in[start:n.pos]...)
			return nil
		}
		n.pos++
	}
	n.pos = start
	return n.errorf("unterminated string")
}

// bare copies a number or literal: everything up to the next structural character.
func (n *keyNormalizer) bare() error {
	start := n.pos
	for n.pos < len(n.in) {
		switch n.in[n.pos] {
		case ',', ':', '}', ']', '{', '[', '"', ' ', '\t', '\n', '\r':
			goto done
		}
		n.pos++
	}
done:
	if n.pos == start {
		return n.errorf("unexpected %q", n.in[n.pos])
	}
	n.out = append(n.out, n.in[start:n.pos]...)
	return nil
}

// unmarshalTolerant decodes a JSON body into v, accepting fastjson's non-string object keys.
// Standard JSON takes the fast path straight into encoding/json.
func unmarshalTolerant(b []byte, v any) error {
	if !json.Valid(b) {
		fixed, err := quoteObjectKeys(b)
		if err != nil {
			return err
		}
		b = fixed
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformedJSON, err)
	}
	return nil
}

// appendJSONString appends s as a JSON string literal. It escapes '"', '\\' and control
// characters, and replaces invalid UTF-8 with U+FFFD as encoding/json does; everything else,
// including '<', '>' and '&', is written as is.
func appendJSONString[S ~string | ~[]byte](dst []byte, s S) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', upperHex[c>>4], upperHex[c&0xF])
			}
			i++
			start = i
			continue
		}
		var r rune
		var size int
		switch v := any(s).(type) {
		case string:
			r, size = utf8.DecodeRuneInString(v[i:])
		case []byte:
			r, size = utf8.DecodeRune(v[i:])
		default:
			r, size = utf8.DecodeRuneInString(string(s[i:]))
		}
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
