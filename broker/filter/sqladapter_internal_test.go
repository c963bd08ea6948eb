package filter

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/internal/sql92"
)

// The SQL92 adapter reads properties straight from the stored bytes: evaluating a window of
// candidates allocates nothing per property read.
func TestSQLAdapterDoesNotCopyProperties(t *testing.T) {
	sel, err := sql92.Compile("region = 'eu' AND amount > 100")
	require.NoError(t, err)
	cands := make([]store.Candidate, 32)
	for i := range cands {
		cands[i] = storedCandidate(t, int64(i), "b", map[string]string{"region": "eu", "amount": "150"}, 0)
	}
	keep := make([]bool, len(cands))
	a := sqlAdapter{sel}
	allocs := testing.AllocsPerRun(100, func() {
		require.NoError(t, a.MatchBatch(context.Background(), cands, keep))
	})
	require.True(t, keep[0], "the message matches")
	require.LessOrEqual(t, allocs, 2.0, "allocations per window of 32: a fixed few, none per message or property")
}
