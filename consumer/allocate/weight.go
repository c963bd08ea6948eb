package allocate

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math/bits"
	"slices"

	"github.com/flowd-io/flowd/protocol"
)

// ByWeight returns "WEIGHT": queue counts proportional to member weights, for groups whose
// members differ in capacity. weights maps client id to weight; a member not in the map
// weighs 1. The map is copied.
//
// The rule, so that every member computes the same thing:
//
//  1. Member c's exact quota is nq·w(c)/W, W the sum of the members' weights. It first gets
//     the quota rounded down.
//  2. The queues left over (fewer than the number of members) go one each to the members
//     with the largest fractional part of their quota; ties go to the member earlier in
//     sorted order (largest-remainder, or Hamilton, apportionment).
//  3. Members take contiguous ranges of the sorted queues in sorted member order, each as
//     many as it was counted.
//
// So every count is its quota rounded down or up, and the counts sum to nq. With equal
// weights all fractional parts tie, the first nq%nc members get the extra queue, and the
// result is exactly [Averagely]'s.
//
// # Notes
//
//   - Weight 0 is allowed and drains a member: it stays in the group but gets no queues
//     (its fractional part is 0, so it never gets a leftover either).
//   - A negative weight, all members at weight 0, or weights whose sum overflows are errors
//     wrapping [ErrInvalidConfig], reported by Allocate.
//   - Arithmetic is exact (128-bit products), so no float rounding can make members
//     disagree.
func ByWeight(weights map[string]int) Strategy {
	return byWeight{weights: maps.Clone(weights)}
}

type byWeight struct{ weights map[string]int }

func (byWeight) Name() string { return NameByWeight }

func (s byWeight) Allocate(ctx context.Context, req Request) ([]protocol.MessageQueue, error) {
	index, err := begin(ctx, req)
	if err != nil {
		return nil, err
	}
	if index < 0 {
		return none(), nil
	}
	counts, err := s.counts(len(req.Queues), req.ClientIDs)
	if err != nil {
		return nil, err
	}
	start := 0
	for _, n := range counts[:index] {
		start += n
	}
	if counts[index] == 0 {
		return none(), nil
	}
	return slices.Clone(req.Queues[start : start+counts[index]]), nil
}

// counts applies the rule in ByWeight's comment.
func (s byWeight) counts(nq int, clients []string) ([]int, error) {
	w := make([]uint64, len(clients))
	var total uint64
	for c, id := range clients {
		wt, ok := s.weights[id]
		if !ok {
			wt = 1
		}
		if wt < 0 {
			return nil, fmt.Errorf("%w: %s: negative weight %d for client %q", ErrInvalidConfig, NameByWeight, wt, id)
		}
		var carry uint64
		total, carry = bits.Add64(total, uint64(wt), 0)
		if carry != 0 {
			return nil, fmt.Errorf("%w: %s: weights sum overflows", ErrInvalidConfig, NameByWeight)
		}
		w[c] = uint64(wt)
	}
	if total == 0 {
		return nil, fmt.Errorf("%w: %s: every member has weight 0", ErrInvalidConfig, NameByWeight)
	}

	counts := make([]int, len(clients))
	rems := make([]uint64, len(clients))
	left := nq
	for c := range clients {
		// nq·w < 2^64·total because w <= total, so the quotient fits and Div64 cannot panic.
		hi, lo := bits.Mul64(uint64(nq), w[c])
		q, r := bits.Div64(hi, lo, total)
		counts[c], rems[c] = int(q), r
		left -= int(q)
	}
	if left > 0 {
		order := make([]int, len(clients))
		for c := range order {
			order[c] = c
		}
		slices.SortFunc(order, func(a, b int) int {
			if c := cmp.Compare(rems[b], rems[a]); c != 0 {
				return c
			}
			return cmp.Compare(a, b)
		})
		for _, c := range order[:left] {
			counts[c]++
		}
	}
	return counts, nil
}
