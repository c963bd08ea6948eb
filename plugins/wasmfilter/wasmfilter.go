// Package wasmfilter plugs the filter plugins of a plugins.Registry into the broker's read
// path: it is the compiler of the WASM expression type of broker/filter.
//
// A subscription's expression names a deployed filter plugin:
//
//	big-orders          the active version of big-orders, whichever it is
//	big-orders@1.0.0    big-orders only while 1.0.0 is its active version
//
// Parameters are given at deploy time, in the manifest (flowd_init receives them once per
// instance), so an expression carrying its own ("big-orders?threshold=100") is refused:
// per-subscription parameters are not supported yet.
//
// A compiled filter follows the registry: every call borrows an instance of the plugin's
// active version, so activating another version takes effect on the next pull of every
// subscription naming just the plugin, without recompiling it. Whether bodies are
// decompressed and passed (the manifest's wants_body) is read on every call too, from the
// manifest of the version whose instance the call borrowed.
//
// This package sits between plugins and broker/filter so that neither imports the other.
package wasmfilter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/flowd-io/flowd/broker/filter"
	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/protocol"
	"github.com/flowd-io/flowd/runtime"
)

// ErrParameters: the expression carries parameters; plugins take theirs from the manifest.
var ErrParameters = errors.New("per-subscription parameters are not supported (set them in the plugin's manifest)")

// ErrNotActive: a subscription pinned to name@version reads while another version (or
// none) is active.
var ErrNotActive = errors.New("filter plugin version not active")

// Fault is one call of a filter plugin whose fault stopped the plugin's active version
// (its policy failed it open or closed).
type Fault struct {
	Name, Version string
	Err           error
}

// Options configure the compiler.
type Options struct {
	// OnFault is called (on the reading pull's goroutine; it must not block) when a
	// plugin's fault policy stops its active version: once per stop, by the call whose fault
	// stopped it; calls faulting at the same time and later calls do not. Default: nothing.
	OnFault func(Fault)
	// MaxBodySize bounds a decompressed body. Default protocol.MaxFrameSize.
	MaxBodySize int
	// Logger receives bodies that do not decompress. Default: discard.
	Logger *slog.Logger
}

// Expression is a parsed WASM subscription expression.
type Expression struct {
	Name    string
	Version string // "" follows the active version
}

// ParseExpression parses "name" or "name@version". Parameters ("name?k=v") fail with
// ErrParameters.
func ParseExpression(expr string) (Expression, error) {
	expr = strings.TrimSpace(expr)
	if i := strings.IndexAny(expr, "?&"); i >= 0 {
		return Expression{}, fmt.Errorf("wasm filter %q: %w", expr, ErrParameters)
	}
	name, version, pinned := strings.Cut(expr, "@")
	if name == "" {
		return Expression{}, fmt.Errorf("wasm filter expression %q: want name or name@version", expr)
	}
	if pinned && version == "" {
		return Expression{}, fmt.Errorf("wasm filter expression %q: empty version after '@'", expr)
	}
	return Expression{Name: name, Version: version}, nil
}

// Compiler returns the compiler of the WASM expression type over reg, to register with
// filter.Registry.Register(filter.TypeWasm, …). An expression naming no deployed filter,
// a plugin without an active version, or another kind of plugin fails to compile (the pull
// is answered SUBSCRIPTION_PARSE_FAILED naming it).
//
// Faults follow the plugin's own policy: fail_open delivers the batch, fail_closed (and a
// reload that faulted) holds the queue at the batch, answering the pull SYSTEM_ERROR, until
// a working version is activated; other queues and groups are not held up.
func Compiler(reg *plugins.Registry, opts Options) filter.Compiler {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.MaxBodySize <= 0 {
		opts.MaxBodySize = protocol.MaxFrameSize
	}
	pool := &sync.Pool{New: func() any { return new(batch) }}
	resolve := func(_ context.Context, sub filter.Subscription) (filter.BatchMatcher, error) {
		e, err := ParseExpression(sub.Expression)
		if err != nil {
			return nil, err
		}
		f, err := reg.Filter(e.Name)
		if errors.Is(err, plugins.ErrNotFound) {
			return nil, fmt.Errorf("no filter plugin %q is deployed: %w", e.Name, err)
		}
		if err != nil {
			return nil, err
		}
		active := reg.ActiveVersion(e.Name)
		if active == "" {
			return nil, fmt.Errorf("filter plugin %q has no active version: %w", e.Name, ErrNotActive)
		}
		if e.Version != "" && e.Version != active {
			return nil, fmt.Errorf("filter plugin %s@%s is not active (active: %s): %w", e.Name, e.Version, active, ErrNotActive)
		}
		return &matcher{reg: reg, f: f, expr: e, opts: &opts, pool: pool}, nil
	}
	// The matcher applies the plugin's fault policy itself (fail_open answers with every
	// message kept and no error), so what reaches the read path is a failure to hold on.
	return filter.Batch(resolve, store.FailClosed)
}

// matcher is one subscription's filter: the plugin's slot, resolved per call.
type matcher struct {
	reg  *plugins.Registry
	f    *plugins.Filter
	expr Expression
	opts *Options
	pool *sync.Pool // of *batch, shared by the compiler's matchers
}

// batch is the per-call scratch space, pooled: a pull's window is up to a few hundred
// messages and the read path is hot.
type batch struct {
	msgs   []plugins.Message
	bodies [][]byte
	dec    protocol.Decompressor
}

func (m *matcher) Match(ctx context.Context, msgs []filter.Message, keep []bool) error {
	b := m.pool.Get().(*batch)
	defer func() {
		clear(b.msgs) // drop references into the store's read buffer
		b.msgs = b.msgs[:0]
		m.pool.Put(b)
	}()
	// The messages are made for the version whose instance was borrowed, so that its
	// manifest (wants_body, the pinned version) and its verdicts are one version's.
	err := m.f.MatchWith(ctx, keep, func(man *plugins.Manifest) ([]plugins.Message, error) {
		if m.expr.Version != "" && man.Version != m.expr.Version {
			return nil, fmt.Errorf("filter plugin %s@%s is not active (active: %s): %w", m.expr.Name, m.expr.Version, man.Version, ErrNotActive)
		}
		b.msgs = b.msgs[:0]
		for i := range msgs {
			src := &msgs[i]
			pm := plugins.Message{
				Topic: src.Topic, QueueID: src.QueueID, QueueOffset: src.QueueOffset,
				StoreTimestamp: src.StoreTimestamp, Tags: src.Tags, Keys: src.Keys,
				Properties: src.Properties,
			}
			if man.WantsBody {
				pm.Body = m.body(ctx, b, i, src)
			}
			b.msgs = append(b.msgs, pm)
		}
		return b.msgs, nil
	})
	if err == nil {
		return nil
	}
	if errors.Is(err, runtime.ErrClosed) && m.reg.ActiveManifest(m.expr.Name) == nil {
		return fmt.Errorf("filter plugin %q has no active version: %w", m.expr.Name, ErrNotActive)
	}
	// Only the fault that stopped the version reports it: two queues faulting at once, or
	// calls that were in flight when it stopped, are one stop.
	var fe *runtime.FaultError
	if m.opts.OnFault != nil && errors.As(err, &fe) && fe.Stopped {
		m.opts.OnFault(Fault{Name: m.expr.Name, Version: fe.Version, Err: err})
	}
	if errors.Is(err, runtime.ErrPolicyOpen) {
		return nil // MatchWith set every keep to true
	}
	return err
}

// body returns the message's body, decompressed when it is stored compressed. A body that
// does not decompress is passed empty (and logged): the consumer cannot read it either.
func (m *matcher) body(ctx context.Context, b *batch, i int, src *filter.Message) []byte {
	if !src.Compressed {
		return src.Body
	}
	for len(b.bodies) <= i {
		b.bodies = append(b.bodies, nil)
	}
	out, err := b.dec.Decompress(b.bodies[i][:0], src.Body, m.opts.MaxBodySize)
	if err != nil {
		m.opts.Logger.LogAttrs(ctx, slog.LevelWarn, "wasm filter: body does not decompress; the filter sees it empty",
			slog.String("plugin", m.expr.Name), slog.String("topic", src.Topic), slog.Int("queue", int(src.QueueID)),
			slog.Int64("offset", src.QueueOffset), slog.Any("err", err))
		return nil
	}
	b.bodies[i] = out
	return out
}
