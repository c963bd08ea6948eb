// Package filter compiles the subscriptions of pulls into the store's read filters.
//
// A pull names an expression type and an expression (RocketMQ's subscription: "TAG" with
// "a || b", "SQL92" with "price > 10 AND region = 'eu'", and flowd's "WASM", whose
// expression names a deployed filter module). A Registry maps each type to a Compiler and
// keeps the compiled filters, so that a subscription is compiled once per version, not once
// per pull. Tag expressions are built in; SQL92 and Wasm filters are plugged in by the
// daemon (Registry.Register with SQL92 and Batch), because their engines live elsewhere.
//
// A compiled filter is a *store.Filter: tag codes the store checks on consume-queue units,
// and optionally a store.BatchFilter that decides on whole windows of messages at once.
package filter

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/protocol"
)

// Expression types a RocketMQ or flowd client may name. Type names are matched without
// regard to case; an empty type is TAG.
const (
	TypeTag   = "TAG"
	TypeSQL92 = "SQL92"
	TypeWasm  = "WASM"
)

// Errors of Registry.Filter. The broker answers both with SUBSCRIPTION_PARSE_FAILED and the
// error as remark; a compiler's own errors (a bad expression) are answered the same way.
var (
	// ErrUnknownType: the expression type is none this broker knows.
	ErrUnknownType = errors.New("unknown expression type")
	// ErrUnavailable: the expression type is known but no compiler is registered for it
	// (SQL92 or WASM filtering is not enabled on this broker).
	ErrUnavailable = errors.New("expression type not enabled on this broker")
)

// Subscription is what a pull reads with.
type Subscription struct {
	Group, Topic   string
	ExpressionType string
	Expression     string
	// Version is the subscription's version (subVersion): a client that changes its
	// expression sends a new one.
	Version int64
}

// Compiler builds the filter of one expression type.
type Compiler interface {
	// Compile builds the read filter of sub; nil means "every message". The result is
	// shared by every pull of the subscription, concurrently, and must not change.
	Compile(ctx context.Context, sub Subscription) (*store.Filter, error)
}

// CompilerFunc is a Compiler written as a function.
type CompilerFunc func(ctx context.Context, sub Subscription) (*store.Filter, error)

// Compile calls f.
func (f CompilerFunc) Compile(ctx context.Context, sub Subscription) (*store.Filter, error) {
	return f(ctx, sub)
}

// Tags compiles TAG expressions: "*" or blank takes every message; otherwise the
// expression is split on "||", trimmed, and a message passes when its consume-queue tag
// code is one of the tags' codes. Like RocketMQ, the broker matches codes only: a client
// re-checks the tag string, since two tags can share a hash.
func Tags() Compiler {
	return CompilerFunc(func(_ context.Context, sub Subscription) (*store.Filter, error) {
		tags := protocol.ParseTagExpression(sub.Expression)
		if tags == nil {
			return nil, nil
		}
		f := &store.Filter{TagsCodes: make([]int64, 0, len(tags))}
		for _, t := range tags {
			f.TagsCodes = append(f.TagsCodes, protocol.TagsCode(t))
		}
		return f, nil
	})
}

// normType is the canonical spelling of an expression type.
func normType(t string) string {
	t = strings.ToUpper(strings.TrimSpace(t))
	if t == "" {
		return TypeTag
	}
	return t
}

// unavailable is the error of a type with no compiler.
func unavailable(t, expr string) error {
	switch t {
	case TypeSQL92, TypeWasm:
		return fmt.Errorf("%s filtering is not enabled on this broker (expression %q): %w", t, expr, ErrUnavailable)
	}
	return fmt.Errorf("expression type %q (expression %q): %w", t, expr, ErrUnknownType)
}
