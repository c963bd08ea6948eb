package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/flowd-io/flowd/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// offsetsOf returns the queue offsets of a result's messages.
func offsetsOf(t testing.TB, g *GetResult) []int64 {
	t.Helper()
	var out []int64
	for _, m := range decodeAll(t, g) {
		out = append(out, m.QueueOffset)
	}
	return out
}

// matchOffsets matches the candidates at the given queue offsets.
func matchOffsets(offs ...int64) func(Candidate) bool {
	return func(c Candidate) bool { return slices.Contains(offs, c.QueueOffset) }
}

// openFilterStore stores 40 messages of 100-byte bodies in queue 0 of "F" (tag "t") and in
// queue 1 (tag "a" at even offsets, "b" at odd ones), and returns the stored size of one.
func openFilterStore(t testing.TB) (*Store, int) {
	s := openT(t, t.TempDir(), testOptions())
	t.Cleanup(func() { s.Close() })
	var size int
	for i := range 40 {
		body := fmt.Sprintf("%0100d", i)
		r, err := s.Put(context.Background(), newMsg("F", 0, body, "t"))
		require.NoError(t, err)
		size = int(r.Size)
		tag := "a"
		if i%2 == 1 {
			tag = "b"
		}
		_, err = s.Put(context.Background(), newMsg("F", 1, body, tag))
		require.NoError(t, err)
	}
	waitDispatch(t, s)
	return s, size
}

// TestGetMessageBatchFilter reads through a message filter: matches interleaved with
// non-matches at the edges of the windows, the count and byte caps, NextBeginOffset, the
// number of filter calls (one per window, never one per message), and both error policies.
func TestGetMessageBatchFilter(t *testing.T) {
	s, size := openFilterStore(t)
	cases := []struct {
		name     string
		queue    int32
		offset   int64
		maxMsgs  int
		maxBytes int // in messages: the byte cap is maxBytes*size (+ extra)
		extra    int
		tags     []string
		match    func(Candidate) bool // nil: all
		failOn   int64
		panics   bool
		policy   FilterErrorPolicy
		want     []int64
		status   GetStatus
		next     int64
		calls    int64
		seen     int64
		err      bool
	}{
		{name: "pass-through takes a whole batch in one call", maxMsgs: 32,
			want: seq(0, 32), status: Found, next: 32, calls: 1, seen: 32},
		{name: "match at the end of one window and the start of the next", maxMsgs: 2, match: matchOffsets(1, 2),
			want: []int64{1, 2}, status: Found, next: 4, calls: 2, seen: 4},
		{name: "a window past the room stops at the first match it cannot take", maxMsgs: 2, match: matchOffsets(0, 4, 5, 6),
			want: []int64{0, 4}, status: Found, next: 5, calls: 3, seen: 8},
		{name: "the next read starts at that match", offset: 5, maxMsgs: 2, match: matchOffsets(0, 4, 5, 6),
			want: []int64{5, 6}, status: Found, next: 7, calls: 1, seen: 2},
		{name: "nothing matches: windows grow to the end of the queue", maxMsgs: 4, match: matchOffsets(),
			status: NoMatchedMessage, next: 40, calls: 4, seen: 40},
		{name: "byte cap", maxMsgs: 32, maxBytes: 2, extra: 1,
			want: []int64{0, 1}, status: Found, next: 2, calls: 1, seen: 2},
		{name: "byte cap with non-matches", maxMsgs: 32, maxBytes: 2, match: func(c Candidate) bool { return c.QueueOffset%2 == 1 },
			want: []int64{1, 3}, status: Found, next: 4, calls: 2, seen: 4},
		{name: "last message of the queue", offset: 38, maxMsgs: 32, match: matchOffsets(39),
			want: []int64{39}, status: Found, next: 40, calls: 1, seen: 2},
		{name: "tag codes first: the filter never sees other tags", queue: 1, maxMsgs: 3, tags: []string{"a"},
			want: []int64{0, 2, 4}, status: Found, next: 6, calls: 1, seen: 3},
		{name: "tag codes and a message filter", queue: 1, maxMsgs: 2, tags: []string{"b"}, match: matchOffsets(7, 9, 11),
			want: []int64{7, 9}, status: Found, next: 11, calls: 2, seen: 6},
		{name: "fail open delivers the window", maxMsgs: 4, failOn: 1, policy: FailOpen,
			want: seq(0, 4), status: Found, next: 4, calls: 1, seen: 4},
		{name: "fail closed holds the queue", offset: 3, maxMsgs: 4, failOn: 1,
			next: 3, calls: 1, seen: 4, err: true},
		{name: "fail closed after a window was taken delivers that window", maxMsgs: 2, match: matchOffsets(0), failOn: 2,
			want: []int64{0}, status: Found, next: 2, calls: 2, seen: 4},
		{name: "a panicking filter fails closed", maxMsgs: 4, failOn: 1, panics: true,
			calls: 1, seen: 4, err: true},
		{name: "a panicking filter fails open", maxMsgs: 4, failOn: 1, panics: true, policy: FailOpen,
			want: seq(0, 4), status: Found, next: 4, calls: 1, seen: 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cf := &countingFilter{match: tc.match, failOn: tc.failOn, panics: tc.panics}
			f := &Filter{Match: cf, OnError: tc.policy}
			if tc.tags != nil {
				f.TagsCodes = tagsOf(tc.tags...).TagsCodes
			}
			maxBytes := 0
			if tc.maxBytes > 0 {
				maxBytes = tc.maxBytes*size + tc.extra
			}
			g, err := s.GetMessage(context.Background(), "F", tc.queue, tc.offset, tc.maxMsgs, maxBytes, f)
			assert.Equal(t, tc.calls, cf.calls.Load(), "filter calls")
			assert.Equal(t, tc.seen, cf.seen.Load(), "candidates evaluated")
			if tc.err {
				require.ErrorIs(t, err, ErrFilterFailed)
				assert.Nil(t, g)
				if !tc.panics {
					assert.ErrorIs(t, err, errFilterTest)
				}
				return
			}
			require.NoError(t, err)
			defer g.Release()
			assert.Equal(t, tc.status, g.Status)
			assert.Equal(t, tc.want, offsetsOf(t, g))
			assert.Equal(t, tc.next, g.NextBeginOffset)
		})
	}
}

func seq(from, to int64) []int64 {
	var out []int64
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// TestGetMessageBatchFilterExact reads whole queues through random filters, caps and tag
// codes, concurrently with one shared Filter per pattern, and checks that the messages of
// consecutive reads are exactly the matching messages, in order: nothing skipped that was
// not evaluated, nothing delivered twice.
func TestGetMessageBatchFilterExact(t *testing.T) {
	s, size := openFilterStore(t)
	rng := rand.New(rand.NewPCG(1, 2))
	var wg sync.WaitGroup
	for pattern := range 40 {
		density := rng.Float64()
		matches := map[int64]bool{}
		for i := range int64(40) {
			matches[i] = rng.Float64() < density
		}
		queue := int32(pattern % 2)
		var tags []string
		if queue == 1 && pattern%4 == 1 {
			tags = []string{"b"}
		}
		want := []int64{}
		for i := range int64(40) {
			if matches[i] && (tags == nil || i%2 == 1) {
				want = append(want, i)
			}
		}
		cf := &countingFilter{match: func(c Candidate) bool { return matches[c.QueueOffset] }}
		f := &Filter{Match: cf}
		if tags != nil {
			f.TagsCodes = []int64{protocol.TagsCode(tags[0])}
		}
		for reader := range 3 {
			maxMsgs := 1 + rng.IntN(8)
			maxBytes := 0
			if reader == 1 {
				maxBytes = size * (1 + rng.IntN(3))
			}
			wg.Go(func() {
				got := []int64{}
				off := int64(0)
				for off < 40 {
					g, err := s.GetMessage(context.Background(), "F", queue, off, maxMsgs, maxBytes, f)
					if !assert.NoError(t, err) {
						return
					}
					if !assert.Greater(t, g.NextBeginOffset, off, "pattern %d maxMsgs %d maxBytes %d", pattern, maxMsgs, maxBytes) {
						return
					}
					for _, b := range g.Messages {
						m, _, err := protocol.DecodeStored(b)
						if !assert.NoError(t, err) {
							return
						}
						got = append(got, m.QueueOffset)
					}
					off = g.NextBeginOffset
					g.Release()
				}
				assert.Equal(t, want, got, "pattern %d maxMsgs %d maxBytes %d", pattern, maxMsgs, maxBytes)
			})
		}
	}
	wg.Wait()
}
