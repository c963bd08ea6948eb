package sql92

import (
	"math"
	"strings"
)

// kind is the Java type a value has in RocketMQ's evaluator. Integer and Long are kept
// apart because RocketMQ parses a property compared with an Integer literal as a Java int
// (so "3000000000" fails there) and one compared with a Long literal as a long.
type kind uint8

const (
	kNull kind = iota
	kBool
	kInt    // java.lang.Integer: a decimal literal that fits 32 bits
	kLong   // java.lang.Long: a wider decimal literal
	kDouble // java.lang.Double: a floating literal, or a string converted for comparison
	kString // a property value or a string literal
)

// val is one operand's value, held by value so evaluation does not allocate. n holds a
// bool (0/1), an Integer or a Long; f a Double; s a String.
type val struct {
	k kind
	n int64
	f float64
	s string
}

var (
	vNull  = val{k: kNull}
	vTrue  = val{k: kBool, n: 1}
	vFalse = val{k: kBool}
)

type getter = func(key string) (string, bool)

// tri is the result of a boolean operator: RocketMQ's TRUE, FALSE and NULL, and triErr for
// an evaluation that failed the way a Java exception fails RocketMQ's: the whole selector
// is then not matched, whatever the enclosing operators are.
type tri uint8

const (
	triFalse tri = iota
	triTrue
	triNull
	triErr
)

func triOf(b bool) tri {
	if b {
		return triTrue
	}
	return triFalse
}

// value turns a boolean result into a value, for a boolean used as an operand of =, <>,
// IS NULL or CONTAINS.
func (t tri) value() (val, bool) {
	switch t {
	case triTrue:
		return vTrue, true
	case triFalse:
		return vFalse, true
	case triNull:
		return vNull, true
	}
	return vNull, false
}

// node is one operand or operator of a compiled selector; eval returns its value, and false
// when evaluation failed (triErr).
type node interface {
	eval(get getter) (val, bool)
}

// boolNode is a node that yields a boolean: the operators, TRUE, FALSE, NULL, and a
// property read as a boolean. test is its fast path, used wherever a boolean is wanted.
type boolNode interface {
	node
	test(get getter) tri
}

type propNode struct{ name string }

func (n *propNode) eval(get getter) (val, bool) {
	s, ok := get(n.name)
	if !ok {
		return vNull, true
	}
	return val{k: kString, s: s}, true
}

// constNode is a literal. TRUE, FALSE and NULL are boolean expressions too.
type constNode struct{ v val }

func (n *constNode) eval(getter) (val, bool) { return n.v, true }

func (n *constNode) test(getter) tri {
	switch n.v.k {
	case kBool:
		return triOf(n.v.n != 0)
	case kNull:
		return triNull
	}
	return triFalse // not reached: the parser lets only TRUE, FALSE and NULL be tested
}

// negNode is unary minus. A property value is a string, which RocketMQ does not negate: the
// result is NULL.
type negNode struct{ x node }

func (n *negNode) eval(get getter) (val, bool) {
	v, ok := n.x.eval(get)
	if !ok {
		return v, false
	}
	switch v.k {
	case kInt:
		return val{k: kInt, n: int64(-int32(v.n))}, true
	case kLong:
		return val{k: kLong, n: -v.n}, true
	case kDouble:
		return val{k: kDouble, f: -v.f}, true
	}
	return vNull, true
}

// castNode is a property used where a boolean is wanted (`a AND b`, `NOT a`): NULL when the
// property is missing, otherwise FALSE, since a property value is never a Java Boolean.
type castNode struct{ x *propNode }

func (n *castNode) eval(get getter) (val, bool) { return n.test(get).value() }

func (n *castNode) test(get getter) tri {
	if _, ok := get(n.x.name); !ok {
		return triNull
	}
	return triFalse
}

type notNode struct{ x boolNode }

func (n *notNode) eval(get getter) (val, bool) { return n.test(get).value() }

func (n *notNode) test(get getter) tri {
	switch t := n.x.test(get); t {
	case triTrue:
		return triFalse
	case triFalse:
		return triTrue
	default:
		return t
	}
}

type andNode struct{ l, r boolNode }

func (n *andNode) eval(get getter) (val, bool) { return n.test(get).value() }

func (n *andNode) test(get getter) tri {
	l := n.l.test(get)
	if l == triFalse || l == triErr {
		return l
	}
	r := n.r.test(get)
	if r == triFalse || r == triErr {
		return r
	}
	if l == triNull || r == triNull {
		return triNull
	}
	return triTrue
}

type orNode struct{ l, r boolNode }

func (n *orNode) eval(get getter) (val, bool) { return n.test(get).value() }

func (n *orNode) test(get getter) tri {
	l := n.l.test(get)
	if l == triTrue || l == triErr {
		return l
	}
	r := n.r.test(get)
	if r == triTrue || r == triErr {
		return r
	}
	if l == triNull || r == triNull {
		return triNull
	}
	return triFalse
}

// eqNode is `=`, `<>` (not), `IS NULL` and `IS NOT NULL` (isNull, r is the NULL constant).
// Both sides are evaluated before comparing.
type eqNode struct {
	l, r   node
	not    bool
	isNull bool
}

func (n *eqNode) eval(get getter) (val, bool) { return n.test(get).value() }

func (n *eqNode) test(get getter) tri {
	lv, ok := n.l.eval(get)
	if !ok {
		return triErr
	}
	rv, ok := n.r.eval(get)
	if !ok {
		return triErr
	}
	return negateIf(equal(lv, rv), n.not)
}

func negateIf(t tri, not bool) tri {
	if not && t <= triTrue {
		return t ^ 1
	}
	return t
}

// propEqConst is eqNode for the common `prop = literal` and `prop <> literal`.
type propEqConst struct {
	name string
	c    val
	not  bool
}

func (n *propEqConst) eval(get getter) (val, bool) { return n.test(get).value() }

func (n *propEqConst) test(get getter) tri {
	s, ok := get(n.name)
	if !ok {
		return triNull
	}
	if n.c.k == kString {
		return triOf((s == n.c.s) != n.not)
	}
	return negateIf(equal(val{k: kString, s: s}, n.c), n.not)
}

// equal is RocketMQ's `=`: NULL when only the left side is NULL, FALSE when only the right
// is, TRUE when both are; otherwise the values are compared after RocketMQ's conversions.
func equal(lv, rv val) tri {
	if (lv.k == kNull) != (rv.k == kNull) {
		if lv.k == kNull {
			return triNull
		}
		return triFalse
	}
	if lv.k == kNull {
		return triTrue
	}
	if lv.k == kString && rv.k == kString {
		return triOf(lv.s == rv.s)
	}
	c, ok := compare(lv, rv)
	if !ok {
		return triErr
	}
	return triOf(c == 0)
}

type cmpOp uint8

const (
	opGt cmpOp = iota
	opGe
	opLt
	opLe
)

var cmpSymbols = [...]string{opGt: ">", opGe: ">=", opLt: "<", opLe: "<="}

func (op cmpOp) holds(c int) bool {
	switch op {
	case opGt:
		return c > 0
	case opGe:
		return c >= 0
	case opLt:
		return c < 0
	}
	return c <= 0
}

type ordNode struct {
	op   cmpOp
	l, r node
}

func (n *ordNode) eval(get getter) (val, bool) { return n.test(get).value() }

func (n *ordNode) test(get getter) tri {
	lv, ok := n.l.eval(get)
	if !ok {
		return triErr
	}
	return order(n.op, lv, n.r, get)
}

// propOrdConst is ordNode for the common `prop > number` and its siblings.
type propOrdConst struct {
	name string
	op   cmpOp
	c    val
}

func (n *propOrdConst) eval(get getter) (val, bool) { return n.test(get).value() }

func (n *propOrdConst) test(get getter) tri {
	s, ok := get(n.name)
	if !ok {
		return triNull
	}
	c, ok := compare(val{k: kString, s: s}, n.c)
	if !ok {
		return triErr
	}
	return triOf(n.op.holds(c))
}

// order is RocketMQ's `>`, `>=`, `<`, `<=` with the left side already evaluated: NULL if
// either side is NULL (the right side is not evaluated when the left is NULL); two strings
// are both converted to Double; other mixes are converted as in compare.
func order(op cmpOp, lv val, r node, get getter) tri {
	if lv.k == kNull {
		return triNull
	}
	rv, ok := r.eval(get)
	if !ok {
		return triErr
	}
	if rv.k == kNull {
		return triNull
	}
	var c int
	if lv.k == kString && rv.k == kString {
		lf, ok1 := parseJavaDouble(lv.s)
		rf, ok2 := parseJavaDouble(rv.s)
		if !ok1 || !ok2 {
			return triErr
		}
		c = compareDouble(lf, rf)
	} else if c, ok = compare(lv, rv); !ok {
		return triErr
	}
	return triOf(op.holds(c))
}

// betweenNode is `x BETWEEN lo AND hi`, which RocketMQ evaluates as
// `x >= lo AND x <= hi`, and `x NOT BETWEEN lo AND hi`, evaluated as `x < lo OR x > hi`.
// x is evaluated once: it has no side effects, so this changes nothing but the cost.
type betweenNode struct {
	x, lo, hi node
	not       bool
}

func (n *betweenNode) eval(get getter) (val, bool) { return n.test(get).value() }

func (n *betweenNode) test(get getter) tri {
	xv, ok := n.x.eval(get)
	if !ok {
		return triErr
	}
	if n.not {
		a := order(opLt, xv, n.lo, get)
		if a == triTrue || a == triErr {
			return a
		}
		b := order(opGt, xv, n.hi, get)
		if b == triTrue || b == triErr {
			return b
		}
		if a == triNull || b == triNull {
			return triNull
		}
		return triFalse
	}
	a := order(opGe, xv, n.lo, get)
	if a == triFalse || a == triErr {
		return a
	}
	b := order(opLe, xv, n.hi, get)
	if b == triFalse || b == triErr {
		return b
	}
	if a == triNull || b == triNull {
		return triNull
	}
	return triTrue
}

// inNode is `prop [NOT] IN ('a', …)`: NULL when the property is missing, so NOT IN does not
// match a message without the property.
type inNode struct {
	x    *propNode
	list []string
	set  map[string]struct{} // built for long lists only
	not  bool
}

func (n *inNode) eval(get getter) (val, bool) { return n.test(get).value() }

func (n *inNode) test(get getter) tri {
	s, ok := get(n.x.name)
	if !ok {
		return triNull
	}
	found := false
	if n.set != nil {
		_, found = n.set[s]
	} else {
		for _, e := range n.list {
			if e == s {
				found = true
				break
			}
		}
	}
	return triOf(found != n.not)
}

type strOp uint8

const (
	opContains strOp = iota
	opStartsWith
	opEndsWith
)

var strOpSymbols = [...]string{opContains: "CONTAINS", opStartsWith: "STARTSWITH", opEndsWith: "ENDSWITH"}

// strOpNode is `x [NOT] CONTAINS|STARTSWITH|ENDSWITH 'lit'` (RocketMQ 5.1+). Unlike the
// other operators it is never NULL: an empty literal, a missing property or a non-string
// operand give FALSE, for the NOT forms too.
type strOpNode struct {
	x      node
	op     strOp
	search string
	not    bool
}

func (n *strOpNode) eval(get getter) (val, bool) { return n.test(get).value() }

func (n *strOpNode) test(get getter) tri {
	if n.search == "" {
		return triFalse
	}
	v, ok := n.x.eval(get)
	if !ok {
		return triErr
	}
	if v.k != kString {
		return triFalse
	}
	var found bool
	switch n.op {
	case opContains:
		found = strings.Contains(v.s, n.search)
	case opStartsWith:
		found = strings.HasPrefix(v.s, n.search)
	default:
		found = strings.HasSuffix(v.s, n.search)
	}
	return triOf(found != n.not)
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// compareDouble is Java's Double.compare: -0.0 is below 0.0 and NaN is above every other
// value and equal to itself.
func compareDouble(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	ab, bb := int64(math.Float64bits(a)), int64(math.Float64bits(b))
	if a != a {
		ab = 0x7ff8000000000000
	}
	if b != b {
		bb = 0x7ff8000000000000
	}
	return cmpInt(ab, bb)
}

// compare orders two non-NULL values as RocketMQ's ComparisonExpression does. Values of
// one kind compare directly. Mixed numbers widen (Integer → Long → Double). A string meets
// a number by being parsed as that number's Java type, and a Boolean by Boolean.valueOf;
// a parse failure is an evaluation error (ok false). A Boolean on the left of a string is
// an error too (a ClassCastException in RocketMQ). Any other mix compares as -1.
func compare(lv, rv val) (int, bool) {
	if lv.k == rv.k {
		switch lv.k {
		case kDouble:
			return compareDouble(lv.f, rv.f), true
		case kString:
			return strings.Compare(lv.s, rv.s), true
		}
		return cmpInt(lv.n, rv.n), true
	}
	switch lv.k {
	case kBool:
		if rv.k == kString {
			return 0, false
		}
	case kInt, kLong:
		switch rv.k {
		case kInt, kLong:
			return cmpInt(lv.n, rv.n), true
		case kDouble:
			return compareDouble(float64(lv.n), rv.f), true
		case kString:
			r, ok := parseJavaInt(rv.s, lv.k == kInt)
			return cmpInt(lv.n, r), ok
		}
	case kDouble:
		switch rv.k {
		case kInt, kLong:
			return compareDouble(lv.f, float64(rv.n)), true
		case kString:
			r, ok := parseJavaDouble(rv.s)
			return compareDouble(lv.f, r), ok
		}
	case kString:
		switch rv.k {
		case kBool:
			var l int64
			if javaBool(lv.s) {
				l = 1
			}
			return cmpInt(l, rv.n), true
		case kInt, kLong:
			l, ok := parseJavaInt(lv.s, rv.k == kInt)
			return cmpInt(l, rv.n), ok
		case kDouble:
			l, ok := parseJavaDouble(lv.s)
			return compareDouble(l, rv.f), ok
		}
	}
	return -1, true
}
