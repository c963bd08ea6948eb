package filter

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/protocol"
)

func TestTagExpressions(t *testing.T) {
	r := NewRegistry(0)
	ctx := context.Background()
	for _, expr := range []string{"*", "", "  ", " || "} {
		f, err := r.Filter(ctx, Subscription{Group: "g", Topic: "T", Expression: expr})
		require.NoError(t, err)
		assert.Nil(t, f, "%q takes everything", expr)
	}
	f, err := r.Filter(ctx, Subscription{Group: "g", Topic: "T", ExpressionType: "tag", Expression: " a || b ||"})
	require.NoError(t, err)
	assert.Equal(t, []int64{protocol.TagsCode("a"), protocol.TagsCode("b")}, f.TagsCodes)
	assert.Nil(t, f.Match, "a tag filter needs no message bytes")
	assert.True(t, f.MatchTagsCode(protocol.TagsCode("b")))
	assert.False(t, f.MatchTagsCode(protocol.TagsCode("c")))
}

func TestUnknownAndUnavailableTypes(t *testing.T) {
	r := NewRegistry(0)
	ctx := context.Background()
	_, err := r.Filter(ctx, Subscription{ExpressionType: "SQL92", Expression: "a > 1"})
	require.ErrorIs(t, err, ErrUnavailable)
	assert.ErrorContains(t, err, "SQL92 filtering is not enabled")
	_, err = r.Filter(ctx, Subscription{ExpressionType: "wasm", Expression: "f@1"})
	require.ErrorIs(t, err, ErrUnavailable)
	assert.ErrorContains(t, err, "WASM")
	_, err = r.Filter(ctx, Subscription{ExpressionType: "XPATH", Expression: "x"})
	require.ErrorIs(t, err, ErrUnknownType)
	assert.ErrorContains(t, err, "XPATH")

	r.Register(TypeTag, nil)
	_, err = r.Filter(ctx, Subscription{Expression: "a"})
	assert.ErrorIs(t, err, ErrUnknownType, "a disabled type is unknown")
}

// countingCompiler counts compilations.
type countingCompiler struct{ n atomic.Int64 }

func (c *countingCompiler) Compile(_ context.Context, sub Subscription) (*store.Filter, error) {
	c.n.Add(1)
	if sub.Expression == "bad" {
		return nil, errors.New("syntax error")
	}
	return &store.Filter{TagsCodes: []int64{int64(len(sub.Expression))}}, nil
}

func TestCompiledOncePerSubscriptionVersion(t *testing.T) {
	r := NewRegistry(3)
	c := &countingCompiler{}
	r.Register("sql92", c)
	ctx := context.Background()
	sub := Subscription{Group: "g", Topic: "T", ExpressionType: "SQL92", Expression: "a = 1", Version: 1}
	f1, err := r.Filter(ctx, sub)
	require.NoError(t, err)
	f2, err := r.Filter(ctx, sub)
	require.NoError(t, err)
	assert.Same(t, f1, f2, "one compiled filter per subscription version")
	assert.Equal(t, int64(1), c.n.Load())

	sub.Version = 2
	_, err = r.Filter(ctx, sub)
	require.NoError(t, err)
	assert.Equal(t, int64(2), c.n.Load(), "a new version compiles again")

	sub.Expression = "bad"
	_, err = r.Filter(ctx, sub)
	require.ErrorContains(t, err, "syntax error")
	_, err = r.Filter(ctx, sub)
	require.Error(t, err)
	assert.Equal(t, int64(4), c.n.Load(), "errors are not cached")

	// Bounded: at most 3 entries, least recently used evicted.
	for i := range 5 {
		_, err := r.Filter(ctx, Subscription{Group: fmt.Sprint("g", i), Topic: "T", ExpressionType: "SQL92", Expression: "x"})
		require.NoError(t, err)
	}
	assert.Equal(t, 3, r.Len())
	n := c.n.Load()
	_, err = r.Filter(ctx, Subscription{Group: "g4", Topic: "T", ExpressionType: "SQL92", Expression: "x"})
	require.NoError(t, err)
	assert.Equal(t, n, c.n.Load(), "recent entry kept")
	_, err = r.Filter(ctx, Subscription{Group: "g0", Topic: "T", ExpressionType: "SQL92", Expression: "x"})
	require.NoError(t, err)
	assert.Equal(t, n+1, c.n.Load(), "oldest entry evicted")

	// Registering again drops the type's compiled filters.
	c2 := &countingCompiler{}
	r.Register(TypeSQL92, c2)
	assert.Equal(t, 0, r.Len())
	_, err = r.Filter(ctx, Subscription{Group: "g4", Topic: "T", ExpressionType: "SQL92", Expression: "x"})
	require.NoError(t, err)
	assert.Equal(t, int64(1), c2.n.Load())
}

func TestRegistryConcurrentUse(t *testing.T) {
	r := NewRegistry(8)
	r.Register(TypeSQL92, &countingCompiler{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				_, err := r.Filter(context.Background(), Subscription{Group: fmt.Sprint(g), Topic: "T", ExpressionType: "SQL92", Expression: fmt.Sprint(i % 12)})
				assert.NoError(t, err)
				if i%50 == 0 && g == 0 {
					r.Register(TypeSQL92, &countingCompiler{})
				}
			}
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, r.Len(), 8)
}

// storedCandidate encodes a stored message as the store hands it to a filter.
func storedCandidate(t *testing.T, qoff int64, body string, props map[string]string, sysFlag int32) store.Candidate {
	m := &protocol.MessageExt{QueueID: 3, QueueOffset: qoff, StoreTimestamp: 1700000000123 + qoff,
		BornHost: netip.MustParseAddrPort("10.0.0.1:1"), StoreHost: netip.MustParseAddrPort("[::1]:10911")}
	m.Topic, m.Body, m.Properties, m.SysFlag = "Orders", []byte(body), props, sysFlag
	b, err := protocol.AppendStored(nil, m)
	require.NoError(t, err)
	return store.Candidate{Topic: "Orders", QueueID: 3, QueueOffset: qoff, Stored: b}
}

// recordingMatcher keeps what it saw and matches bodies that contain "want".
type recordingMatcher struct {
	mu    sync.Mutex
	calls int
	seen  []Message
	err   error
}

func (m *recordingMatcher) Match(_ context.Context, msgs []Message, keep []bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	for i, msg := range msgs {
		msg.Body = append([]byte(nil), msg.Body...)
		msg.Properties = append([]byte(nil), msg.Properties...)
		m.seen = append(m.seen, msg)
		keep[i] = strings.Contains(string(msg.Body), "want")
	}
	return m.err
}

func TestBatchMatcherSeesDecodedMessages(t *testing.T) {
	rm := &recordingMatcher{}
	var resolved []Subscription
	r := NewRegistry(0)
	r.Register(TypeWasm, Batch(func(_ context.Context, sub Subscription) (BatchMatcher, error) {
		resolved = append(resolved, sub)
		return rm, nil
	}, store.FailOpen))
	sub := Subscription{Group: "g", Topic: "Orders", ExpressionType: "wasm", Expression: "even@1.2.0?min=3", Version: 7}
	f, err := r.Filter(context.Background(), sub)
	require.NoError(t, err)
	assert.Equal(t, store.FailOpen, f.OnError)
	sub.ExpressionType = TypeWasm
	assert.Equal(t, []Subscription{sub}, resolved)

	cands := []store.Candidate{
		storedCandidate(t, 10, "want this", map[string]string{protocol.PropertyTags: "TagA", protocol.PropertyKeys: "k1 k2", "region": "eu"}, protocol.MsgFlagStoreHostV6),
		storedCandidate(t, 11, "not this", nil, 0),
		storedCandidate(t, 12, "want", map[string]string{"x": "y"}, protocol.MsgFlagCompressed),
	}
	keep := make([]bool, len(cands))
	require.NoError(t, f.Match.MatchBatch(context.Background(), cands, keep))
	assert.Equal(t, []bool{true, false, true}, keep)
	require.Equal(t, 1, rm.calls, "one call for the batch")
	require.Len(t, rm.seen, 3)
	m := rm.seen[0]
	assert.Equal(t, "Orders", m.Topic)
	assert.Equal(t, int32(3), m.QueueID)
	assert.Equal(t, int64(10), m.QueueOffset)
	assert.Equal(t, int64(1700000000133), m.StoreTimestamp)
	assert.Equal(t, "TagA", m.Tags)
	assert.Equal(t, "k1 k2", m.Keys)
	props, err := protocol.DecodeProperties(m.Properties)
	require.NoError(t, err)
	assert.Equal(t, "eu", props["region"])
	assert.Equal(t, "want this", string(m.Body))
	assert.False(t, m.Compressed)
	assert.Empty(t, rm.seen[1].Tags)
	assert.Empty(t, rm.seen[1].Properties)
	assert.True(t, rm.seen[2].Compressed)

	rm.err = errors.New("module trapped")
	err = f.Match.MatchBatch(context.Background(), cands, make([]bool, 3))
	assert.ErrorContains(t, err, "module trapped")

	bad := cands[0]
	bad.Stored = bad.Stored[:60]
	err = f.Match.MatchBatch(context.Background(), []store.Candidate{bad}, make([]bool, 1))
	assert.ErrorIs(t, err, protocol.ErrMalformedMessage)

	r.Register(TypeWasm, Batch(func(context.Context, Subscription) (BatchMatcher, error) {
		return nil, fmt.Errorf("module even@9: %w", ErrUnavailable)
	}, store.FailClosed))
	_, err = r.Filter(context.Background(), Subscription{ExpressionType: TypeWasm, Expression: "even@9"})
	assert.ErrorIs(t, err, ErrUnavailable)
}

// propSelector matches messages whose property key equals value.
type propSelector struct{ key, value string }

func (s propSelector) Match(get func(string) (string, bool)) bool {
	v, ok := get(s.key)
	return ok && v == s.value
}

func TestSQL92Adapter(t *testing.T) {
	r := NewRegistry(0)
	r.Register(TypeSQL92, SQL92(func(expr string) (Selector, error) {
		k, v, ok := strings.Cut(expr, " = ")
		if !ok {
			return nil, fmt.Errorf("cannot parse %q", expr)
		}
		return propSelector{k, strings.Trim(v, "'")}, nil
	}))
	_, err := r.Filter(context.Background(), Subscription{ExpressionType: "SQL92", Expression: "a >"})
	assert.ErrorContains(t, err, "cannot parse")
	f, err := r.Filter(context.Background(), Subscription{ExpressionType: "SQL92", Expression: "region = 'eu'"})
	require.NoError(t, err)
	cands := []store.Candidate{
		storedCandidate(t, 0, "a", map[string]string{"region": "eu"}, 0),
		storedCandidate(t, 1, "b", map[string]string{"region": "us"}, 0),
		storedCandidate(t, 2, "c", nil, 0),
		storedCandidate(t, 3, "d", map[string]string{"regionx": "eu", "region": "eu", protocol.PropertyTags: "t"}, 0),
	}
	keep := make([]bool, len(cands))
	require.NoError(t, f.Match.MatchBatch(context.Background(), cands, keep))
	assert.Equal(t, []bool{true, false, false, true}, keep)
}
