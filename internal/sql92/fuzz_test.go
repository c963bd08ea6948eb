package sql92

import (
	"errors"
	"slices"
	"testing"
)

// propertyNames lists the properties a selector reads.
func propertyNames(n node, into map[string]bool) {
	switch n := n.(type) {
	case *propNode:
		into[n.name] = true
	case *castNode:
		into[n.x.name] = true
	case *inNode:
		into[n.x.name] = true
	case *propEqConst:
		into[n.name] = true
	case *propOrdConst:
		into[n.name] = true
	case *negNode:
		propertyNames(n.x, into)
	case *notNode:
		propertyNames(n.x, into)
	case *strOpNode:
		propertyNames(n.x, into)
	case *andNode:
		propertyNames(n.l, into)
		propertyNames(n.r, into)
	case *orNode:
		propertyNames(n.l, into)
		propertyNames(n.r, into)
	case *eqNode:
		propertyNames(n.l, into)
		propertyNames(n.r, into)
	case *ordNode:
		propertyNames(n.l, into)
		propertyNames(n.r, into)
	case *betweenNode:
		propertyNames(n.x, into)
		propertyNames(n.lo, into)
		propertyNames(n.hi, into)
	}
}

// propertySets gives the selector's properties values that exercise its conversions:
// integers, decimals, non-numbers, booleans, NaN, and absence.
func propertySets(sel *Selector, seed []byte) []map[string]string {
	names := map[string]bool{}
	propertyNames(sel.root, names)
	sorted := make([]string, 0, len(names))
	for k := range names {
		sorted = append(sorted, k)
	}
	slices.Sort(sorted)
	pool := []string{"", "0", "5", "-3", "1.5", "abc", "true", "NaN", "eu", "x", "3000000000", " 7 ", "-0", "absent"}
	sets := []map[string]string{{}}
	for round := range 12 {
		m := map[string]string{}
		for i, k := range sorted {
			j := round*7 + i*3
			if len(seed) > 0 {
				j += int(seed[(round+i)%len(seed)])
			}
			if v := pool[j%len(pool)]; v != "absent" {
				m[k] = v
			}
		}
		sets = append(sets, m)
	}
	return sets
}

// FuzzCompile: Compile never panics and refuses with a positioned SyntaxError; what it
// accepts prints to a canonical form that compiles to a selector deciding every message
// the same way.
func FuzzCompile(f *testing.F) {
	for _, c := range matchCases {
		f.Add(c.expr)
	}
	for _, s := range []string{
		"a AND AND b", "a = 'x", "((((a))))", "a BETWEEN 10 AND 0", "NOT NOT NOT a",
		"a IN ('x', 'y''z')", "x > -2147483648 OR y < 9223372036854775807L", "a = 1 -- c\n OR b",
		"- - - 1 = a", "a = 1e21 OR b < .5", "a = 1 IS NULL = FALSE", "/**/a/**/=/**/1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		sel, err := Compile(expr)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) || !errors.Is(err, ErrSyntax) {
				t.Fatalf("Compile(%q): error %v is not a SyntaxError", expr, err)
			}
			if se.Pos < 0 || se.Pos > len(expr) {
				t.Fatalf("Compile(%q): position %d outside the expression", expr, se.Pos)
			}
			_ = se.Error()
			return
		}
		canon := sel.String()
		if len(canon) > MaxLength {
			return // the canonical spacing can lengthen an expression past the limit
		}
		again, err := Compile(canon)
		if err != nil {
			t.Fatalf("Compile(%q) ok, but its canonical form %q fails: %v", expr, canon, err)
		}
		if again.String() != canon {
			t.Fatalf("canonical form not stable: %q -> %q -> %q", expr, canon, again.String())
		}
		for _, m := range propertySets(sel, []byte(expr)) {
			if a, b := sel.Match(mapGetter(m)), again.Match(mapGetter(m)); a != b {
				t.Fatalf("%q and its canonical form %q differ on %v: %v vs %v", expr, canon, m, a, b)
			}
		}
	})
}
