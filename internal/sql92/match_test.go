package sql92

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// props builds a property set from key, value pairs.
func props(kv ...string) map[string]string {
	m := make(map[string]string, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func mapGetter(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

type matchCase struct {
	expr  string
	props map[string]string
	want  bool
}

// matchCases are RocketMQ's results for each expression on each property set, worked out
// from its evaluator (ComparisonExpression, LogicExpression, UnaryExpression and the
// broker's rule that NULL or an evaluation error means "not matched").
var matchCases = []matchCase{
	// string equality
	{"a = 'x'", props("a", "x"), true},
	{"a = 'x'", props("a", "y"), false},
	{"a = 'x'", props(), false},
	{"a = 'x'", props("a", ""), false},
	{"a = ''", props("a", ""), true},
	{"a = 'it''s'", props("a", "it's"), true},
	{"a = 'X'", props("a", "x"), false},
	{"'x' = a", props("a", "x"), true},
	// <> is NOT(=): a missing property gives NULL, which does not match
	{"a <> 'x'", props("a", "y"), true},
	{"a <> 'x'", props("a", "x"), false},
	{"a <> 'x'", props(), false},
	// = with NULL on one side: left NULL is NULL, right NULL is FALSE
	{"NOT (a = 'x')", props(), false},
	{"NOT (a = 'x')", props("a", "y"), true},
	{"'x' = a", props(), false},
	{"NOT ('x' = a)", props(), true},
	{"a = b", props(), true},
	{"a = b", props("a", "1"), false},
	{"a = b", props("b", "1"), false},
	{"a = b", props("a", "1", "b", "1"), true},
	{"a <> b", props("a", "1"), true},
	{"a <> b", props("b", "1"), false},
	{"a <> b", props(), false},
	// a string meets an Integer literal: parsed as a Java int
	{"a = 5", props("a", "5"), true},
	{"a = 5", props("a", "05"), true},
	{"a = 5", props("a", "+5"), true},
	{"a = 5", props("a", "6"), false},
	{"a = 5", props("a", "5.0"), false},
	{"a = 5", props("a", " 5"), false},
	{"a = 5", props("a", "abc"), false},
	{"a = 5", props(), false},
	{"5 = a", props("a", "5"), true},
	{"a = 10L", props("a", "10"), true},
	{"a <> 5", props("a", "abc"), false}, // an error, not TRUE
	{"a = 9223372036854775807", props("a", "9223372036854775807"), true},
	// … with a Double literal: parsed as Double.valueOf does
	{"a = 5.0", props("a", "5"), true},
	{"a = 5.0", props("a", " 5 "), true},
	{"a = 5.0", props("a", "5e0"), true},
	{"a = 5.0", props("a", "5f"), true},
	{"a = 5.0", props("a", "0x1.4p2"), true},
	{"a = 5.0", props("a", "5."), true},
	{"a = 5.", props("a", "5"), true},
	{"a = .5", props("a", "0.5"), true},
	{"a = 5E0", props("a", "5"), true},
	{"a = 5.0", props("a", "five"), false},
	// ordering
	{"a > 5", props("a", "6"), true},
	{"a > 5", props("a", "5"), false},
	{"a > 5", props("a", "-7"), false},
	{"a > 5", props("a", "5.5"), false},        // Integer.parseInt fails
	{"a > 5", props("a", "3000000000"), false}, // beyond int
	{"a > 5.0", props("a", "5.5"), true},
	{"a > 5.0", props("a", "3000000000"), true},
	{"a > 2147483648", props("a", "3000000000"), true}, // a Long literal
	{"a > 5", props("a", "\u0666"), true},              // Arabic-Indic six: Integer.parseInt takes it
	{"a > 5.0", props("a", "\u0666"), false},           // Double.valueOf does not
	{"a >= 5", props("a", "5"), true},
	{"a < 5", props("a", "5"), false},
	{"a <= 5", props("a", "5"), true},
	{"a < 5", props(), false},
	{"NOT (a < 5)", props(), false},
	{"a > -3", props("a", "-2"), true},
	{"a > -3", props("a", "-4"), false},
	{"a < 1.5e3", props("a", "1499.9"), true},
	{"a > 1.0", props("a", "NaN"), true}, // Double.compare puts NaN above all
	{"a < 1.0", props("a", "NaN"), false},
	{"a > 1.0", props("a", "Infinity"), true},
	{"a < 1.0", props("a", "-Infinity"), true},
	{"a > -2147483648", props("a", "-2147483647"), true},
	// two properties: = compares strings, ordering compares Doubles
	{"a > b", props("a", "10", "b", "9"), true},
	{"a > b", props("a", "x", "b", "1"), false},
	{"a > b", props("a", "10"), false},
	{"a < b", props("a", "-0", "b", "0"), true}, // Double.compare(-0.0, 0.0) < 0
	{"a = b", props("a", "-0", "b", "0"), false},
	{"a = b", props("a", "1", "b", "1.0"), false},
	{"a <= b", props("a", "1", "b", "1.0"), true},
	// booleans
	{"a = TRUE", props("a", "true"), true},
	{"a = TRUE", props("a", "TRUE"), true},
	{"a = true", props("a", "yes"), false},
	{"a = TRUE", props(), false},
	{"a = FALSE", props("a", "yes"), true},
	{"a = FALSE", props("a", "false"), true},
	{"TRUE", props(), true},
	{"FALSE", props(), false},
	{"NULL", props(), false},
	{"NOT NULL", props(), false},
	{"NOT FALSE", props(), true},
	{"TRUE OR NULL", props(), true},
	{"FALSE AND NULL", props(), false},
	{"NOT (TRUE AND NULL)", props(), false},
	{"(a = 1) = TRUE", props("a", "1"), true},
	{"(a = 1) = 'true'", props("a", "1"), false}, // Boolean left of String: an error
	{"'true' = (a = 1)", props("a", "1"), true},
	{"5 = (a = 1)", props("a", "1"), false},
	{"5 = TRUE", props(), false},
	// a bare property as a boolean: NULL when missing, FALSE otherwise
	{"a", props("a", "true"), false},
	{"a", props(), false},
	{"NOT a", props("a", "x"), true},
	{"NOT a", props(), false},
	{"a OR b", props("a", "true", "b", "true"), false},
	{"NOT a AND NOT b", props("a", "1", "b", "2"), true},
	// NOT binds tighter than comparisons: NOT a = 'x' is (NOT a) = 'x'
	{"NOT a = 'x'", props("a", "x"), false},
	{"NOT a = 'x'", props("a", "y"), false},
	{"NOT a = 'x'", props(), false},
	{"NOT a = TRUE", props("a", "x"), true},
	{"NOT a = TRUE", props(), false},
	{"NOT (a = 'x')", props("a", "y"), true},
	// three-valued AND / OR / NOT
	{"a = 1 OR b = 1", props("a", "1"), true},
	{"a = 1 OR b = 1", props("b", "1"), true},
	{"a = 1 OR b = 1", props(), false},
	{"a = 1 AND b = 1", props("a", "1", "b", "1"), true},
	{"a = 1 AND b = 1", props("a", "1"), false},
	{"NOT (a = 1 AND b = 1)", props("a", "2"), true},
	{"NOT (a = 1 AND b = 1)", props("b", "1"), false},
	{"NOT (a = 1 AND b = 1)", props("b", "2"), true},
	{"NOT (a = 1 OR b = 1)", props("b", "2"), false},
	{"NOT (a = 1 OR b = 1)", props("a", "2", "b", "2"), true},
	// an evaluation error leaves the message out, whatever encloses it
	{"a = 5 OR b = 'x'", props("a", "abc", "b", "x"), false},
	{"b = 'x' OR a = 5", props("a", "abc", "b", "x"), true},
	{"b = 'y' AND a = 5", props("a", "abc", "b", "x"), false},
	{"NOT (b = 'y' AND a = 5)", props("a", "abc", "b", "x"), true},
	{"NOT (a = 5 AND b = 'y')", props("a", "abc", "b", "x"), false},
	{"(a = 5) IS NULL", props("a", "abc"), false},
	// precedence: AND over OR, parentheses
	{"a = 1 OR b = 1 AND c = 1", props("a", "1"), true},
	{"a = 1 OR b = 1 AND c = 1", props("b", "1"), false},
	{"a = 1 OR b = 1 AND c = 1", props("b", "1", "c", "1"), true},
	{"(a = 1 OR b = 1) AND c = 1", props("a", "1"), false},
	{"(a = 1 OR b = 1) AND c = 1", props("a", "1", "c", "1"), true},
	{"NOT a = 1 OR b = 1", props("a", "1", "b", "1"), true},
	// BETWEEN is >= AND <=, NOT BETWEEN is < OR >
	{"a BETWEEN 2 AND 10", props("a", "2"), true},
	{"a BETWEEN 2 AND 10", props("a", "10"), true},
	{"a BETWEEN 2 AND 10", props("a", "11"), false},
	{"a BETWEEN 2 AND 10", props("a", "1"), false},
	{"a BETWEEN 2 AND 10", props(), false},
	{"a BETWEEN 2 AND 10", props("a", "x"), false},
	{"a NOT BETWEEN 2 AND 10", props("a", "1"), true},
	{"a NOT BETWEEN 2 AND 10", props("a", "11"), true},
	{"a NOT BETWEEN 2 AND 10", props("a", "5"), false},
	{"a NOT BETWEEN 2 AND 10", props(), false},
	{"NOT (a BETWEEN 2 AND 10)", props(), false},
	{"a BETWEEN 1.5 AND 2", props("a", "1.7"), false}, // "1.7" <= 2 fails to parse as int
	{"a BETWEEN 1.5 AND 2.0", props("a", "1.7"), true},
	{"a BETWEEN -5 AND -1", props("a", "-3"), true},
	{"a BETWEEN 5 AND -1", props("a", "3"), false},
	{"a BETWEEN b AND c", props("a", "3", "b", "1", "c", "5"), true},
	{"a BETWEEN b AND c", props("a", "3", "c", "5"), false},
	{"a NOT BETWEEN b AND c", props("a", "9", "c", "5"), true}, // NULL OR TRUE
	// IN
	{"a IN ('x', 'y')", props("a", "x"), true},
	{"a IN ('x', 'y')", props("a", "z"), false},
	{"a IN ('x', 'y')", props(), false},
	{"a NOT IN ('x')", props("a", "y"), true},
	{"a NOT IN ('x')", props("a", "x"), false},
	{"a NOT IN ('x')", props(), false},
	{"NOT (a IN ('x'))", props(), false},
	{"(a) IN ('x')", props("a", "x"), true},
	{"a IN ('1', '2', '3', '4', '5', '6', '7', '8', '9')", props("a", "8"), true},
	{"a IN ('1', '2', '3', '4', '5', '6', '7', '8', '9')", props("a", "10"), false},
	{"a NOT IN ('1', '2', '3', '4', '5', '6', '7', '8', '9')", props("a", "10"), true},
	{"TAGS IN ('TagA', 'TagB')", props("TAGS", "TagB"), true},
	{"a IN ('5')", props("a", "05"), false},
	// IS [NOT] NULL
	{"a IS NULL", props(), true},
	{"a IS NULL", props("a", ""), false},
	{"a IS NOT NULL", props("a", ""), true},
	{"a IS NOT NULL", props(), false},
	{"NOT a IS NULL", props(), true}, // (NOT a) IS NULL
	{"NOT a IS NULL", props("a", "x"), false},
	{"(a = 1) IS NULL", props(), true},
	{"(a = 1) IS NULL", props("a", "2"), false},
	{"NULL IS NULL", props(), true},
	{"5 IS NOT NULL", props(), true},
	// CONTAINS, STARTSWITH, ENDSWITH: never NULL
	{"a CONTAINS 'x'", props("a", "axb"), true},
	{"a CONTAINS 'x'", props("a", "ab"), false},
	{"a CONTAINS 'x'", props(), false},
	{"a NOT CONTAINS 'x'", props("a", "ab"), true},
	{"a NOT CONTAINS 'x'", props("a", "axb"), false},
	{"a NOT CONTAINS 'x'", props(), false},
	{"NOT (a CONTAINS 'x')", props(), true},
	{"a CONTAINS ''", props("a", ""), false},
	{"a NOT CONTAINS ''", props("a", "x"), false},
	{"a STARTSWITH 'ax'", props("a", "axb"), true},
	{"a STARTSWITH 'xb'", props("a", "axb"), false},
	{"a NOT STARTSWITH 'x'", props("a", "axb"), true},
	{"a ENDSWITH 'xb'", props("a", "axb"), true},
	{"a ENDSWITH 'ax'", props("a", "axb"), false},
	{"a NOT ENDSWITH 'x'", props("a", "axb"), true},
	{"a NOT ENDSWITH 'x'", props(), false},
	{"'axb' CONTAINS 'x'", props(), true},
	{"5 CONTAINS '5'", props(), false},
	{"a CONTAINS 'x' CONTAINS 'x'", props("a", "x"), false},
	// unary minus and plus
	{"-a = -5", props("a", "5"), false},
	{"a = -5", props("a", "-5"), true},
	{"a = - -5", props("a", "5"), true},
	{"a = -(-5)", props("a", "5"), true},
	{"a = -1.5", props("a", "-1.5"), true},
	{"+a = 'x'", props("a", "x"), true},
	{"a = +5", props("a", "5"), true},
	{"a > -'x'", props("a", "1"), false},
	// keywords are case-insensitive, properties are not
	{"a = 1 and B = 2 Or c is NoT nUlL", props("c", ""), true},
	{"a between 1 AnD 2", props("a", "1"), true},
	{"x iN ('a') oR tRuE", props(), true},
	{"a not in ('x')", props("a", "y"), true},
	{"a Contains 'x' and a startsWITH 'a' and a endswith 'b'", props("a", "axb"), true},
	{"A = 1", props("a", "1"), false},
	// identifiers, whitespace, comments
	{"$x = 1 AND _a_1 = 2", props("$x", "1", "_a_1", "2"), true},
	{"a <= now", props("a", "1", "now", "2"), true},
	{"a\t=\r\n1\f", props("a", "1"), true},
	{"a = 1 -- a comment\n AND b = 2", props("a", "1", "b", "2"), true},
	{"a = 1 -- a comment at the end", props("a", "1"), true},
	{"/* lead */ a = /* mid */ 1 /* trail */", props("a", "1"), true},
	{"a='x'AND(b=1)", props("a", "x", "b", "1"), true},
	// more conversions
	{"c >= c", props("c", "3000000000"), true},
	{"b <> 1e3", props("b", "\u0665"), false}, // Double.valueOf refuses non-ASCII digits
	{"c <= 2147483648", props("c", "5"), true},
	{"b <= 10L", props("b", "1.5"), false},
	{"a <= 2147483648 = b", props("a", "\u0665", "b", "abc"), false},
	{"+a IS NOT NULL", props("a", "\u0665"), true},
}

func TestMatch(t *testing.T) {
	for _, c := range matchCases {
		t.Run(fmt.Sprintf("%s|%v", c.expr, c.props), func(t *testing.T) {
			sel, err := Compile(c.expr)
			require.NoError(t, err)
			assert.Equal(t, c.want, sel.Match(mapGetter(c.props)))

			// The canonical form compiles to a selector that decides the same.
			again, err := Compile(sel.String())
			require.NoError(t, err, "canonical form %q", sel.String())
			assert.Equal(t, sel.String(), again.String())
			assert.Equal(t, c.want, again.Match(mapGetter(c.props)), "canonical form %q", sel.String())
		})
	}
}

func TestString(t *testing.T) {
	cases := []struct{ expr, want string }{
		{"a>5 and region in('eu','us')", "a > 5 AND region IN ('eu', 'us')"},
		{"NOT (a = 1)", "NOT (a = 1)"},
		{"not a = 1", "NOT a = 1"},
		{"(a = 1 OR b = 1) AND c = 1", "(a = 1 OR b = 1) AND c = 1"},
		{"a = 1 OR (b = 1 AND c = 1)", "a = 1 OR b = 1 AND c = 1"},
		{"a = 1 AND (b = 2 AND c = 3)", "a = 1 AND (b = 2 AND c = 3)"},
		{"((a = 1) AND b = 2) AND c = 3", "a = 1 AND b = 2 AND c = 3"},
		{"a = (b = 1)", "a = (b = 1)"},
		{"-(-5) = a", "- -5 = a"},
		{"a = 'it''s'", "a = 'it''s'"},
		{"a between 1 and 2.5", "a BETWEEN 1 AND 2.5"},
		{"a not between -1 and (b)", "a NOT BETWEEN -1 AND b"},
		{"a > 1e3", "a > 1000.0"},
		{"a > .5E-3", "a > 0.0005"},
		{"a > 1e21", "a > 1e+21"},
		{"a is not null", "a IS NOT NULL"},
		{"a not contains 'x'", "a NOT CONTAINS 'x'"},
		{"10L = a", "10 = a"},
		{"a > 2147483648", "a > 2147483648"},
		{"(a)", "a"},
		{"NOT NOT a", "NOT NOT a"},
		{"-NOT a = TRUE", "-NOT a = TRUE"},
		{"a = 1 IS NULL", "a = 1 IS NULL"},
		{"tags = 'x' -- c", "tags = 'x'"},
	}
	for _, c := range cases {
		sel, err := Compile(c.expr)
		require.NoError(t, err, c.expr)
		assert.Equal(t, c.want, sel.String(), c.expr)
	}
}

// TestMatchDoesNotAllocate: the broker evaluates every message of a pull, so Match must
// not add garbage per message.
func TestMatchDoesNotAllocate(t *testing.T) {
	m := props("a", "7", "region", "us", "price", "12.5", "TAGS", "x")
	get := mapGetter(m)
	for _, expr := range []string{
		"a > 5 AND region IN ('eu', 'us')",
		"price BETWEEN 10.0 AND 20.0 OR a = 5",
		"region NOT IN ('1', '2', '3', '4', '5', '6', '7', '8', '9') AND TAGS IS NOT NULL",
		"region CONTAINS 's' AND NOT (a < b) AND a <> 'x'",
	} {
		sel, err := Compile(expr)
		require.NoError(t, err)
		allocs := testing.AllocsPerRun(100, func() { sel.Match(get) })
		assert.Zero(t, allocs, expr)
	}
}

func TestMatchConcurrent(t *testing.T) {
	sel, err := Compile("a > 5 AND region IN ('eu', 'us')")
	require.NoError(t, err)
	done := make(chan bool)
	for i := range 4 {
		go func() {
			ok := true
			for j := range 1000 {
				m := props("a", fmt.Sprint(j%10), "region", []string{"eu", "us", "ap"}[(i+j)%3])
				want := j%10 > 5 && m["region"] != "ap"
				ok = ok && sel.Match(mapGetter(m)) == want
			}
			done <- ok
		}()
	}
	for range 4 {
		assert.True(t, <-done)
	}
}

func TestKeywordsAreNotProperties(t *testing.T) {
	for _, kw := range keywords {
		for _, spelled := range []string{kw.word, strings.ToLower(kw.word)} {
			_, err := Compile(spelled + " = 'x'")
			assert.ErrorIs(t, err, ErrSyntax, spelled)
		}
	}
}
