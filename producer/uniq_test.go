package producer

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An id's time part is the milliseconds since the start of the current month, also when the
// cached month is not the current one (a month boundary passed since the last id).
func TestUniqGenMonth(t *testing.T) {
	g := newUniqGen("10.0.0.1")
	check := func() {
		t.Helper()
		before := time.Now()
		id := g.next()
		after := time.Now()
		require.Len(t, id, 32)
		ms, err := strconv.ParseUint(id[20:28], 16, 32)
		require.NoError(t, err)
		sinceMonth := func(at time.Time) uint64 {
			return uint64(at.Sub(time.Date(at.Year(), at.Month(), 1, 0, 0, 0, 0, at.Location())).Milliseconds())
		}
		assert.GreaterOrEqual(t, ms, sinceMonth(before))
		assert.LessOrEqual(t, ms, sinceMonth(after))
	}
	check()
	check() // from the cached month
	lastYear := time.Now().AddDate(-1, 0, 0)
	g.month.Store(&monthSpan{start: lastYear.UnixMilli(), end: lastYear.AddDate(0, 1, 0).UnixMilli()})
	check()
	g.month.Store(&monthSpan{start: time.Now().Add(time.Hour).UnixMilli(), end: time.Now().Add(2 * time.Hour).UnixMilli()})
	check()
}
