package allocate

import (
	"cmp"
	"context"
	"slices"

	"github.com/flowd-io/flowd/protocol"
)

// Sticky returns "STICKY-"+inner.Name(): as balanced as [Averagely], but a member keeps the
// queues it held before wherever balance allows, so a membership change moves as few queues
// as possible. Every queue that stays put is one whose pull position, cache and order lock
// need not be handed over.
//
// Given req.Previous, the rule (deterministic, so every member computes the same thing):
//
//  1. Claims. Members in sorted order claim their previous queues that are still in
//     req.Queues; a queue already claimed by an earlier member is not claimed again.
//     Entries for clients that are no longer members are ignored.
//  2. Counts. Every member is due nq/nc queues; the nq%nc members with the most claims
//     (ties: earlier in sorted order) are due one more.
//  3. Keep. Each member keeps its claimed queues, lowest in queue order first, up to its
//     count. The rest are freed.
//  4. Fill. Freed and new queues, in queue order, go to members below their count, in sorted
//     member order.
//
// If no member has a claim (req.Previous is empty, or names nothing current), inner decides
// instead: inner shapes the first assignment, Sticky keeps it from being reshuffled. It panics
// if inner is nil.
//
// # Notes
//
//   - Step 2 is why the result moves the fewest queues: among assignments where every member
//     has nq/nc or nq/nc+1 queues, the number kept is Σ min(claims, count), and giving the
//     extra queue to the members with the most claims maximises it.
//   - Once there is history the counts are always [Averagely]'s and every queue is placed,
//     whatever inner is: an uneven inner (e.g. [ConsistentHash]) is evened out at the first
//     rebalance with history, and an inner that places only some queues or respects rooms
//     ([ByMachineRoom], [MachineRoomNearby]) stops doing so. For stickiness within rooms,
//     wrap the other way round: MachineRoomNearby(Sticky(Averagely()), resolver), whose
//     sub-requests Sticky handles room by room.
//   - Members must agree on Previous as on everything else. In flowd the group's last
//     assignment comes from one place, not from each member's memory.
//   - Cost: O(nq + nc·log nc) plus one lookup per previous queue, a single comparison when
//     a member's previous queues are adjacent in queue order, else a binary search.
func Sticky(inner Strategy) Strategy {
	if inner == nil {
		panic("allocate: Sticky with nil inner strategy")
	}
	return sticky{inner: inner}
}

type sticky struct{ inner Strategy }

func (s sticky) Name() string { return PrefixSticky + s.inner.Name() }

func (s sticky) Allocate(ctx context.Context, req Request) ([]protocol.MessageQueue, error) {
	index, err := begin(ctx, req)
	if err != nil {
		return nil, err
	}
	if index < 0 {
		return none(), nil
	}
	owner, ok := stickyAssign(req)
	if !ok {
		return s.inner.Allocate(ctx, req)
	}
	var out []protocol.MessageQueue
	for k, c := range owner {
		if int(c) == index {
			out = append(out, req.Queues[k])
		}
	}
	if out == nil {
		return none(), nil
	}
	return out, nil
}

// stickyAssign computes the whole group's sticky assignment: owner[k] is the index in
// req.ClientIDs of the member that gets req.Queues[k]. It reports false if no member has a
// claim. req must have passed Validate.
func stickyAssign(req Request) (owner []int32, ok bool) {
	nq, nc := len(req.Queues), len(req.ClientIDs)
	owner = make([]int32, nq)
	for k := range owner {
		owner[k] = -1
	}

	// 1. Claims.
	claims := make([]int, nc)
	total := 0
	if len(req.Previous) > 0 {
		for c, id := range req.ClientIDs {
			hint := 0
			for _, q := range req.Previous[id] {
				k, found := findQueue(req.Queues, q, hint)
				hint = k + 1
				if found && owner[k] < 0 {
					owner[k] = int32(c)
					claims[c]++
					total++
				}
			}
		}
	}
	if total == 0 {
		return nil, false
	}

	// 2. Counts.
	due := make([]int, nc)
	for c := range due {
		due[c] = nq / nc
	}
	if extra := nq % nc; extra > 0 {
		order := make([]int, nc)
		for c := range order {
			order[c] = c
		}
		slices.SortFunc(order, func(a, b int) int {
			if x := cmp.Compare(claims[b], claims[a]); x != 0 {
				return x
			}
			return cmp.Compare(a, b)
		})
		for _, c := range order[:extra] {
			due[c]++
		}
	}

	// 3. Keep; claims is reused as the running count of queues held.
	clear(claims)
	for k, c := range owner {
		if c < 0 {
			continue
		}
		if claims[c] < due[c] {
			claims[c]++
		} else {
			owner[k] = -1
		}
	}

	// 4. Fill. Σ due == nq, so a member below its count always remains.
	c := 0
	for k := range owner {
		if owner[k] >= 0 {
			continue
		}
		for claims[c] >= due[c] {
			c++
		}
		owner[k] = int32(c)
		claims[c]++
	}
	return owner, true
}

// findQueue is slices.BinarySearchFunc(qs, q, compareQueues), trying qs[hint] first: a
// member's previous queues are usually in queue order and often adjacent, so most lookups
// cost one comparison.
func findQueue(qs []protocol.MessageQueue, q protocol.MessageQueue, hint int) (int, bool) {
	if hint < len(qs) && qs[hint].QueueID == q.QueueID && qs[hint].BrokerName == q.BrokerName && qs[hint].Topic == q.Topic {
		return hint, true
	}
	return slices.BinarySearchFunc(qs, q, compareQueues)
}
