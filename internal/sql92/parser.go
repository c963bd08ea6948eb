package sql92

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// expr is a parsed operand and where it starts, for error messages.
type expr struct {
	n   node
	pos int
}

// parser is a recursive-descent parser for RocketMQ's selector grammar (see doc.go). It
// applies the checks RocketMQ makes while building its expression tree, so an expression
// RocketMQ refuses at subscription time is refused here too.
type parser struct {
	lex   lexer
	tok   token
	depth int
}

func (p *parser) errorf(pos int, format string, args ...any) error {
	return &SyntaxError{Pos: pos, Msg: fmt.Sprintf(format, args...), Expr: p.lex.src}
}

func (p *parser) advance() error {
	t, err := p.lex.next()
	if err != nil {
		return err
	}
	p.tok = t
	return nil
}

// peek returns the token after the current one without consuming anything.
func (p *parser) peek() (token, error) {
	l := p.lex
	return l.next()
}

func (p *parser) unexpected() error {
	return p.errorf(p.tok.pos, "unexpected %s", p.tok.describe())
}

func (p *parser) expect(k tokKind, what string) (token, error) {
	if p.tok.kind != k {
		return token{}, p.errorf(p.tok.pos, "expected %s, found %s", what, p.tok.describe())
	}
	t := p.tok
	return t, p.advance()
}

func (p *parser) parseSelector() (boolNode, error) {
	if err := p.advance(); err != nil {
		return nil, err
	}
	if p.tok.kind == tEOF {
		return nil, p.errorf(0, "empty expression")
	}
	e, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	if p.tok.kind != tEOF {
		// RocketMQ stops at the first token that cannot continue the expression and
		// ignores the rest; flowd refuses it, since `a = 1 b = 2` is surely a mistake.
		return nil, p.unexpected()
	}
	return p.asBool(e)
}

// asBool is where a boolean is required (operands of AND, OR, NOT, and the whole
// selector): a property is read as a boolean; a number, a string or a negation is refused.
func (p *parser) asBool(e expr) (boolNode, error) {
	switch n := e.n.(type) {
	case *propNode:
		return &castNode{x: n}, nil
	case *constNode:
		if n.v.k == kNull || n.v.k == kBool {
			return n, nil
		}
	case boolNode:
		return n, nil
	}
	return nil, p.errorf(e.pos, "%s is not a boolean expression", formatString(e.n))
}

func (p *parser) parseOr() (expr, error) {
	left, err := p.parseAnd()
	if err != nil {
		return expr{}, err
	}
	for p.tok.kind == tOr {
		if err := p.advance(); err != nil {
			return expr{}, err
		}
		right, err := p.parseAnd()
		if err != nil {
			return expr{}, err
		}
		l, err := p.asBool(left)
		if err != nil {
			return expr{}, err
		}
		r, err := p.asBool(right)
		if err != nil {
			return expr{}, err
		}
		left = expr{&orNode{l: l, r: r}, left.pos}
	}
	return left, nil
}

func (p *parser) parseAnd() (expr, error) {
	left, err := p.parseEquality()
	if err != nil {
		return expr{}, err
	}
	for p.tok.kind == tAnd {
		if err := p.advance(); err != nil {
			return expr{}, err
		}
		right, err := p.parseEquality()
		if err != nil {
			return expr{}, err
		}
		l, err := p.asBool(left)
		if err != nil {
			return expr{}, err
		}
		r, err := p.asBool(right)
		if err != nil {
			return expr{}, err
		}
		left = expr{&andNode{l: l, r: r}, left.pos}
	}
	return left, nil
}

// checkEqualOperand: NULL cannot be an operand of = or <> (IS NULL is the way).
func (p *parser) checkEqualOperand(e expr) error {
	if c, ok := e.n.(*constNode); ok && c.v.k == kNull {
		return p.errorf(e.pos, "NULL cannot be compared with = or <>; use IS [NOT] NULL")
	}
	return nil
}

func (p *parser) parseEquality() (expr, error) {
	left, err := p.parseComparison()
	if err != nil {
		return expr{}, err
	}
	for {
		switch p.tok.kind {
		case tEq, tNe:
			not := p.tok.kind == tNe
			if err := p.advance(); err != nil {
				return expr{}, err
			}
			right, err := p.parseComparison()
			if err != nil {
				return expr{}, err
			}
			if err := p.checkEqualOperand(left); err != nil {
				return expr{}, err
			}
			if err := p.checkEqualOperand(right); err != nil {
				return expr{}, err
			}
			lc, lok := left.n.(*constNode)
			rc, rok := right.n.(*constNode)
			if lok && rok && lc.v.k == kBool && rc.v.k != kBool {
				return expr{}, p.errorf(left.pos, "%s cannot be compared with %s", formatString(lc), formatString(rc))
			}
			prop, lp := left.n.(*propNode)
			if lp && rok {
				left = expr{&propEqConst{name: prop.name, c: rc.v, not: not}, left.pos}
				continue
			}
			left = expr{&eqNode{l: left.n, r: right.n, not: not}, left.pos}
		case tIs:
			if err := p.advance(); err != nil {
				return expr{}, err
			}
			not := false
			if p.tok.kind == tNot {
				not = true
				if err := p.advance(); err != nil {
					return expr{}, err
				}
			}
			if _, err := p.expect(tNull, `NULL`); err != nil {
				return expr{}, err
			}
			left = expr{&eqNode{l: left.n, r: &constNode{v: vNull}, not: not, isNull: true}, left.pos}
		default:
			return left, nil
		}
	}
}

// checkOrderOperand: only numbers (and properties and negations, whose values are known
// only when evaluating) can be operands of <, <=, >, >= and BETWEEN; a string literal,
// TRUE, FALSE, NULL or a boolean expression is refused.
func (p *parser) checkOrderOperand(e expr) error {
	switch n := e.n.(type) {
	case *constNode:
		if n.v.k == kInt || n.v.k == kLong || n.v.k == kDouble {
			return nil
		}
	case *propNode, *negNode:
		return nil
	}
	return p.errorf(e.pos, "%s cannot be compared with <, <=, >, >= or BETWEEN", formatString(e.n))
}

func (p *parser) parseComparison() (expr, error) {
	left, err := p.parseUnary()
	if err != nil {
		return expr{}, err
	}
	for {
		not := false
		if p.tok.kind == tNot {
			next, err := p.peek()
			if err != nil {
				return expr{}, err
			}
			switch next.kind {
			case tContains, tStartsWith, tEndsWith, tBetween, tIn:
			default:
				return left, nil
			}
			not = true
			if err := p.advance(); err != nil {
				return expr{}, err
			}
		}
		switch k := p.tok.kind; k {
		case tGt, tGe, tLt, tLe:
			op := opGt + cmpOp(k-tGt) // tGt, tGe, tLt, tLe are in cmpOp order
			if err := p.advance(); err != nil {
				return expr{}, err
			}
			right, err := p.parseUnary()
			if err != nil {
				return expr{}, err
			}
			if err := p.checkOrderOperand(left); err != nil {
				return expr{}, err
			}
			if err := p.checkOrderOperand(right); err != nil {
				return expr{}, err
			}
			prop, lp := left.n.(*propNode)
			if c, rc := right.n.(*constNode); lp && rc {
				left = expr{&propOrdConst{name: prop.name, op: op, c: c.v}, left.pos}
				continue
			}
			left = expr{&ordNode{op: op, l: left.n, r: right.n}, left.pos}
		case tContains, tStartsWith, tEndsWith:
			op := opContains + strOp(k-tContains) // tContains, tStartsWith, tEndsWith are in strOp order
			if err := p.advance(); err != nil {
				return expr{}, err
			}
			lit, err := p.expect(tString, "a string literal")
			if err != nil {
				return expr{}, err
			}
			left = expr{&strOpNode{x: left.n, op: op, search: lit.str, not: not}, left.pos}
		case tBetween:
			if left, err = p.parseBetween(left, not); err != nil {
				return expr{}, err
			}
		case tIn:
			if left, err = p.parseIn(left, not); err != nil {
				return expr{}, err
			}
		default:
			return left, nil
		}
	}
}

func (p *parser) parseBetween(x expr, not bool) (expr, error) {
	if err := p.advance(); err != nil {
		return expr{}, err
	}
	lo, err := p.parseUnary()
	if err != nil {
		return expr{}, err
	}
	if _, err := p.expect(tAnd, `AND`); err != nil {
		return expr{}, err
	}
	hi, err := p.parseUnary()
	if err != nil {
		return expr{}, err
	}
	lc, lok := lo.n.(*constNode)
	hc, hok := hi.n.(*constNode)
	if !not && lok && hok {
		if lc.v.k == kNull || hc.v.k == kNull {
			return expr{}, p.errorf(lo.pos, "BETWEEN bounds cannot be NULL")
		}
		if c, ok := compare(hc.v, lc.v); !ok || c < 0 {
			return expr{}, p.errorf(lo.pos, "BETWEEN low bound %s must not exceed high bound %s", formatString(lc), formatString(hc))
		}
	}
	for _, e := range []expr{x, lo, hi} {
		if err := p.checkOrderOperand(e); err != nil {
			return expr{}, err
		}
	}
	return expr{&betweenNode{x: x.n, lo: lo.n, hi: hi.n, not: not}, x.pos}, nil
}

// inSetThreshold is the list length from which IN looks values up in a map rather than
// scanning the list.
const inSetThreshold = 8

func (p *parser) parseIn(x expr, not bool) (expr, error) {
	if err := p.advance(); err != nil {
		return expr{}, err
	}
	if _, err := p.expect(tLParen, `"("`); err != nil {
		return expr{}, err
	}
	var list []string
	for {
		lit, err := p.expect(tString, "a string literal")
		if err != nil {
			return expr{}, err
		}
		list = append(list, lit.str)
		if p.tok.kind != tComma {
			break
		}
		if err := p.advance(); err != nil {
			return expr{}, err
		}
	}
	if _, err := p.expect(tRParen, `")"`); err != nil {
		return expr{}, err
	}
	prop, ok := x.n.(*propNode)
	if !ok {
		return expr{}, p.errorf(x.pos, "IN needs a property on its left, found %s", formatString(x.n))
	}
	n := &inNode{x: prop, list: list, not: not}
	if len(list) >= inSetThreshold {
		n.set = make(map[string]struct{}, len(list))
		for _, s := range list {
			n.set[s] = struct{}{}
		}
	}
	return expr{n, x.pos}, nil
}

// nest counts one more level of nesting and refuses to go past MaxDepth.
func (p *parser) nest() error {
	p.depth++
	if p.depth > MaxDepth {
		return p.errorf(p.tok.pos, "nesting deeper than %d", MaxDepth)
	}
	return nil
}

func (p *parser) parseUnary() (expr, error) {
	start := p.tok
	switch start.kind {
	case tPlus, tMinus, tNot:
	default:
		return p.parsePrimary()
	}
	if err := p.nest(); err != nil {
		return expr{}, err
	}
	defer func() { p.depth-- }()
	if err := p.advance(); err != nil {
		return expr{}, err
	}
	x, err := p.parseUnary()
	if err != nil {
		return expr{}, err
	}
	switch start.kind {
	case tPlus:
		return expr{x.n, start.pos}, nil
	case tMinus:
		return expr{&negNode{x: x.n}, start.pos}, nil
	}
	b, err := p.asBool(x)
	if err != nil {
		return expr{}, err
	}
	return expr{&notNode{x: b}, start.pos}, nil
}

func (p *parser) parsePrimary() (expr, error) {
	t := p.tok
	var n node
	switch t.kind {
	case tString:
		n = &constNode{v: val{k: kString, s: t.str}}
	case tDecimal:
		i, err := strconv.ParseInt(strings.TrimRight(t.text, "lL"), 10, 64)
		if err != nil {
			return expr{}, p.errorf(t.pos, "integer %s out of range", t.text)
		}
		if i >= math.MinInt32 && i <= math.MaxInt32 {
			n = &constNode{v: val{k: kInt, n: i}}
		} else {
			n = &constNode{v: val{k: kLong, n: i}}
		}
	case tFloat:
		f, err := strconv.ParseFloat(t.text, 64)
		if err != nil || math.IsInf(f, 0) {
			return expr{}, p.errorf(t.pos, "number %s out of range", t.text)
		}
		if f == 0 {
			// RocketMQ refuses a floating literal below Double.MIN_VALUE, zero included.
			return expr{}, p.errorf(t.pos, "floating literal %s is zero (RocketMQ refuses it; write 0)", t.text)
		}
		n = &constNode{v: val{k: kDouble, f: f}}
	case tTrue:
		n = &constNode{v: vTrue}
	case tFalse:
		n = &constNode{v: vFalse}
	case tNull:
		n = &constNode{v: vNull}
	case tIdent:
		n = &propNode{name: t.text}
	case tLParen:
		if err := p.nest(); err != nil {
			return expr{}, err
		}
		defer func() { p.depth-- }()
		if err := p.advance(); err != nil {
			return expr{}, err
		}
		e, err := p.parseOr()
		if err != nil {
			return expr{}, err
		}
		if _, err := p.expect(tRParen, `")"`); err != nil {
			return expr{}, err
		}
		// Parentheses only group: `(a) IN ('x')` is still a property on the left of IN.
		return expr{e.n, t.pos}, nil
	default:
		return expr{}, p.unexpected()
	}
	return expr{n, t.pos}, p.advance()
}
