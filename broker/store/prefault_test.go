package store

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPrefaultRange: every range the prefaulter populates is aligned (madvise rejects an
// unaligned start, and the loop once went unaligned after its first step when the write
// position was not a multiple of the page size), ranges are contiguous, and repeating them
// covers the segment from the write position's page to prefaultAhead past it.
func TestPrefaultRange(t *testing.T) {
	const seg = 32 << 20
	for _, w := range []int64{0, 1, 1024, 4095, 4096, 1<<20 + 1024, 5<<20 + 777, seg - 3<<20 - 5, seg - 100, seg} {
		t.Run(fmt.Sprint(w), func(t *testing.T) {
			// done as the loop leaves it after populating for an earlier write position.
			for _, done0 := range []int64{0, prefaultAlign, 3 << 20, 6 << 20} {
				done := done0
				covered := max(done, w-w%prefaultAlign)
				for i := 0; ; i++ {
					require.Less(t, i, 100, "the loop must end")
					from, to := prefaultRange(w, done, seg)
					if from >= to {
						break
					}
					assert.Zero(t, from%prefaultAlign, "start %d unaligned", from)
					assert.Zero(t, to%prefaultAlign, "end %d unaligned", to)
					assert.Equal(t, covered, from, "ranges are contiguous")
					assert.LessOrEqual(t, to-from, int64(prefaultStep))
					assert.LessOrEqual(t, to, int64(seg))
					covered, done = to, to
				}
				want := min(w+prefaultAhead, seg)
				want -= want % prefaultAlign
				assert.Equal(t, max(want, done0, w-w%prefaultAlign), covered, "populated up to prefaultAhead past w")
			}
		})
	}
}
