package allocate

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestByWeight(t *testing.T) {
	tests := []struct {
		name    string
		weights map[string]int
		nq      int
		members []string
		want    map[string][]int
	}{
		{
			name:    "exact proportions",
			weights: map[string]int{"a": 1, "b": 2, "c": 1},
			nq:      8,
			members: []string{"a", "b", "c"},
			want:    map[string][]int{"a": {0, 1}, "b": {2, 3, 4, 5}, "c": {6, 7}},
		},
		{
			// quotas 5.25 and 1.75: the leftover goes to the larger fraction, b.
			name:    "largest remainder",
			weights: map[string]int{"a": 3, "b": 1},
			nq:      7,
			members: []string{"a", "b"},
			want:    map[string][]int{"a": {0, 1, 2, 3, 4}, "b": {5, 6}},
		},
		{
			// quotas 2.5 and 2.5 tie: the earlier member gets the leftover.
			name:    "weight 0 drains a member, ties go to the earlier member",
			weights: map[string]int{"a": 0},
			nq:      5,
			members: []string{"a", "b", "c"},
			want:    map[string][]int{"a": {}, "b": {0, 1, 2}, "c": {3, 4}},
		},
		{
			name:    "unknown ids weigh 1",
			weights: map[string]int{"b": 3, "stranger": 100},
			nq:      10,
			members: []string{"a", "b", "c"},
			want:    map[string][]int{"a": {0, 1}, "b": {2, 3, 4, 5, 6, 7}, "c": {8, 9}},
		},
		{
			name:    "nil map is averagely",
			nq:      10,
			members: []string{"a", "b", "c", "d"},
			want:    map[string][]int{"a": {0, 1, 2}, "b": {3, 4, 5}, "c": {6, 7}, "d": {8, 9}},
		},
		{
			// quotas 0.6, 0.3, 0.1 for one queue.
			name:    "fewer queues than members",
			weights: map[string]int{"a": 6, "b": 3, "c": 1},
			nq:      1,
			members: []string{"a", "b", "c"},
			want:    map[string][]int{"a": {0}, "b": {}, "c": {}},
		},
		{
			// Products overflow 64 bits; 128-bit arithmetic keeps it exact: quotas ~1.5 each.
			name:    "huge weights",
			weights: map[string]int{"a": math.MaxInt64, "b": math.MaxInt64 - 1},
			nq:      3,
			members: []string{"a", "b"},
			want:    map[string][]int{"a": {0, 1}, "b": {2}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			all := allocateAll(t, ByWeight(tt.weights), Request{Group: "g", Queues: queueList(tt.nq), ClientIDs: tt.members})
			got := make(map[string][]int, len(all))
			for id, qs := range all {
				got[id] = queueIDs(qs)
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

// With equal weights, whatever the weight, ByWeight is Averagely.
func TestByWeightEqualIsAveragely(t *testing.T) {
	for _, w := range []int{1, 7} {
		for nq := 1; nq <= 25; nq++ {
			for nc := 1; nc <= 9; nc++ {
				req := Request{Group: "g", Queues: queueList(nq), ClientIDs: clientList(nc)}
				weights := make(map[string]int)
				for _, id := range req.ClientIDs {
					weights[id] = w
				}
				assert.Equal(t, allocateAll(t, Averagely(), req), allocateAll(t, ByWeight(weights), req), "w=%d nq=%d nc=%d", w, nq, nc)
			}
		}
	}
}

// Every count is the exact quota rounded down or up.
func TestByWeightCountsWithinOneOfQuota(t *testing.T) {
	weights := map[string]int{"c000": 5, "c001": 0, "c002": 1, "c003": 13, "c004": 2}
	for nq := 1; nq <= 60; nq++ {
		req := Request{Group: "g", Queues: queueList(nq), ClientIDs: clientList(5)}
		all := allocateAll(t, ByWeight(weights), req)
		for _, id := range req.ClientIDs {
			quota := float64(nq*weights[id]) / 21
			n := float64(len(all[id]))
			assert.True(t, n == math.Floor(quota) || n == math.Ceil(quota), "nq=%d %s: %v for quota %.2f", nq, id, n, quota)
		}
	}
}

func TestByWeightErrors(t *testing.T) {
	tests := []struct {
		name    string
		weights map[string]int
		errPart string
	}{
		{"negative", map[string]int{"b": -2}, `negative weight -2 for client "b"`},
		{"all zero", map[string]int{"a": 0, "b": 0, "c": 0}, "every member has weight 0"},
		{"sum overflows", map[string]int{"a": math.MaxInt, "b": math.MaxInt, "c": math.MaxInt}, "weights sum overflows"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ByWeight(tt.weights).Allocate(context.Background(),
				Request{Group: "g", ClientID: "a", Queues: queueList(4), ClientIDs: []string{"a", "b", "c"}})
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), tt.errPart)
			assert.Nil(t, got)
		})
	}
	// Weights of non-members do not matter.
	_, err := ByWeight(map[string]int{"zz": -1}).Allocate(context.Background(),
		Request{Group: "g", ClientID: "a", Queues: queueList(4), ClientIDs: []string{"a"}})
	assert.NoError(t, err)
}

// The weights map is copied.
func TestByWeightCopiesWeights(t *testing.T) {
	w := map[string]int{"a": 3}
	s := ByWeight(w)
	w["a"] = 0
	got, err := s.Allocate(context.Background(), Request{Group: "g", ClientID: "a", Queues: queueList(4), ClientIDs: []string{"a", "b"}})
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1, 2}, queueIDs(got))
}
