package sql92

import (
	"bufio"
	"encoding/hex"
	"errors"
	"math/rand"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOracle compares Compile and Match with RocketMQ's own filter module, run as an
// external program (testdata/oracle/Harness.java tells how to build it), on the table
// cases and on generated expressions. It runs only when FLOWD_SQL92_ORACLE holds the
// command line of that program.
//
// The one accepted difference is trailing input, which RocketMQ ignores and flowd refuses:
// when flowd reports an unexpected token at p, RocketMQ must decide the whole expression
// as flowd decides expr[:p].
func TestOracle(t *testing.T) {
	command := strings.Fields(os.Getenv("FLOWD_SQL92_ORACLE"))
	if len(command) == 0 {
		t.Skip("FLOWD_SQL92_ORACLE is not set")
	}
	type oracleCase struct {
		expr  string
		props map[string]string
	}
	var cases []oracleCase
	for _, c := range matchCases {
		cases = append(cases, oracleCase{c.expr, c.props})
	}
	for _, c := range compileErrorCases {
		cases = append(cases, oracleCase{c.expr, nil})
	}
	r := rand.New(rand.NewSource(1))
	for range 20000 {
		cases = append(cases, oracleCase{generateExpr(r, 4), generateProps(r)})
	}

	ask := func(cases []oracleCase) []string {
		var in strings.Builder
		for _, c := range cases {
			in.WriteString(hex.EncodeToString([]byte(c.expr)))
			for k, v := range c.props {
				in.WriteString(" " + hex.EncodeToString([]byte(k)) + " " + hex.EncodeToString([]byte(v)))
			}
			in.WriteByte('\n')
		}
		cmd := exec.Command(command[0], command[1:]...)
		cmd.Stdin = strings.NewReader(in.String())
		out, err := cmd.Output()
		require.NoError(t, err)
		var answers []string
		sc := bufio.NewScanner(strings.NewReader(string(out)))
		for sc.Scan() {
			answers = append(answers, sc.Text())
		}
		require.Len(t, answers, len(cases))
		return answers
	}
	decide := func(expr string, props map[string]string) (string, error) {
		sel, err := Compile(expr)
		switch {
		case err != nil:
			return "ERR", err
		case sel.Match(mapGetter(props)):
			return "T", nil
		}
		return "F", nil
	}

	answers := ask(cases)
	var trailing []oracleCase
	var trailingWant []string
	for i, c := range cases {
		got, err := decide(c.expr, c.props)
		if got == answers[i] {
			continue
		}
		if got == "ERR" && strings.Contains(c.expr, "--") {
			continue // RocketMQ reads "--" without a line break as two minus signs
		}
		var se *SyntaxError
		if got == "ERR" && answers[i] != "ERR" && errors.As(err, &se) && strings.HasPrefix(se.Msg, "unexpected") && se.Pos > 0 {
			trailing = append(trailing, oracleCase{c.expr[:se.Pos], c.props})
			trailingWant = append(trailingWant, answers[i])
			continue
		}
		t.Errorf("%q on %v: RocketMQ %s, flowd %s (%v)", c.expr, c.props, answers[i], got, err)
	}
	for i, c := range trailing {
		got, err := decide(c.expr, c.props)
		if got != trailingWant[i] {
			t.Errorf("%q on %v without its trailing input: RocketMQ %s, flowd %s (%v)", c.expr, c.props, trailingWant[i], got, err)
		}
	}
	t.Logf("%d cases, %d differing only by trailing input", len(cases), len(trailing))
}

// generateExpr builds a random expression from the grammar's operators, valid or not.
func generateExpr(r *rand.Rand, depth int) string {
	pick := func(s ...string) string { return s[r.Intn(len(s))] }
	if depth <= 0 || r.Intn(4) == 0 {
		return generateAtom(r)
	}
	sub := func() string { return generateExpr(r, depth-1) }
	switch r.Intn(20) {
	case 0:
		return sub() + " AND " + sub()
	case 1:
		return sub() + " OR " + sub()
	case 2:
		return "NOT " + sub()
	case 3:
		return "(" + sub() + ")"
	case 4:
		return sub() + pick(" = ", " <> ") + sub()
	case 5:
		return sub() + pick(" > ", " >= ", " < ", " <= ") + sub()
	case 6:
		return sub() + pick(" BETWEEN ", " NOT BETWEEN ") + generateAtom(r) + " AND " + generateAtom(r)
	case 7:
		return sub() + pick(" IN ", " NOT IN ") + "('x', '5', 'true', '')"
	case 8:
		return sub() + pick(" CONTAINS ", " NOT CONTAINS ", " STARTSWITH ", " NOT ENDSWITH ") + pick("'x'", "''", "'5'")
	case 9:
		return sub() + pick(" IS NULL", " IS NOT NULL")
	case 10:
		return "-" + generateAtom(r)
	case 11:
		return "+" + generateAtom(r)
	}
	return pick("a", "b", "c") + pick(" = ", " <> ", " > ", " < ", " >= ", " <= ") + generateAtom(r)
}

func generateAtom(r *rand.Rand) string {
	atoms := []string{"a", "b", "c", "5", "0", "1.5", "-3", "2147483648", "'x'", "'5'", "'true'", "TRUE", "FALSE", "NULL", ".5", "10L", "1e3"}
	return atoms[r.Intn(len(atoms))]
}

func generateProps(r *rand.Rand) map[string]string {
	pool := []string{"", "0", "5", "-3", "1.5", "abc", "true", "TRUE", "NaN", "x", "3000000000", " 7 ", "-0", "5.0", "1e3", "\u0665"}
	m := map[string]string{}
	for _, k := range []string{"a", "b", "c"} {
		if r.Intn(4) != 0 {
			m[k] = pool[r.Intn(len(pool))]
		}
	}
	return m
}
