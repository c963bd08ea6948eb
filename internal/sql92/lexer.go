package sql92

import (
	"fmt"
	"strings"
)

type tokKind uint8

const (
	tEOF tokKind = iota
	tIdent
	tString
	tDecimal
	tFloat
	tLParen
	tRParen
	tComma
	tEq
	tNe
	tGt
	tGe
	tLt
	tLe
	tPlus
	tMinus
	// keywords, matched case-insensitively
	tNot
	tAnd
	tOr
	tBetween
	tIn
	tTrue
	tFalse
	tNull
	tIs
	tContains
	tStartsWith
	tEndsWith
)

// keywords are RocketMQ 5's reserved words. CONTAINS, STARTSWITH and ENDSWITH arrived in
// RocketMQ 5.1; before that they were ordinary identifiers.
var keywords = [...]struct {
	word string
	kind tokKind
}{
	{"NOT", tNot}, {"AND", tAnd}, {"OR", tOr}, {"BETWEEN", tBetween}, {"IN", tIn},
	{"TRUE", tTrue}, {"FALSE", tFalse}, {"NULL", tNull}, {"IS", tIs},
	{"CONTAINS", tContains}, {"STARTSWITH", tStartsWith}, {"ENDSWITH", tEndsWith},
}

type token struct {
	kind tokKind
	pos  int
	text string // the source text of the token
	str  string // the decoded value of a string literal
}

// describe names a token for an error message.
func (t token) describe() string {
	switch t.kind {
	case tEOF:
		return "end of expression"
	case tString:
		return "string " + t.text
	case tIdent:
		return fmt.Sprintf("identifier %q", t.text)
	case tDecimal, tFloat:
		return "number " + t.text
	}
	if t.kind >= tNot {
		return fmt.Sprintf("%q", strings.ToUpper(t.text))
	}
	return fmt.Sprintf("%q", t.text)
}

// lexer splits a selector into RocketMQ's tokens. Whitespace is space, tab, CR, LF and
// form feed; `--` starts a comment to the end of the line and `/* */` encloses one.
type lexer struct {
	src string
	pos int
}

func isIdentStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == '$'
}

func isIdentPart(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func (l *lexer) errorf(pos int, format string, args ...any) error {
	return &SyntaxError{Pos: pos, Msg: fmt.Sprintf(format, args...), Expr: l.src}
}

// skip passes over whitespace and comments.
func (l *lexer) skip() error {
	s := l.src
	for l.pos < len(s) {
		switch c := s[l.pos]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f':
			l.pos++
		case c == '-' && l.pos+1 < len(s) && s[l.pos+1] == '-':
			// RocketMQ wants the line ended; a comment running to the end of the
			// expression is accepted here too (RocketMQ ignores it as trailing input).
			end := strings.IndexAny(s[l.pos:], "\r\n")
			if end < 0 {
				l.pos = len(s)
			} else {
				l.pos += end + 1
			}
		case c == '/' && l.pos+1 < len(s) && s[l.pos+1] == '*':
			end := strings.Index(s[l.pos+2:], "*/")
			if end < 0 {
				return l.errorf(l.pos, "unterminated comment")
			}
			l.pos += 2 + end + 2
		default:
			return nil
		}
	}
	return nil
}

func (l *lexer) next() (token, error) {
	if err := l.skip(); err != nil {
		return token{}, err
	}
	s, start := l.src, l.pos
	if start >= len(s) {
		return token{kind: tEOF, pos: start}, nil
	}
	tok := func(k tokKind, n int) (token, error) {
		l.pos = start + n
		return token{kind: k, pos: start, text: s[start:l.pos]}, nil
	}
	c := s[start]
	switch {
	case isIdentStart(c):
		n := 1
		for start+n < len(s) && isIdentPart(s[start+n]) {
			n++
		}
		word := s[start : start+n]
		for _, kw := range keywords {
			if strings.EqualFold(word, kw.word) {
				return tok(kw.kind, n)
			}
		}
		return tok(tIdent, n)
	case isDigit(c) || c == '.':
		return l.number()
	case c == '\'':
		return l.stringLit()
	case c == '(':
		return tok(tLParen, 1)
	case c == ')':
		return tok(tRParen, 1)
	case c == ',':
		return tok(tComma, 1)
	case c == '=':
		return tok(tEq, 1)
	case c == '+':
		return tok(tPlus, 1)
	case c == '-':
		return tok(tMinus, 1)
	case c == '>':
		if start+1 < len(s) && s[start+1] == '=' {
			return tok(tGe, 2)
		}
		return tok(tGt, 1)
	case c == '<':
		if start+1 < len(s) {
			switch s[start+1] {
			case '=':
				return tok(tLe, 2)
			case '>':
				return tok(tNe, 2)
			}
		}
		return tok(tLt, 1)
	}
	r := []rune(s[start:min(len(s), start+4)])[0]
	return token{}, l.errorf(start, "unexpected character %q", r)
}

// number scans RocketMQ's numeric literals: a decimal integer ("0" or a digit string
// without a leading zero, optionally suffixed l/L) or a floating literal (5.5, 5., .5,
// 5.5E10, 5E10). The longest literal wins, so "05" is "0" followed by "5".
func (l *lexer) number() (token, error) {
	s, start := l.src, l.pos
	i := start
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	intDigits := i - start
	float := false
	if i < len(s) && s[i] == '.' {
		j := i + 1
		for j < len(s) && isDigit(s[j]) {
			j++
		}
		if intDigits == 0 && j == i+1 {
			return token{}, l.errorf(start, "unexpected character '.'")
		}
		i, float = j, true
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		j := i + 1
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		k := j
		for k < len(s) && isDigit(s[k]) {
			k++
		}
		if k > j {
			i, float = k, true
		}
	}
	if float {
		l.pos = i
		return token{kind: tFloat, pos: start, text: s[start:i]}, nil
	}
	i = start + intDigits
	if s[start] == '0' {
		i = start + 1
	}
	if i < len(s) && (s[i] == 'l' || s[i] == 'L') {
		i++
	}
	l.pos = i
	return token{kind: tDecimal, pos: start, text: s[start:i]}, nil
}

// stringLit scans a single-quoted literal; a doubled quote stands for one quote. Any other
// character, a line break included, is taken as it is.
func (l *lexer) stringLit() (token, error) {
	s, start := l.src, l.pos
	var b strings.Builder
	i := start + 1
	for {
		j := strings.IndexByte(s[i:], '\'')
		if j < 0 {
			return token{}, l.errorf(start, "unterminated string")
		}
		b.WriteString(s[i : i+j])
		i += j + 1
		if i < len(s) && s[i] == '\'' {
			b.WriteByte('\'')
			i++
			continue
		}
		break
	}
	l.pos = i
	return token{kind: tString, pos: start, text: s[start:i], str: b.String()}, nil
}
