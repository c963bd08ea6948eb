// Package subjects holds the one set of rules for the names flowd puts into NATS subjects,
// so that config validate, the control plane and the pipelines refuse the same names. The
// rules follow what nats-server and nats.go refuse (nats-server's IsValidSubject and
// IsValidPublishSubject, nats.go's subject check on publish), with two of flowd's own for a
// token, given below. It imports nothing of flowd.
package subjects

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ErrInvalid is wrapped by every error of Token and Literal.
var ErrInvalid = errors.New("invalid NATS name")

// Error is a name that breaks a rule. Its message quotes the name and says what is wrong:
// `"$x" is not a valid NATS subject token: starts with '$' (…)`.
type Error struct {
	Name string
	// What is "subject token" or "subject".
	What string
	// Reason says which rule it breaks.
	Reason string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%q is not a valid NATS %s: %s", e.Name, e.What, e.Reason)
}

func (e *Error) Unwrap() error { return ErrInvalid }

// whiteSpace is what ends a subject in the NATS protocol (nats-server refuses it in one).
const whiteSpace = " \t\n\f\r"

// Token checks s as one token of flowd's subjects (the cluster in flowd.evt.<cluster>.> and
// flowd.ctl.v1.<cluster>.>). It returns nil, or an *Error saying what is wrong: empty; a '.', which would split it into two tokens; white space, a NUL byte or
// bytes that are not UTF-8, which NATS refuses in a subject; a '*' or '>' anywhere (NATS
// reads them as wildcards only as whole tokens, but a name holding one reads as a pattern
// in a subscription, so flowd refuses it outright); or a leading '$', which NATS reserves
// for its own subjects ($SYS, $JS, $KV, $SRV).
func Token(s string) error {
	bad := func(reason string) error { return &Error{Name: s, What: "subject token", Reason: reason} }
	switch {
	case s == "":
		return bad("empty")
	case s[0] == '$':
		return bad("starts with '$' (reserved for NATS's own subjects)")
	}
	for _, c := range ".*>" {
		if strings.ContainsRune(s, c) {
			return bad(fmt.Sprintf("contains '%c'", c))
		}
	}
	if r := badBytes(s); r != "" {
		return bad(r)
	}
	return nil
}

// Literal checks s as a subject flowd publishes to (a pipeline's NATS sink): tokens
// separated by '.', none empty and none a wildcard ('*' or '>' alone), with no white space,
// NUL byte or bytes that are not UTF-8. A leading '$' is allowed: publishing to $KV or $JS
// subjects is legitimate. It returns nil, or an *Error saying what is wrong.
func Literal(s string) error {
	bad := func(reason string) error { return &Error{Name: s, What: "subject", Reason: reason} }
	if s == "" {
		return bad("empty")
	}
	if r := badBytes(s); r != "" {
		return bad(r)
	}
	for i, t := range strings.Split(s, ".") {
		switch t {
		case "":
			return bad(fmt.Sprintf("token %d is empty", i+1))
		case "*", ">":
			return bad(fmt.Sprintf("token %d is the wildcard '%s' (messages are published to literal subjects)", i+1, t))
		}
	}
	return nil
}

// badBytes says which bytes NATS refuses anywhere in a subject s holds; "" when none.
func badBytes(s string) string {
	switch {
	case strings.ContainsAny(s, whiteSpace):
		return "contains white space"
	case strings.IndexByte(s, 0) >= 0:
		return "contains a NUL byte"
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	}
	return ""
}

// Escape makes any name one safe token of a subject or KV key: every byte outside
// [A-Za-z0-9_-] is written =XX (upper-case hex), so '.', '%', '|', '*', '>' and white space
// never reach NATS, while the usual names stay as they are. Unescape reverses it.
func Escape(name string) string {
	var b strings.Builder
	for i := range len(name) {
		c := name[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "=%02X", c)
	}
	return b.String()
}

// Unescape reverses Escape; a truncated or malformed =XX is an error naming its position.
func Unescape(token string) (string, error) {
	if !strings.Contains(token, "=") {
		return token, nil
	}
	var b strings.Builder
	for i := 0; i < len(token); i++ {
		if token[i] != '=' {
			b.WriteByte(token[i])
			continue
		}
		if i+2 >= len(token) {
			return "", fmt.Errorf("truncated escape at %d", i)
		}
		v, err := strconv.ParseUint(token[i+1:i+3], 16, 8)
		if err != nil {
			return "", fmt.Errorf("bad escape at %d: %w", i, err)
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}
