package allocate

import (
	"context"
	"fmt"
	"slices"

	"github.com/flowd-io/flowd/protocol"
)

// GroupStrategy is a [Strategy] that computes the whole group's assignment in one call. A
// consumer checks its assignment against the whole group's (is the lock table what the
// strategy makes of it?), so it needs every member's share: a strategy that computes them
// all at once anyway (a Wasm allocator does) saves one call per member by implementing it.
type GroupStrategy interface {
	Strategy
	// AllocateGroup returns every member's share, keyed by client id: every id of
	// req.ClientIDs has an entry (possibly empty). req.ClientID is ignored.
	AllocateGroup(ctx context.Context, req Request) (map[string][]protocol.MessageQueue, error)
}

// Identifier is implemented by strategies whose [Strategy.Name] does not tell two
// algorithms apart, e.g. two builds of a Wasm allocator published under one version.
type Identifier interface {
	// Identity names the algorithm exactly: members of a group whose identities differ
	// would not agree on an assignment.
	Identity() string
}

// Identity is what a consumer reports to its group as its allocator, so that members can
// check they all run the same one: s's Identity when it implements [Identifier], its Name
// otherwise.
func Identity(s Strategy) string {
	if id, ok := s.(Identifier); ok {
		return id.Identity()
	}
	return s.Name()
}

// WithIdentity returns s with identity as its [Identity], called each time it is needed (a
// Wasm allocator's active version can change while the consumer runs). For a Wasm allocator,
// identity would return its name, version and module SHA-256: the name alone does not cover
// a rebuilt module. The result implements [GroupStrategy] when s does.
func WithIdentity(s Strategy, identity func() string) Strategy {
	id := identified{Strategy: s, identity: identity}
	if g, ok := s.(GroupStrategy); ok {
		return identifiedGroup{identified: id, group: g}
	}
	return id
}

type identified struct {
	Strategy
	identity func() string
}

func (s identified) Identity() string { return s.identity() }

type identifiedGroup struct {
	identified
	group GroupStrategy
}

func (s identifiedGroup) AllocateGroup(ctx context.Context, req Request) (map[string][]protocol.MessageQueue, error) {
	return s.group.AllocateGroup(ctx, req)
}

// Group returns every member's share of req's queues, keyed by client id, each sorted
// without duplicates: one call of s when it is a [GroupStrategy], one per member otherwise.
// req.ClientID is ignored.
func Group(ctx context.Context, s Strategy, req Request) (map[string][]protocol.MessageQueue, error) {
	var shares map[string][]protocol.MessageQueue
	if g, ok := s.(GroupStrategy); ok {
		var err error
		if shares, err = g.AllocateGroup(ctx, req); err != nil {
			return nil, err
		}
	} else {
		shares = make(map[string][]protocol.MessageQueue, len(req.ClientIDs))
		for _, id := range req.ClientIDs {
			req.ClientID = id
			share, err := s.Allocate(ctx, req)
			if err != nil {
				return nil, err
			}
			shares[id] = share
		}
	}
	out := make(map[string][]protocol.MessageQueue, len(req.ClientIDs))
	for _, id := range req.ClientIDs {
		share, ok := shares[id]
		if !ok {
			return nil, fmt.Errorf("allocate group %q: strategy %s gave no share for member %q", req.Group, s.Name(), id)
		}
		share = slices.Clone(share)
		slices.SortFunc(share, compareQueues)
		out[id] = slices.Compact(share)
	}
	return out, nil
}
