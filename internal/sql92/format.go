package sql92

import (
	"strconv"
	"strings"
)

// Precedence levels of the grammar, loosest first. An operand is parenthesized only when
// its level is below what its position in the grammar takes.
const (
	lvlOr = iota + 1
	lvlAnd
	lvlEquality   // = <> IS [NOT] NULL
	lvlComparison // < <= > >= [NOT] BETWEEN [NOT] IN [NOT] CONTAINS …
	lvlUnary      // NOT, unary minus
	lvlPrimary    // literals, properties
)

func level(n node) int {
	switch n.(type) {
	case *orNode:
		return lvlOr
	case *andNode:
		return lvlAnd
	case *eqNode, *propEqConst:
		return lvlEquality
	case *ordNode, *propOrdConst, *betweenNode, *inNode, *strOpNode:
		return lvlComparison
	case *notNode, *negNode:
		return lvlUnary
	}
	return lvlPrimary
}

func formatString(n node) string {
	var b strings.Builder
	format(&b, n)
	return b.String()
}

func formatAt(b *strings.Builder, n node, min int) {
	if level(n) < min {
		b.WriteByte('(')
		format(b, n)
		b.WriteByte(')')
		return
	}
	format(b, n)
}

func quote(b *strings.Builder, s string) {
	b.WriteByte('\'')
	b.WriteString(strings.ReplaceAll(s, "'", "''"))
	b.WriteByte('\'')
}

func writeNot(b *strings.Builder, not bool) {
	if not {
		b.WriteString(" NOT")
	}
}

func format(b *strings.Builder, n node) {
	switch n := n.(type) {
	case *orNode:
		formatAt(b, n.l, lvlOr)
		b.WriteString(" OR ")
		formatAt(b, n.r, lvlAnd)
	case *andNode:
		formatAt(b, n.l, lvlAnd)
		b.WriteString(" AND ")
		formatAt(b, n.r, lvlEquality)
	case *eqNode:
		formatAt(b, n.l, lvlEquality)
		switch {
		case n.isNull && n.not:
			b.WriteString(" IS NOT NULL")
		case n.isNull:
			b.WriteString(" IS NULL")
		default:
			if n.not {
				b.WriteString(" <> ")
			} else {
				b.WriteString(" = ")
			}
			formatAt(b, n.r, lvlComparison)
		}
	case *propEqConst:
		b.WriteString(n.name)
		if n.not {
			b.WriteString(" <> ")
		} else {
			b.WriteString(" = ")
		}
		formatConst(b, n.c)
	case *propOrdConst:
		b.WriteString(n.name)
		b.WriteByte(' ')
		b.WriteString(cmpSymbols[n.op])
		b.WriteByte(' ')
		formatConst(b, n.c)
	case *ordNode:
		formatAt(b, n.l, lvlComparison)
		b.WriteByte(' ')
		b.WriteString(cmpSymbols[n.op])
		b.WriteByte(' ')
		formatAt(b, n.r, lvlUnary)
	case *betweenNode:
		formatAt(b, n.x, lvlComparison)
		writeNot(b, n.not)
		b.WriteString(" BETWEEN ")
		formatAt(b, n.lo, lvlUnary)
		b.WriteString(" AND ")
		formatAt(b, n.hi, lvlUnary)
	case *inNode:
		b.WriteString(n.x.name)
		writeNot(b, n.not)
		b.WriteString(" IN (")
		for i, s := range n.list {
			if i > 0 {
				b.WriteString(", ")
			}
			quote(b, s)
		}
		b.WriteByte(')')
	case *strOpNode:
		formatAt(b, n.x, lvlComparison)
		writeNot(b, n.not)
		b.WriteByte(' ')
		b.WriteString(strOpSymbols[n.op])
		b.WriteByte(' ')
		quote(b, n.search)
	case *notNode:
		b.WriteString("NOT ")
		formatAt(b, n.x, lvlUnary)
	case *negNode:
		b.WriteByte('-')
		if _, ok := n.x.(*negNode); ok {
			b.WriteByte(' ') // "--" would start a comment
		}
		formatAt(b, n.x, lvlUnary)
	case *castNode:
		b.WriteString(n.x.name)
	case *propNode:
		b.WriteString(n.name)
	case *constNode:
		formatConst(b, n.v)
	}
}

func formatConst(b *strings.Builder, v val) {
	switch v.k {
	case kNull:
		b.WriteString("NULL")
	case kBool:
		if v.n != 0 {
			b.WriteString("TRUE")
		} else {
			b.WriteString("FALSE")
		}
	case kInt, kLong:
		b.WriteString(strconv.FormatInt(v.n, 10))
	case kDouble:
		s := strconv.FormatFloat(v.f, 'g', -1, 64)
		b.WriteString(s)
		if !strings.ContainsAny(s, ".e") {
			b.WriteString(".0") // keep it a floating literal
		}
	case kString:
		quote(b, v.s)
	}
}
