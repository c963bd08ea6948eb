package store

import (
	"bytes"
	"log/slog"
	"sync"
	"testing"

	"github.com/flowd-io/flowd/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lockedBuffer is a log sink the store's goroutines may write to while a test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// batchOf is f's Match, nil for a nil f.
func batchOf(f *Filter) BatchFilter {
	if f == nil {
		return nil
	}
	return f.Match
}

// A consume-queue unit that does not match the commit log (damage no read repairs) is
// passed over with a warning naming it, by every read that reads the log; the messages on
// both sides of it are delivered in one batch.
func TestPullPassesOverADamagedUnit(t *testing.T) {
	filters := map[string]*Filter{
		"plain":        nil,
		"tags":         tagsOf("a"),
		"batch filter": {Match: &countingFilter{}},
	}
	for name, f := range filters {
		t.Run(name, func(t *testing.T) {
			var logs lockedBuffer
			o := testOptions()
			o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
			s := openT(t, t.TempDir(), o)
			defer s.Close()
			res := putN(t, s, "T", 0, 10, "a")
			waitDispatch(t, s)
			// Unit 4 points one byte into its message.
			r := res[4]
			require.NoError(t, s.writeUnits(s.queue("T", 0), 4, appendUnit(nil, r.CommitLogOffset+1, r.Size, protocol.TagsCode("a"))))

			g := get(t, s, "T", 0, 0, 32, 0, f)
			defer g.Release()
			assert.Equal(t, Found, g.Status)
			assert.Equal(t, append(bodyRange(0, 4), bodyRange(5, 10)...), bodies(t, g))
			assert.EqualValues(t, 10, g.NextBeginOffset)
			assert.Contains(t, logs.String(), "does not match the commit log")
			assert.Contains(t, logs.String(), "offset=4 ")
			if cf, ok := batchOf(f).(*countingFilter); ok {
				assert.EqualValues(t, 9, cf.seen.Load(), "the filter never saw the damaged unit")
			}
		})
	}
}
