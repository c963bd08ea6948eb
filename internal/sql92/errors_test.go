package sql92

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// compileErrorCases are expressions RocketMQ refuses too (but for trailing input, which it
// ignores), with where flowd reports the fault.
var compileErrorCases = []struct {
	expr string
	pos  int
	msg  string // a part of the message
}{
	{"", 0, "empty expression"},
	{"  -- only a comment", 0, "empty expression"},
	{"a AND AND b", 6, `unexpected "AND"`},
	{"a and and b", 6, `unexpected "AND"`},
	{"a = ", 4, "unexpected end of expression"},
	{"a = 1 b = 2", 6, `unexpected identifier "b"`}, // RocketMQ ignores trailing input
	{"a = 05", 5, "unexpected number 5"},
	{"a = 1)", 5, `unexpected ")"`},
	{"(a = 1", 6, `expected ")"`},
	{"a = 'x", 4, "unterminated string"},
	{"a = 1 /* x", 6, "unterminated comment"},
	{"a # 1", 2, "unexpected character '#'"},
	{"a = 1 ! b", 6, "unexpected character '!'"},
	{"a.b = 1", 1, "unexpected character '.'"},
	{"a = \u00e9", 4, "unexpected character 'é'"},
	{"a NOT = 1", 2, `unexpected "NOT"`},
	{"contains = 1", 0, `unexpected "CONTAINS"`},
	{"a IS 5", 5, "expected NULL"},
	{"a IS NOT 5", 9, "expected NULL"},
	// ordering takes numbers only
	{"a > 'x'", 4, "cannot be compared with <"},
	{"'x' < a", 0, "cannot be compared with <"},
	{"a > TRUE", 4, "cannot be compared with <"},
	{"a >= NULL", 5, "cannot be compared with <"},
	{"a > (b = 1)", 4, "cannot be compared with <"},
	{"a > 1 > 2", 0, "cannot be compared with <"},
	{"NOT a BETWEEN 1 AND 2", 0, "cannot be compared with <"},
	{"a BETWEEN 'a' AND 'b'", 10, "cannot be compared with <"},
	{"a NOT BETWEEN 'a' AND 2", 14, "cannot be compared with <"},
	// BETWEEN literal bounds
	{"a BETWEEN 10 AND 0", 10, "low bound 10 must not exceed high bound 0"},
	{"a BETWEEN 2.5 AND 2", 10, "must not exceed"},
	{"a BETWEEN NULL AND 5", 10, "cannot be NULL"},
	{"a BETWEEN 1 OR 2", 12, "expected AND"},
	// = and <>
	{"a = NULL", 4, "NULL cannot be compared"},
	{"NULL <> a", 0, "NULL cannot be compared"},
	{"TRUE = 5", 0, "TRUE cannot be compared with 5"},
	{"FALSE <> 'x'", 0, "FALSE cannot be compared with 'x'"},
	// IN and the string operators
	{"a IN ()", 6, "expected a string literal"},
	{"a IN (1, 2)", 6, "expected a string literal"},
	{"a IN 'x'", 5, `expected "("`},
	{"a IN ('x' 'y')", 10, `expected ")"`},
	{"5 IN ('x')", 0, "IN needs a property"},
	{"-a IN ('x')", 0, "IN needs a property"},
	{"(a = 1) IN ('x')", 0, "IN needs a property"},
	{"a CONTAINS b", 11, "expected a string literal"},
	{"a NOT STARTSWITH 5", 17, "expected a string literal"},
	// booleans where booleans are needed
	{"5", 0, "5 is not a boolean expression"},
	{"'x'", 0, "'x' is not a boolean expression"},
	{"-a", 0, "-a is not a boolean expression"},
	{"a AND 5", 6, "not a boolean"},
	{"5 OR a", 0, "not a boolean"},
	{"NOT 'x'", 4, "not a boolean"},
	{"(1.5)", 0, "not a boolean"},
	// literals
	{"a = 0.0", 4, "is zero"},
	{"a = .0e5", 4, "is zero"},
	{"a = 1e-400", 4, "is zero"},
	{"a = 1e400", 4, "out of range"},
	{"a = 9223372036854775808", 4, "out of range"},
}

func TestCompileErrors(t *testing.T) {
	for _, c := range compileErrorCases {
		t.Run(c.expr, func(t *testing.T) {
			sel, err := Compile(c.expr)
			require.Error(t, err, "compiled to %v", sel)
			assert.ErrorIs(t, err, ErrSyntax)
			var se *SyntaxError
			require.True(t, errors.As(err, &se))
			assert.Equal(t, c.pos, se.Pos, se.Error())
			assert.Contains(t, se.Msg, c.msg)
			assert.Equal(t, c.expr, se.Expr)
		})
	}
}

func TestSyntaxErrorText(t *testing.T) {
	_, err := Compile("a AND AND b")
	require.Error(t, err)
	assert.Equal(t, `sql92: unexpected "AND" at 6: a AND AND b`, err.Error())

	long := "a = 1 AND " + strings.Repeat("b = 2 AND ", 30) + "AND c = 3"
	_, err = Compile(long)
	require.Error(t, err)
	var se *SyntaxError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, strings.LastIndex(long, "AND"), se.Pos)
	assert.Less(t, len(err.Error()), 200, "a long expression is shown as an excerpt")
	assert.Contains(t, err.Error(), "AND AND c = 3")
}

func TestLimits(t *testing.T) {
	nestParens := func(n int) string {
		return strings.Repeat("(", n) + "a = 1" + strings.Repeat(")", n)
	}
	_, err := Compile(nestParens(MaxDepth))
	require.NoError(t, err)
	_, err = Compile(nestParens(MaxDepth + 1))
	var se *SyntaxError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, MaxDepth, se.Pos)
	assert.Contains(t, se.Msg, "nesting deeper than")

	_, err = Compile(strings.Repeat("NOT ", MaxDepth) + "a")
	require.NoError(t, err)
	_, err = Compile(strings.Repeat("NOT ", MaxDepth+1) + "a")
	require.ErrorAs(t, err, &se)
	assert.Contains(t, se.Msg, "nesting deeper than")

	_, err = Compile("a = " + strings.Repeat("- ", MaxDepth+1) + "1")
	require.ErrorAs(t, err, &se)
	assert.Contains(t, se.Msg, "nesting deeper than")

	// Far deeper input is refused by the same check, without exhausting the stack.
	_, err = Compile(strings.Repeat("(", MaxLength))
	require.ErrorIs(t, err, ErrSyntax)

	atLimit := "a = '" + strings.Repeat("x", MaxLength-6) + "'"
	require.Len(t, atLimit, MaxLength)
	_, err = Compile(atLimit)
	require.NoError(t, err)
	_, err = Compile(atLimit + " ")
	require.ErrorAs(t, err, &se)
	assert.Equal(t, MaxLength, se.Pos)
	assert.Contains(t, se.Msg, "longer than")

	// A long flat chain is within the limits and evaluates.
	chain := "a = 0" + strings.Repeat(" OR a = 1", (MaxLength-5)/9)
	sel, err := Compile(chain)
	require.NoError(t, err)
	assert.True(t, sel.Match(mapGetter(props("a", "1"))))
}
