// Package sql92 implements RocketMQ's SQL92 property filter: the selector a consumer
// subscribes with through MessageSelector.bySql (expression type "SQL92"), evaluated
// against each message's properties on the broker.
//
// The aim is that a message matches here exactly when it would match on a RocketMQ broker
// (4.9, and 5.x with its CONTAINS/STARTSWITH/ENDSWITH operators), and that an expression
// RocketMQ refuses is refused here too. The rules below follow RocketMQ's filter module
// (SelectorParser.jj, ComparisonExpression, LogicExpression, UnaryExpression) and its
// broker (ExpressionMessageFilter); TestOracle checks them against that module itself.
//
// # Use
//
// Compile once per subscription; Match is safe for concurrent use and does not allocate.
//
//	sel, err := sql92.Compile("a > 5 AND region IN ('eu', 'us')")
//	if err != nil { … errors.Is(err, sql92.ErrSyntax) … refuse the subscription }
//	ok := sel.Match(func(key string) (string, bool) { v, ok := props[key]; return v, ok })
//
// # Grammar
//
// Loosest binding first; every binary operator is left-associative.
//
//	selector   = or
//	or         = and { OR and }
//	and        = equality { AND equality }
//	equality   = comparison { ( "=" | "<>" ) comparison | IS [NOT] NULL }
//	comparison = unary { ( ">" | ">=" | "<" | "<=" ) unary
//	                   | [NOT] BETWEEN unary AND unary
//	                   | [NOT] IN "(" string { "," string } ")"
//	                   | [NOT] ( CONTAINS | STARTSWITH | ENDSWITH ) string }
//	unary      = ( "+" | "-" | NOT ) unary | primary
//	primary    = string | integer | float | TRUE | FALSE | NULL | identifier | "(" or ")"
//
// Note where NOT sits: it binds tighter than every comparison, as in RocketMQ (and
// ActiveMQ, whose grammar RocketMQ's is). `NOT a = 'x'` is `(NOT a) = 'x'`, which is never
// TRUE; write `NOT (a = 'x')` or `a <> 'x'`.
//
// Lexical rules:
//   - Keywords (AND OR NOT BETWEEN IN IS NULL TRUE FALSE CONTAINS STARTSWITH ENDSWITH) are
//     case-insensitive and cannot be property names. CONTAINS, STARTSWITH and ENDSWITH are
//     RocketMQ 5.1 additions; in 4.9 they were ordinary identifiers.
//   - An identifier is [A-Za-z_$][A-Za-z0-9_$]* and names a property, case-sensitively.
//     TAGS, KEYS and the like are ordinary properties. A property whose name has other
//     characters (a dot, a hyphen) cannot be referenced.
//   - A string is in single quotes; a quote inside it is doubled.
//   - An integer is 0 or a digit string without a leading zero, optionally suffixed L; it
//     is a 32-bit Integer when it fits, else a 64-bit Long; larger is an error. A float is
//     5.5, 5., .5, 5.5E10 or 5E10; it must be finite and, as RocketMQ insists, not zero
//     (0.0 is refused: write 0). Negative numbers are unary minus applied to a literal.
//   - Whitespace is space, tab, CR, LF and form feed; -- starts a comment to the end of the
//     line (or of the expression) and /* */ encloses one. RocketMQ reads -- with no line
//     break after it as two minus signs; write "- -3" for a double negation.
//
// Checks made at compile time (each a SyntaxError, as RocketMQ refuses them):
//   - AND, OR, NOT and the whole selector need booleans: a comparison, TRUE, FALSE, NULL,
//     or a bare property (see below). A number, a string or a negation is refused.
//   - = and <> refuse a NULL operand, and TRUE/FALSE on the left of a non-boolean literal.
//   - < <= > >= and BETWEEN take numbers, properties and negations only: a string literal,
//     TRUE, FALSE, NULL or a comparison is refused. RocketMQ never orders strings.
//   - BETWEEN with two literal bounds refuses NULL and a low bound above the high bound.
//   - IN needs a property on its left (parentheses around it are fine) and string
//     literals in its list. CONTAINS and friends need a string literal on their right.
//   - Limits, which RocketMQ does not have: at most MaxLength (4096) bytes and MaxDepth
//     (100) nested parentheses and prefix operators.
//   - Deliberate difference: RocketMQ's parser stops at the first token that cannot
//     continue the expression and ignores the rest (`a = 1 b = 2` is `a = 1`, `a = 05` is
//     `a = 0`). flowd refuses such trailing input. A -- comment may end the expression
//     without a line break.
//
// # Evaluation
//
// Values are NULL, booleans, Integers, Longs, Doubles and strings; a property's value is
// always a string, and a missing property is NULL. A message matches only when the
// selector evaluates to TRUE: FALSE and NULL leave it out.
//
// Three-valued logic: AND is FALSE if either side is FALSE, else NULL if either is NULL;
// OR is TRUE if either side is TRUE, else NULL if either is NULL; NOT NULL is NULL. Both
// stop at the left side when it decides the result.
//
//   - A bare property used as a boolean (`a`, `NOT a`, `a AND b`) is NULL when missing and
//     FALSE otherwise, since a string is never a Boolean. So `NOT a` means "a is present".
//   - = compares; <> is NOT(=). With a NULL side: both NULL is TRUE (so `a = b` is TRUE when
//     both are missing), NULL on the left only is NULL, NULL on the right only is FALSE.
//     So `a <> 'x'` does not match a message without a.
//   - < <= > >= are NULL when either side is NULL (the right side is then not evaluated
//     if the left is).
//   - BETWEEN is `x >= lo AND x <= hi`; NOT BETWEEN is `x < lo OR x > hi`.
//   - IS NULL is TRUE exactly when the operand is NULL; IS NOT NULL is its negation.
//   - IN is NULL for a missing property, else list membership (NOT IN: non-membership);
//     so NOT IN does not match a message without the property.
//   - CONTAINS, STARTSWITH, ENDSWITH and their NOT forms are never NULL: an empty literal,
//     a missing property or a non-string operand make them FALSE, NOT forms included.
//   - Unary minus negates a number (Java overflow wraps) and is NULL for anything else.
//
// Conversions, when the two sides of a comparison differ in type (RocketMQ's rules):
//   - Two strings: = and <> compare them as strings; < <= > >= parse both as Doubles.
//   - A string and an Integer literal: the string is parsed as a Java int (optional sign,
//     decimal digits, Unicode ones included, no spaces, no fraction, 32-bit range); with a
//     Long, as a Java long; with a Double, as Double.valueOf does (surrounding spaces
//     trimmed, exponents, NaN, Infinity, hex floats, an f/d suffix). So `a > 5` fails on
//     "5.5" and on "3000000000" where `a > 5.0` does not.
//   - A string with TRUE or FALSE on its right: "true" in any case reads as TRUE, anything
//     else as FALSE (Boolean.valueOf).
//   - Numbers widen Integer → Long → Double. Doubles order as Java's Double.compare: -0.0
//     is below 0.0 and NaN above everything (so "NaN" > 1.0 is TRUE).
//   - A boolean and a number are never equal. A boolean on the left of a string is an
//     error; a string on the left of a boolean is read with Boolean.valueOf.
//
// Evaluation errors: when a conversion fails (`a = 5` with a = "abc"), RocketMQ's
// evaluator throws and the broker drops the message from the result, whatever the
// enclosing operators: `a = 5 OR b = 1` does not match a = "abc", b = "1", while
// `b = 1 OR a = 5` does, since OR stops at its TRUE left side. Match reproduces this.
//
// Known differences that remain: Java compares strings as UTF-16 while flowd compares
// bytes, which agree on equality and substring tests for valid UTF-8 (the only tests
// strings undergo); a property value that is invalid UTF-8 is compared as raw bytes where
// Java would see replacement characters.
package sql92
