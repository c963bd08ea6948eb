package filter

import (
	"container/list"
	"context"
	"fmt"
	"sync"

	"github.com/flowd-io/flowd/broker/store"
)

// DefaultCacheSize is how many compiled subscriptions a Registry keeps by default.
const DefaultCacheSize = 4096

// Registry maps expression types to compilers and caches what they compile.
//
// The cache is keyed by group, topic, expression type, subscription version and expression,
// so a subscription is compiled once per version (the expression is in the key because a
// pull without the subscription flag reads with its group's heartbeat subscription, whose
// version says nothing about the pull's). It is bounded and evicts the least recently used
// entry: groups come and go, and each entry keeps its compiled form (a parsed SQL92
// selector, a Wasm filter's matcher bound to its plugin). A compiled Wasm filter holds no
// module instance: it borrows one from the plugin's pool for each call (plugins/wasmfilter).
// Errors are not cached: a type that becomes available (a module deployed) works on the next
// pull.
//
// A Registry is safe for concurrent use.
type Registry struct {
	mu    sync.Mutex
	types map[string]*registered
	max   int
	lru   *list.List // of *entry, most recent first
	byKey map[cacheKey]*list.Element
}

// registered wraps a compiler so that a replacement can be told apart by pointer (a
// CompilerFunc is not comparable).
type registered struct{ c Compiler }

type cacheKey struct {
	group, topic, typ, expr string
	version                 int64
}

type entry struct {
	key cacheKey
	f   *store.Filter
}

// NewRegistry returns a registry that compiles TAG expressions and keeps up to cacheSize
// compiled subscriptions (≤ 0: DefaultCacheSize).
func NewRegistry(cacheSize int) *Registry {
	if cacheSize <= 0 {
		cacheSize = DefaultCacheSize
	}
	r := &Registry{types: map[string]*registered{}, max: cacheSize, lru: list.New(), byKey: map[cacheKey]*list.Element{}}
	r.types[TypeTag] = &registered{Tags()}
	return r
}

// Register makes c the compiler of expressionType (SQL92, WASM, or a type of the daemon's
// own), replacing any before it; c == nil disables the type. Filters already compiled for
// the type are dropped, so the next pull of each subscription compiles with c.
func (r *Registry) Register(expressionType string, c Compiler) {
	t := normType(expressionType)
	r.mu.Lock()
	defer r.mu.Unlock()
	if c == nil {
		delete(r.types, t)
	} else {
		r.types[t] = &registered{c}
	}
	for k, el := range r.byKey {
		if k.typ == t {
			r.lru.Remove(el)
			delete(r.byKey, k)
		}
	}
}

// Filter returns the read filter of sub, compiling it on first use; nil means "every
// message". An unknown type fails with ErrUnknownType, a known type without a compiler with
// ErrUnavailable, a bad expression with the compiler's error.
func (r *Registry) Filter(ctx context.Context, sub Subscription) (*store.Filter, error) {
	t := normType(sub.ExpressionType)
	key := cacheKey{group: sub.Group, topic: sub.Topic, typ: t, expr: sub.Expression, version: sub.Version}
	r.mu.Lock()
	if el, ok := r.byKey[key]; ok {
		r.lru.MoveToFront(el)
		f := el.Value.(*entry).f
		r.mu.Unlock()
		return f, nil
	}
	reg := r.types[t]
	r.mu.Unlock()
	if reg == nil {
		return nil, unavailable(t, sub.Expression)
	}
	// Compile outside the lock: a Wasm filter may take a while to instantiate, and other
	// subscriptions must not wait for it. Two pulls of a new subscription may both compile
	// it; the first to finish is kept.
	sub.ExpressionType = t
	f, err := reg.c.Compile(ctx, sub)
	if err != nil {
		return nil, fmt.Errorf("compile %s expression %q of group %q on topic %q: %w", t, sub.Expression, sub.Group, sub.Topic, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.types[t] != reg {
		return f, nil // the type was replaced meanwhile: serve this pull, cache nothing
	}
	if el, ok := r.byKey[key]; ok {
		r.lru.MoveToFront(el)
		return el.Value.(*entry).f, nil
	}
	r.byKey[key] = r.lru.PushFront(&entry{key: key, f: f})
	for r.lru.Len() > r.max {
		old := r.lru.Back()
		r.lru.Remove(old)
		delete(r.byKey, old.Value.(*entry).key)
	}
	return f, nil
}

// Len is the number of compiled subscriptions kept.
func (r *Registry) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lru.Len()
}
