package allocate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/flowd-io/flowd/protocol"
)

// Strategy names, as the Java client spells them where it has the strategy. Config files and
// the group-wide "same allocator" check compare these.
const (
	NameAveragely      = "AVG"
	NameByCircle       = "AVG_BY_CIRCLE"
	NameByConfig       = "CONFIG"
	NameByMachineRoom  = "MACHINE_ROOM"
	NameConsistentHash = "CONSISTENT_HASH"
	NameByWeight       = "WEIGHT"

	// PrefixMachineRoomNearby and PrefixSticky are followed by the inner strategy's name.
	PrefixMachineRoomNearby = "MACHINE_ROOM_NEARBY-"
	PrefixSticky            = "STICKY-"
)

var (
	// ErrInvalidRequest is wrapped by every error about a malformed [Request]. The message
	// names what was wrong.
	ErrInvalidRequest = errors.New("allocate: invalid request")

	// ErrInvalidConfig is wrapped by errors about a strategy's own configuration, found when
	// it is applied: a negative weight, weights all 0, a room resolver that returns no room.
	ErrInvalidConfig = errors.New("allocate: invalid strategy configuration")

	// ErrUnknownStrategy is returned by [ByName] for a name it cannot build.
	ErrUnknownStrategy = errors.New("allocate: unknown strategy")
)

// Request is everything a strategy is given. All members of a group must see the same inputs:
// only ClientID differs from one member to the next.
type Request struct {
	// Group is the consumer group. Built-in strategies use it only in error messages.
	Group string

	// ClientID is the member asking for its share.
	ClientID string

	// Queues are the topic's queues, sorted by [protocol.MessageQueue.Compare], no duplicates.
	Queues []protocol.MessageQueue

	// ClientIDs are the group's members, sorted, no duplicates.
	ClientIDs []string

	// Previous is the assignment after the last rebalance, keyed by client id; it may be nil.
	// Entries for clients no longer in ClientIDs, and queues no longer in Queues, are
	// ignored. Only sticky strategies read it: RocketMQ's allocators are stateless, flowd's
	// allocator ABI passes history so that a rebalance need not reshuffle everything.
	Previous map[string][]protocol.MessageQueue
}

// Strategy computes one member's share of a topic's queues.
//
// Implementations must be deterministic (every member of the group runs the same strategy on
// the same inputs and must agree), must not modify req, must return a fresh slice, and must be
// safe for concurrent use.
//
// # Notes
//
//   - Allocate takes a context because not every strategy is a few lines of Go: a Wasm
//     allocator implements this same interface, and its calls can block or time out.
type Strategy interface {
	// Name identifies the algorithm, e.g. "AVG" or "STICKY-AVG", as the Java client names
	// it where it has it. It does not cover configuration (weights, rooms, virtual nodes).
	Name() string

	// Allocate returns the queues req.ClientID should consume. A client id that is not in
	// req.ClientIDs gets an empty result and no error.
	Allocate(ctx context.Context, req Request) ([]protocol.MessageQueue, error)
}

// Validate checks the parts of req every strategy relies on and returns the position of
// req.ClientID in req.ClientIDs, or -1 (and no error) when it is not a member.
//
// Errors wrap [ErrInvalidRequest]: an empty ClientID, no Queues, no ClientIDs, an empty id
// in ClientIDs, or either list out of order or holding duplicates.
//
// # Notes
//
//   - RocketMQ checks only emptiness. Order is checked too because allocation is only as
//     consistent as its inputs: one member with an unsorted view breaks the "every queue
//     exactly once" promise for the whole group, silently. The check is O(n), the same order
//     as allocating.
func Validate(req Request) (index int, err error) {
	switch {
	case req.ClientID == "":
		return -1, fmt.Errorf("%w: group %q: empty ClientID", ErrInvalidRequest, req.Group)
	case len(req.Queues) == 0:
		return -1, fmt.Errorf("%w: group %q: no queues", ErrInvalidRequest, req.Group)
	case len(req.ClientIDs) == 0:
		return -1, fmt.Errorf("%w: group %q: no client ids", ErrInvalidRequest, req.Group)
	case req.ClientIDs[0] == "":
		return -1, fmt.Errorf("%w: group %q: empty id in ClientIDs", ErrInvalidRequest, req.Group)
	}
	for i := 1; i < len(req.Queues); i++ {
		if !queueBefore(&req.Queues[i-1], &req.Queues[i]) {
			return -1, fmt.Errorf("%w: group %q: Queues not sorted or duplicated at %d: %v then %v",
				ErrInvalidRequest, req.Group, i, req.Queues[i-1], req.Queues[i])
		}
	}
	for i := 1; i < len(req.ClientIDs); i++ {
		if req.ClientIDs[i-1] >= req.ClientIDs[i] {
			return -1, fmt.Errorf("%w: group %q: ClientIDs not sorted or duplicated at %d: %q then %q",
				ErrInvalidRequest, req.Group, i, req.ClientIDs[i-1], req.ClientIDs[i])
		}
	}
	index, found := slices.BinarySearch(req.ClientIDs, req.ClientID)
	if !found {
		return -1, nil
	}
	return index, nil
}

// ByName returns the strategy called name among those that need no configuration: "AVG",
// "AVG_BY_CIRCLE", "CONSISTENT_HASH" (with the default number of virtual nodes), and any of
// these behind "STICKY-" (e.g. "STICKY-AVG"). Names are case-sensitive, as in the Java client.
// Other names give an error wrapping [ErrUnknownStrategy].
func ByName(name string) (Strategy, error) {
	switch name {
	case NameAveragely:
		return Averagely(), nil
	case NameByCircle:
		return ByCircle(), nil
	case NameConsistentHash:
		return ConsistentHash(0), nil
	}
	if inner, ok := strings.CutPrefix(name, PrefixSticky); ok {
		s, err := ByName(inner)
		if err != nil {
			return nil, fmt.Errorf("%w: %q", ErrUnknownStrategy, name)
		}
		return Sticky(s), nil
	}
	return nil, fmt.Errorf("%w: %q (strategies needing configuration have constructors)", ErrUnknownStrategy, name)
}

// begin is the preamble of every built-in strategy: honour a context that is already done,
// then validate.
func begin(ctx context.Context, req Request) (int, error) {
	if err := ctx.Err(); err != nil {
		return -1, err
	}
	return Validate(req)
}

// none is the empty, non-nil result. A zero-capacity slice does not allocate.
func none() []protocol.MessageQueue { return []protocol.MessageQueue{} }

// averageShare returns the contiguous range [start, start+count) that member index of nc gets
// when nq queues are shared averagely: the first nq%nc members take nq/nc+1, the others
// nq/nc. It is RocketMQ's AllocateMessageQueueAveragely arithmetic, restated.
func averageShare(nq, nc, index int) (start, count int) {
	mod := nq % nc
	size := nq / nc
	if nq <= nc {
		size = 1
	} else if mod > 0 && index < mod {
		size++
	}
	if mod > 0 && index < mod {
		start = index * size
	} else {
		start = index*size + mod
	}
	return start, max(0, min(size, nq-start))
}

// compareQueues is [protocol.MessageQueue.Compare], faster where it matters: neighbouring
// queues nearly always share topic and broker, and an equality test settles that in one
// pass (often by pointer) where cmp.Compare on strings makes two ordered comparisons.
func compareQueues(a, b protocol.MessageQueue) int {
	if a.Topic != b.Topic {
		return strings.Compare(a.Topic, b.Topic)
	}
	if a.BrokerName != b.BrokerName {
		return strings.Compare(a.BrokerName, b.BrokerName)
	}
	return cmp.Compare(a.QueueID, b.QueueID)
}

// queueBefore reports compareQueues(*a, *b) < 0, with a fast path for the common case of
// neighbours on the same broker. Pointers, because copying two 40-byte structs per step
// costs as much as the comparison.
func queueBefore(a, b *protocol.MessageQueue) bool {
	if a.Topic == b.Topic && a.BrokerName == b.BrokerName {
		return a.QueueID < b.QueueID
	}
	return compareQueues(*a, *b) < 0
}
