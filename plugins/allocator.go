package plugins

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/flowd-io/flowd/consumer/allocate"
	"github.com/flowd-io/flowd/protocol"
	"github.com/flowd-io/flowd/runtime"
)

// Member is one member of a consumer group as an allocator plugin sees it.
type Member struct {
	ID     string
	Weight uint32 // 1 when nothing else is known
	Room   string
	Labels []Label // sorted by key
}

// Label is a key and value attached to a member.
type Label struct{ Key, Value string }

// AllocInput is an allocator plugin's input: the whole group's view.
type AllocInput struct {
	Group string
	// Queues sorted by topic, broker and queue id, no duplicates.
	Queues []protocol.MessageQueue
	// Members sorted by id, no duplicates.
	Members []Member
	// Previous is the member index owning each queue in the previous assignment (-1: none),
	// len(Queues) long, or empty when there is no previous assignment.
	Previous []int32
}

// Allocator runs an allocator plugin: the active version of its slot assigns a topic's
// queues to a group's members. It is safe for concurrent use; each call borrows one
// instance.
type Allocator struct {
	src source
}

// NewAllocator returns an Allocator calling the active version of slot, which must hold
// allocator plugins loaded with [Manifest.Spec].
func NewAllocator(slot *runtime.Slot) *Allocator { return &Allocator{src: slot} }

// Version is the active version's "name@version", or "" when none is active: members of a
// group compare it to check they run the same allocator.
func (a *Allocator) Version() string {
	m := a.src.Active()
	if m == nil {
		return ""
	}
	return m.Name() + "@" + m.Version()
}

// SHA256 is the active module's sha256 ("" when none is active).
func (a *Allocator) SHA256() string {
	m := a.src.Active()
	if m == nil {
		return ""
	}
	return m.SHA256()
}

// Allocate computes the whole group's assignment: owners[k] is the index in in.Members of
// the member owning in.Queues[k]. The result is appended to owners[:0] (pass the previous
// result to reuse it). The guest's output is checked before it is returned: one owner per
// queue, each a valid member index, or the call fails with [ErrBadOutput] and the fault
// policy applies.
func (a *Allocator) Allocate(ctx context.Context, in *AllocInput, owners []int32) ([]int32, error) {
	if len(in.Previous) != 0 && len(in.Previous) != len(in.Queues) {
		return owners[:0], fmt.Errorf("allocate: %d previous owners for %d queues", len(in.Previous), len(in.Queues))
	}
	inst, err := a.src.Borrow(ctx)
	if err != nil {
		return owners[:0], fmt.Errorf("allocate: %w", err)
	}
	defer inst.Release()
	st, err := stateOf(inst, KindAllocator)
	if err != nil {
		return owners[:0], err
	}
	owners, err = st.allocate(ctx, in, owners)
	return owners, st.fail(ctx, ExportAllocate, err)
}

func allocSize(in *AllocInput) (int, error) {
	if len(in.Group) > maxU16 {
		return 0, fmt.Errorf("group name of %d bytes: %w", len(in.Group), ErrTooLarge)
	}
	if len(in.Queues) > math.MaxInt32 || len(in.Members) > math.MaxInt32 {
		return 0, fmt.Errorf("%d queues, %d members: %w", len(in.Queues), len(in.Members), ErrTooLarge)
	}
	n := 2 + len(in.Group) + 4 + 4 + 4 + 4*len(in.Previous)
	for i := range in.Queues {
		q := &in.Queues[i]
		if len(q.Topic) > maxU16 || len(q.BrokerName) > maxU16 {
			return 0, fmt.Errorf("queue %v: topic or broker name over %d bytes: %w", q, maxU16, ErrTooLarge)
		}
		n += 2 + len(q.Topic) + 2 + len(q.BrokerName) + 4
	}
	for i := range in.Members {
		m := &in.Members[i]
		if len(m.ID) > maxU16 || len(m.Room) > maxU16 {
			return 0, fmt.Errorf("member %.64q: id or room over %d bytes: %w", m.ID, maxU16, ErrTooLarge)
		}
		n += 2 + len(m.ID) + 4 + 2 + len(m.Room) + 4
		for _, l := range m.Labels {
			if len(l.Key) > maxU16 || len(l.Value) > maxU16 {
				return 0, fmt.Errorf("member %.64q: label %.64q over %d bytes: %w", m.ID, l.Key, maxU16, ErrTooLarge)
			}
			n += 4 + len(l.Key) + len(l.Value)
		}
	}
	return n, nil
}

func encodeAlloc(b []byte, in *AllocInput) {
	le := binary.LittleEndian
	off := putStr16(b, 0, in.Group)
	le.PutUint32(b[off:], uint32(len(in.Queues)))
	off += 4
	for i := range in.Queues {
		q := &in.Queues[i]
		off = putStr16(b, off, q.Topic)
		off = putStr16(b, off, q.BrokerName)
		le.PutUint32(b[off:], uint32(int32(q.QueueID)))
		off += 4
	}
	le.PutUint32(b[off:], uint32(len(in.Members)))
	off += 4
	for i := range in.Members {
		m := &in.Members[i]
		off = putStr16(b, off, m.ID)
		le.PutUint32(b[off:], m.Weight)
		off = putStr16(b, off+4, m.Room)
		le.PutUint32(b[off:], uint32(len(m.Labels)))
		off += 4
		for _, l := range m.Labels {
			off = putStr16(b, off, l.Key)
			off = putStr16(b, off, l.Value)
		}
	}
	le.PutUint32(b[off:], uint32(len(in.Previous)))
	off += 4
	for _, p := range in.Previous {
		le.PutUint32(b[off:], uint32(p))
		off += 4
	}
}

func (st *state) allocate(ctx context.Context, in *AllocInput, owners []int32) ([]int32, error) {
	owners = owners[:0]
	size, err := allocSize(in)
	if err != nil {
		return owners, fmt.Errorf("plugin %s: %w", st.v.name, err)
	}
	buf, err := st.input(ctx, size)
	if err != nil {
		return owners, err
	}
	encodeAlloc(buf, in)
	st.stack[0], st.stack[1] = uint64(st.buf), uint64(size)
	if err := st.inst.Call(ctx, st.call, st.stack[:]); err != nil {
		return owners, err
	}
	out, err := st.output(st.stack[0])
	if err != nil {
		return owners, err
	}
	nq, nm := len(in.Queues), len(in.Members)
	if len(out) != 4*nq {
		return owners, fmt.Errorf("%d bytes of owners for %d queues, want %d: %w", len(out), nq, 4*nq, ErrBadOutput)
	}
	owners = slices.Grow(owners, nq)
	for k := range nq {
		o := int32(binary.LittleEndian.Uint32(out[4*k:]))
		if o < 0 || int(o) >= nm {
			return owners[:0], fmt.Errorf("queue %d given to member %d of %d: %w", k, o, nm, ErrBadOutput)
		}
		owners = append(owners, o)
	}
	return owners, nil
}

// selfTestAllocator assigns one queue to one member, which must get it.
func selfTestAllocator(ctx context.Context, inst *runtime.Instance) error {
	st, err := stateOf(inst, KindAllocator)
	if err != nil {
		return err
	}
	in := &AllocInput{
		Group:   "flowd-self-test",
		Queues:  []protocol.MessageQueue{{Topic: "flowd-self-test", BrokerName: "broker-a", QueueID: 0}},
		Members: []Member{{ID: "member-0", Weight: 1}},
	}
	owners, err := st.allocate(ctx, in, nil)
	if err != nil {
		return err
	}
	if len(owners) != 1 || owners[0] != 0 {
		return fmt.Errorf("one queue, one member: got owners %v", owners)
	}
	return nil
}

// AllocatorStrategy adapts an [Allocator] to [allocate.Strategy], so a consumer uses a Wasm
// allocator like a built-in one. It is safe for concurrent use.
type AllocatorStrategy struct {
	// Allocator runs the plugin. Required.
	Allocator *Allocator
	// Member describes a member to the plugin (weight, room, labels); nil: weight 1, no
	// room, no labels. It must be deterministic: every member of the group calls it.
	Member func(id string) Member
	// Fallback allocates instead of the plugin once it failed open (the manifest's policy
	// is fail_open and a call faulted). Nil: the error is returned, and the consumer keeps
	// its current assignment.
	Fallback allocate.Strategy
}

// Name is "WASM-" followed by the active version's "name@version": members of a group
// compare strategy names, and two versions of one plugin are different algorithms.
func (s *AllocatorStrategy) Name() string { return "WASM-" + s.Allocator.Version() }

// Allocate runs the plugin on the whole group and returns req.ClientID's share, in queue
// order. req is validated as the built-in strategies do ([allocate.Validate]); req.Previous
// becomes the plugin's previous assignment (queues and clients no longer present are
// ignored; a queue listed under two clients goes to the first in id order).
func (s *AllocatorStrategy) Allocate(ctx context.Context, req allocate.Request) ([]protocol.MessageQueue, error) {
	index, err := allocate.Validate(req)
	if err != nil {
		return nil, err
	}
	if index < 0 {
		return []protocol.MessageQueue{}, nil
	}
	shares, err := s.AllocateGroup(ctx, req)
	if err != nil {
		return nil, err
	}
	return shares[req.ClientID], nil
}

// AllocateGroup runs the plugin once and returns every member's share
// ([allocate.GroupStrategy]): the plugin computes the whole group's assignment anyway.
func (s *AllocatorStrategy) AllocateGroup(ctx context.Context, req allocate.Request) (map[string][]protocol.MessageQueue, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	check := req // Validate checks one member's request; the group call has none
	if len(req.ClientIDs) > 0 {
		check.ClientID = req.ClientIDs[0]
	}
	if _, err := allocate.Validate(check); err != nil {
		return nil, err
	}
	in := AllocInput{Group: req.Group, Queues: req.Queues, Members: make([]Member, len(req.ClientIDs))}
	for i, id := range req.ClientIDs {
		if s.Member != nil {
			in.Members[i] = s.Member(id)
			in.Members[i].ID = id
		} else {
			in.Members[i] = Member{ID: id, Weight: 1}
		}
	}
	in.Previous = previousOwners(req)
	owners, err := s.Allocator.Allocate(ctx, &in, nil)
	if err != nil && s.Fallback != nil && errors.Is(err, runtime.ErrPolicyOpen) {
		return allocate.Group(ctx, s.Fallback, req)
	}
	if err != nil {
		return nil, fmt.Errorf("allocate group %q with plugin %s: %w", req.Group, s.Allocator.Version(), err)
	}
	shares := make(map[string][]protocol.MessageQueue, len(req.ClientIDs))
	for _, id := range req.ClientIDs {
		shares[id] = []protocol.MessageQueue{}
	}
	for k, o := range owners {
		id := req.ClientIDs[o]
		shares[id] = append(shares[id], req.Queues[k])
	}
	return shares, nil
}

// Identity is Name plus the active module's sha256: two builds published under one version
// are different algorithms, and members of a group must not mix them
// ([allocate.Identifier]).
func (s *AllocatorStrategy) Identity() string {
	return s.Name() + "#" + s.Allocator.SHA256()
}

// previousOwners maps req.Previous onto req's queues and members, or nil when it is empty.
func previousOwners(req allocate.Request) []int32 {
	if len(req.Previous) == 0 {
		return nil
	}
	prev := make([]int32, len(req.Queues))
	for k := range prev {
		prev[k] = -1
	}
	for i, id := range req.ClientIDs {
		for _, q := range req.Previous[id] {
			k, found := slices.BinarySearchFunc(req.Queues, q, compareQueue)
			if found && prev[k] < 0 {
				prev[k] = int32(i)
			}
		}
	}
	return prev
}

func compareQueue(a, b protocol.MessageQueue) int {
	if c := strings.Compare(a.Topic, b.Topic); c != 0 {
		return c
	}
	if c := strings.Compare(a.BrokerName, b.BrokerName); c != 0 {
		return c
	}
	return a.QueueID - b.QueueID
}

var (
	_ allocate.GroupStrategy = (*AllocatorStrategy)(nil)
	_ allocate.Identifier    = (*AllocatorStrategy)(nil)
)
