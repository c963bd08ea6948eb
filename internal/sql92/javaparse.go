package sql92

import (
	"math"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// The functions here read a property value the way the Java methods RocketMQ calls on it
// do, so a value converts (or fails to) exactly as it would on a RocketMQ broker. None of
// them allocates.

// javaDigit is Character.digit(c, 10) for one UTF-16 unit: ASCII digits and the other
// Unicode decimal digits of the Basic Multilingual Plane (Arabic-Indic, fullwidth, …).
func javaDigit(r rune) int {
	if r >= '0' && r <= '9' {
		return int(r - '0')
	}
	if r < 0x80 || r > 0xFFFF || !unicode.IsDigit(r) {
		return -1
	}
	// Unicode decimal digits come in runs of ten starting at zero.
	start := r
	for start > 0 && unicode.IsDigit(start-1) {
		start--
	}
	return int(r-start) % 10
}

// parseJavaInt is Integer.parseInt (is32) or Long.parseLong: an optional sign, then one or
// more decimal digits, in range. No spaces, no fraction.
func parseJavaInt(s string, is32 bool) (int64, bool) {
	if s == "" {
		return 0, false
	}
	neg := false
	i := 0
	switch s[0] {
	case '-':
		neg = true
		i = 1
	case '+':
		i = 1
	}
	if i == len(s) {
		return 0, false
	}
	limit := uint64(math.MaxInt64)
	if is32 {
		limit = math.MaxInt32
	}
	if neg {
		limit++
	}
	var u uint64
	for i < len(s) {
		r, size := rune(s[i]), 1
		if r >= utf8.RuneSelf {
			r, size = utf8.DecodeRuneInString(s[i:])
		}
		d := javaDigit(r)
		if d < 0 {
			return 0, false
		}
		if u > (limit-uint64(d))/10 {
			return 0, false
		}
		u = u*10 + uint64(d)
		i += size
	}
	if neg {
		return -int64(u), true // u == MaxInt64+1 wraps to MinInt64, as intended
	}
	return int64(u), true
}

// parseJavaDouble is Double.valueOf(String): surrounding characters up to U+0020 trimmed,
// an optional sign, then "NaN", "Infinity", a decimal literal (digits with an optional
// point, at least one digit, an optional exponent) or a hexadecimal one (0x1.8p3), with an
// optional f/F/d/D suffix on the literals. Too-large values are infinite, as in Java.
func parseJavaDouble(s string) (float64, bool) {
	lo, hi := 0, len(s)
	for lo < hi && s[lo] <= ' ' {
		lo++
	}
	for hi > lo && s[hi-1] <= ' ' {
		hi--
	}
	s = s[lo:hi]
	if s == "" {
		return 0, false
	}
	i := 0
	neg := false
	if s[0] == '+' || s[0] == '-' {
		neg = s[0] == '-'
		i = 1
	}
	switch s[i:] {
	case "NaN":
		return math.NaN(), true
	case "Infinity":
		if neg {
			return math.Inf(-1), true
		}
		return math.Inf(1), true
	}
	end := len(s)
	if end > i {
		switch s[end-1] {
		case 'f', 'F', 'd', 'D':
			end--
		}
	}
	body := s[i:end]
	var valid bool
	if len(body) > 1 && body[0] == '0' && (body[1] == 'x' || body[1] == 'X') {
		valid = validHexFloat(body[2:])
	} else {
		valid = validDecimalFloat(body)
	}
	if !valid {
		return 0, false
	}
	f, err := strconv.ParseFloat(s[:end], 64)
	if err != nil && !math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

// validDecimalFloat: digits* [. digits*] with at least one digit, then [eE [+-] digits+].
func validDecimalFloat(s string) bool {
	i, digits := 0, 0
	for i < len(s) && isDigit(s[i]) {
		i, digits = i+1, digits+1
	}
	if i < len(s) && s[i] == '.' {
		i++
		for i < len(s) && isDigit(s[i]) {
			i, digits = i+1, digits+1
		}
	}
	if digits == 0 {
		return false
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		return validExponent(s[i+1:])
	}
	return i == len(s)
}

func validExponent(s string) bool {
	if s != "" && (s[0] == '+' || s[0] == '-') {
		s = s[1:]
	}
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return true
}

func isHexDigit(c byte) bool {
	return isDigit(c) || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// validHexFloat checks what follows "0x": hex digits with an optional point (at least one
// digit), then a binary exponent p/P [+-] digits, which Java requires.
func validHexFloat(s string) bool {
	i, digits := 0, 0
	for i < len(s) && isHexDigit(s[i]) {
		i, digits = i+1, digits+1
	}
	if i < len(s) && s[i] == '.' {
		i++
		for i < len(s) && isHexDigit(s[i]) {
			i, digits = i+1, digits+1
		}
	}
	if digits == 0 || i == len(s) || (s[i] != 'p' && s[i] != 'P') {
		return false
	}
	return validExponent(s[i+1:])
}

// javaBool is Boolean.valueOf(String): "true" in any letter case is true, anything else
// false.
func javaBool(s string) bool {
	if len(s) != 4 {
		return false
	}
	return s[0]|0x20 == 't' && s[1]|0x20 == 'r' && s[2]|0x20 == 'u' && s[3]|0x20 == 'e'
}
