package sql92

import (
	"errors"
	"fmt"
	"strings"
)

// Limits on what Compile accepts. A selector arrives from a client's subscription, so its
// size and nesting are bounded before any recursion: an over-long or over-deep expression is
// a SyntaxError, never a stack overflow or an unbounded compile.
const (
	// MaxLength is the longest expression Compile accepts, in bytes.
	MaxLength = 4096
	// MaxDepth is the deepest nesting Compile accepts, counting each parenthesis and each
	// prefix operator (NOT, unary minus, unary plus) around an operand.
	MaxDepth = 100
)

// ErrSyntax is matched (errors.Is) by every error Compile returns: the expression is not a
// selector flowd accepts, so the subscription carrying it must be refused.
var ErrSyntax = errors.New("sql92: invalid selector")

// SyntaxError is a rejected expression and where in it the problem was found.
type SyntaxError struct {
	// Pos is the 0-based byte offset in Expr of the token (or character) at fault.
	Pos int
	// Msg says what is wrong, e.g. `unexpected "AND"`.
	Msg string
	// Expr is the expression as given to Compile.
	Expr string
}

// Error renders `sql92: <msg> at <pos>: <expr>`; an expression longer than 120 bytes is
// shown as an excerpt around Pos so log lines stay readable.
func (e *SyntaxError) Error() string {
	return fmt.Sprintf("sql92: %s at %d: %s", e.Msg, e.Pos, excerpt(e.Expr, e.Pos))
}

// Is reports whether target is ErrSyntax, so callers can branch without a type assertion.
func (e *SyntaxError) Is(target error) bool { return target == ErrSyntax }

func excerpt(expr string, pos int) string {
	const width = 120
	if len(expr) <= width {
		return expr
	}
	start := max(0, pos-width/2)
	end := min(len(expr), start+width)
	var b strings.Builder
	if start > 0 {
		b.WriteString("…")
	}
	b.WriteString(expr[start:end])
	if end < len(expr) {
		b.WriteString("…")
	}
	return b.String()
}

// Selector is a compiled SQL92 selector. It is immutable and safe for concurrent use by any
// number of goroutines.
type Selector struct {
	root boolNode
}

// Compile parses expr and checks it the way RocketMQ's broker does when a consumer
// subscribes, so a selector RocketMQ refuses is refused here too (see the package
// documentation for the one deliberate difference: trailing input is an error).
func Compile(expr string) (*Selector, error) {
	if len(expr) > MaxLength {
		return nil, &SyntaxError{Pos: MaxLength, Msg: fmt.Sprintf("expression longer than %d bytes", MaxLength), Expr: expr}
	}
	p := parser{lex: lexer{src: expr}}
	root, err := p.parseSelector()
	if err != nil {
		return nil, err
	}
	return &Selector{root: root}, nil
}

// Match evaluates the selector against one message. get returns a property's value and
// whether the message has it. Match is true only when the expression evaluates to TRUE: a
// NULL (unknown) result and an evaluation error (a property that does not parse as the
// number it is compared with) both leave the message out, as RocketMQ's broker does.
func (s *Selector) Match(get func(key string) (string, bool)) bool {
	return s.root.test(get) == triTrue
}

// String returns the selector in canonical form: keywords upper case, single spaces, and
// only the parentheses the structure needs. Compiling it yields an equivalent selector.
func (s *Selector) String() string {
	var b strings.Builder
	format(&b, s.root)
	return b.String()
}
