package filter

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/protocol"
)

// Message is a candidate message as a BatchMatcher sees it. Its byte slices alias the
// store's read buffer: they are valid only during the Match call and must not be changed.
type Message struct {
	Topic          string
	QueueID        int32
	QueueOffset    int64
	StoreTimestamp int64 // Unix milliseconds
	Tags           string
	Keys           string
	// Properties is the raw property block, RocketMQ-encoded: key\x01value\x02 repeated.
	Properties []byte
	// Body is the body as stored: zlib-compressed when Compressed.
	Body       []byte
	Compressed bool
}

// BatchMatcher decides on a batch of messages at once (a Wasm filter module does one call
// per batch). It must be safe for concurrent use: one matcher serves every pull of its
// subscription.
type BatchMatcher interface {
	// Match sets keep[i] for each msgs[i] that matches; keep has len(msgs) elements, all
	// false on entry. It must give up when ctx is done. An error applies the policy the
	// matcher was registered with (see Batch) to the whole batch.
	Match(ctx context.Context, msgs []Message, keep []bool) error
}

// MatcherFunc resolves a subscription to its matcher: for WASM, the daemon parses the
// expression (a plugin's name, or name@version) and returns a matcher over that deployed
// filter plugin. An error is answered to the pull as SUBSCRIPTION_PARSE_FAILED; wrap
// ErrUnavailable when the module is not deployed.
type MatcherFunc func(ctx context.Context, sub Subscription) (BatchMatcher, error)

// Batch is the compiler of an expression type whose messages are decided by BatchMatchers
// (WASM). onError is what a read does when a matcher fails: store.FailClosed holds the
// queue until it works again, store.FailOpen delivers the batch.
func Batch(resolve MatcherFunc, onError store.FilterErrorPolicy) Compiler {
	return CompilerFunc(func(ctx context.Context, sub Subscription) (*store.Filter, error) {
		m, err := resolve(ctx, sub)
		if err != nil {
			return nil, err
		}
		if m == nil {
			return nil, fmt.Errorf("no matcher for expression %q", sub.Expression)
		}
		return &store.Filter{Match: &batchAdapter{m: m}, OnError: onError}, nil
	})
}

// batchAdapter decodes the store's candidates into Messages for a BatchMatcher. Pulls of one
// subscription share it and run at once, so the Message slices are pooled, not kept in it.
type batchAdapter struct {
	m    BatchMatcher
	msgs sync.Pool // of *[]Message
}

func (a *batchAdapter) MatchBatch(ctx context.Context, cands []store.Candidate, keep []bool) error {
	p, _ := a.msgs.Get().(*[]Message)
	if p == nil {
		p = new([]Message)
	}
	defer func() {
		clear(*p) // drop references into the store's read buffers
		a.msgs.Put(p)
	}()
	msgs := slices.Grow((*p)[:0], len(cands))[:len(cands)]
	*p = msgs
	for i, c := range cands {
		if err := decodeCandidate(c, &msgs[i]); err != nil {
			return err
		}
	}
	return a.m.Match(ctx, msgs, keep)
}

// decodeCandidate fills m from a stored message without copying its bytes (only Tags and
// Keys become strings).
func decodeCandidate(c store.Candidate, m *Message) error {
	b := c.Stored
	bad := func(what string) error {
		return fmt.Errorf("decode %s/%d at %d for filtering: %s: %w", c.Topic, c.QueueID, c.QueueOffset, what, protocol.ErrMalformedMessage)
	}
	if len(b) < protocol.StoredBornHostAt {
		return bad("too short")
	}
	sysFlag := int32(binary.BigEndian.Uint32(b[protocol.StoredSysFlagAt:]))
	p := protocol.StoreTimestampAt(sysFlag)
	storeHost := 8
	if sysFlag&protocol.MsgFlagStoreHostV6 != 0 {
		storeHost = 20
	}
	if p+8+storeHost+4+8+4 > len(b) {
		return bad("truncated header")
	}
	m.StoreTimestamp = int64(binary.BigEndian.Uint64(b[p:]))
	p += 8 + storeHost + 4 + 8 // STOREHOST, RECONSUMETIMES, PREPARED_TX_OFFSET
	bodyLen := int(int32(binary.BigEndian.Uint32(b[p:])))
	p += 4
	if bodyLen < 0 || p+bodyLen+1 > len(b) {
		return bad("BODYLEN overruns the message")
	}
	m.Body = b[p : p+bodyLen : p+bodyLen]
	p += bodyLen
	p += 1 + int(b[p]) // TOPICLEN, TOPIC
	if p+2 > len(b) {
		return bad("TOPICLEN overruns the message")
	}
	propLen := int(binary.BigEndian.Uint16(b[p:]))
	p += 2
	if p+propLen > len(b) {
		return bad("PROPLEN overruns the message")
	}
	m.Properties = b[p : p+propLen : p+propLen]
	m.Topic, m.QueueID, m.QueueOffset = c.Topic, c.QueueID, c.QueueOffset
	m.Compressed = sysFlag&protocol.MsgFlagCompressed != 0
	if v, ok := protocol.FindProperty(m.Properties, protocol.PropertyTags); ok {
		m.Tags = string(v)
	}
	if v, ok := protocol.FindProperty(m.Properties, protocol.PropertyKeys); ok {
		m.Keys = string(v)
	}
	return nil
}

// Selector is a compiled SQL92 expression over message properties; ParseSQL92 returns one.
type Selector interface {
	// Match evaluates the expression; get returns a property's value and whether the
	// message has it. The value is valid only until Match returns (it points into the
	// stored message): a selector must not keep it. Match must be safe for concurrent use.
	Match(get func(key string) (string, bool)) bool
}

// SQL92 is the compiler of SQL92 expressions (RocketMQ's MessageSelector.bySql) from a
// parser, e.g. flowd's own:
//
//	reg.Register(filter.TypeSQL92, filter.SQL92(filter.ParseSQL92))
//
// A message matches when the selector accepts its properties (TAGS and KEYS included).
// Evaluation cannot fail, so no error policy applies.
func SQL92(compile func(expr string) (Selector, error)) Compiler {
	return CompilerFunc(func(_ context.Context, sub Subscription) (*store.Filter, error) {
		sel, err := compile(sub.Expression)
		if err != nil {
			return nil, err
		}
		if sel == nil {
			return nil, fmt.Errorf("SQL92 expression %q compiled to nothing", sub.Expression)
		}
		return &store.Filter{Match: sqlAdapter{sel}}, nil
	})
}

type sqlAdapter struct{ sel Selector }

func (a sqlAdapter) MatchBatch(_ context.Context, cands []store.Candidate, keep []bool) error {
	// One lookup function for the window (a closure per candidate would be an allocation
	// each), reading the current candidate's properties without copying them: this runs for
	// every property a selector reads of every candidate on the pull path, and Match does
	// not keep values (see Selector).
	var props []byte
	get := func(key string) (string, bool) {
		v, ok := protocol.FindProperty(props, key)
		return unsafe.String(unsafe.SliceData(v), len(v)), ok
	}
	for i, c := range cands {
		var err error
		if props, err = store.StoredProperties(c.Stored); err != nil {
			return fmt.Errorf("properties of %s/%d at %d: %w", c.Topic, c.QueueID, c.QueueOffset, err)
		}
		keep[i] = a.sel.Match(get)
	}
	return nil
}
