package store

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func onlyConsumeQueues(name string) bool { return strings.Contains(name, "/consumequeue/") }

// readFaults are the two ways a read fails: an I/O error, and a read that comes back short.
var readFaults = []struct {
	name  string
	short bool
	cause error
}{
	{"EIO", false, syscall.EIO},
	{"short", true, io.EOF},
}

// faultAt fails the reads of the commit log that reach into the message r (in a store
// with testOptions' SegmentSize).
func faultAt(ffs *vfs.FaultFS, r PutResult, short bool) {
	ffs.FailReads(&vfs.ReadFault{Match: onlyCommitLog, Off: r.CommitLogOffset % testOptions().SegmentSize, Len: int64(r.Size), Short: short})
}

func openFaulty(t *testing.T, o Options) (*Store, *vfs.FaultFS) {
	t.Helper()
	ffs := vfs.NewFaultFS(nil)
	o.FS = ffs
	s := openT(t, t.TempDir(), o)
	t.Cleanup(func() { s.Close() })
	return s, ffs
}

func bodies(t *testing.T, r *GetResult) []string {
	t.Helper()
	var out []string
	for _, m := range decodeAll(t, r) {
		out = append(out, string(m.Body))
	}
	return out
}

func bodyRange(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("T-0-body-%d", i))
	}
	return out
}

// A pull whose batch reaches a message the commit log cannot give back stops there: it
// returns the messages before it with NextBeginOffset at it, and a pull from it fails
// (ErrReadFailed) until the disk reads again; then it gets the message. The failures are
// counted. Before, the read logged and went on: 10 stored, the others returned, and
// NextBeginOffset 10, past a message no consumer would ever see.
func TestPullStopsAtAnUnreadableMessage(t *testing.T) {
	filters := map[string]*Filter{
		"plain":        nil,
		"tags":         tagsOf("a"),
		"batch filter": {Match: &countingFilter{}},
	}
	for _, rf := range readFaults {
		for name, f := range filters {
			t.Run(rf.name+"/"+name, func(t *testing.T) {
				s, ffs := openFaulty(t, testOptions())
				res := putN(t, s, "T", 0, 10, "a")
				waitDispatch(t, s)
				faultAt(ffs, res[4], rf.short)

				g, err := s.GetMessage(context.Background(), "T", 0, 0, 32, 0, f)
				require.NoError(t, err)
				assert.Equal(t, Found, g.Status)
				assert.Equal(t, bodyRange(0, 4), bodies(t, g))
				assert.EqualValues(t, 4, g.NextBeginOffset, "the batch stops at the unreadable message")
				g.Release()

				_, err = s.GetMessage(context.Background(), "T", 0, 4, 32, 0, f)
				require.Error(t, err)
				assert.ErrorIs(t, err, ErrReadFailed)
				assert.ErrorIs(t, err, rf.cause)
				assert.ErrorIs(t, err, vfs.ErrInjected)
				assert.Contains(t, err.Error(), "T/0")
				assert.Positive(t, ffs.ReadFaults())
				assert.Positive(t, s.Stats().ReadErrors)

				ffs.FailReads(nil)
				g = get(t, s, "T", 0, 4, 32, 0, f)
				assert.Equal(t, bodyRange(4, 10), bodies(t, g))
				assert.EqualValues(t, 10, g.NextBeginOffset)
				g.Release()
			})
		}
	}
}

// A batch filter never sees a message the read could not give back, nor any after it; the
// window read before it is decided and delivered.
func TestFilterWindowStopsAtAnUnreadableMessage(t *testing.T) {
	s, ffs := openFaulty(t, testOptions())
	res := putN(t, s, "T", 0, 20, "")
	waitDispatch(t, s)
	faultAt(ffs, res[7], false)
	cf := &countingFilter{match: func(c Candidate) bool { return c.QueueOffset%2 == 0 }}
	g := get(t, s, "T", 0, 0, 32, 0, &Filter{Match: cf})
	defer g.Release()
	assert.Equal(t, []string{"T-0-body-0", "T-0-body-2", "T-0-body-4", "T-0-body-6"}, bodies(t, g))
	assert.EqualValues(t, 7, g.NextBeginOffset)
	assert.EqualValues(t, 7, cf.seen.Load(), "the filter saw the messages before the unreadable one only")
}

// GetRegions reads nothing, so a fault cannot make it skip: the regions cover every unit,
// and reading them (what the transport does when it cannot sendfile) fails with the fault,
// counted like any failed read of the store.
func TestRegionsOfAnUnreadableMessage(t *testing.T) {
	s, ffs := openFaulty(t, testOptions())
	res := putN(t, s, "T", 0, 10, "")
	waitDispatch(t, s)
	faultAt(ffs, res[4], false)
	g, err := s.GetRegions(context.Background(), "T", 0, 0, 32, 0, nil)
	require.NoError(t, err)
	defer g.Release()
	assert.Equal(t, 10, g.Count)
	assert.EqualValues(t, 10, g.NextBeginOffset)
	require.Len(t, g.Regions, 1, "adjacent messages are one region")
	r := g.Regions[0]
	_, err = r.File.ReadAt(make([]byte, r.Length), r.Offset)
	assert.ErrorIs(t, err, syscall.EIO)
	assert.ErrorIs(t, err, ErrReadFailed)
	assert.EqualValues(t, 1, s.Stats().ReadErrors)
}

// A consume queue that cannot be read fails the pull; before, the read took the failure
// for a removed file and answered OFFSET_FOUND_NULL with NextBeginOffset at the next file,
// skipping every message of this one.
func TestPullOfAnUnreadableConsumeQueue(t *testing.T) {
	for _, rf := range readFaults {
		t.Run(rf.name, func(t *testing.T) {
			o := testOptions()
			o.ConsumeQueueUnits = 10
			s, ffs := openFaulty(t, o)
			putN(t, s, "T", 0, 25, "")
			waitDispatch(t, s)
			ffs.FailReads(&vfs.ReadFault{Match: onlyConsumeQueues, Off: 3 * cqUnitSize, Len: cqUnitSize, Short: rf.short})

			_, err := s.GetMessage(context.Background(), "T", 0, 2, 32, 0, nil)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrReadFailed)
			assert.ErrorIs(t, err, rf.cause)
			_, err = s.GetRegions(context.Background(), "T", 0, 2, 32, 0, nil)
			assert.ErrorIs(t, err, ErrReadFailed)
			_, err = s.StoreTimeAt("T", 0, 3)
			assert.ErrorIs(t, err, ErrReadFailed)
			assert.NotErrorIs(t, err, ErrNotFound, "the unit is there; it could not be read")
			assert.Positive(t, s.Stats().ReadErrors)

			ffs.FailReads(nil)
			g := get(t, s, "T", 0, 2, 32, 0, nil)
			assert.Equal(t, bodyRange(2, 10), bodies(t, g))
			g.Release()
		})
	}
}

// A seek by time that cannot read a message's store time never lands past it: the
// message counts as new enough, so the seek re-delivers rather than skips.
func TestOffsetByTimestampNeverSkipsAnUnreadableMessage(t *testing.T) {
	o := testOptions()
	var now atomic.Int64
	o.Now = func() time.Time { return time.UnixMilli(now.Load()) }
	s, ffs := openFaulty(t, o)
	var res []PutResult
	for i := range 20 {
		now.Store(1_000_000 + int64(i)*1000)
		res = append(res, putN(t, s, "T", 0, 1, "")...)
	}
	waitDispatch(t, s)
	require.EqualValues(t, 15, s.OffsetByTimestamp("T", 0, 1_015_000))
	faultAt(ffs, res[15], false)
	got := s.OffsetByTimestamp("T", 0, 1_015_000)
	assert.Positive(t, ffs.ReadFaults(), "the bisection read the message")
	assert.LessOrEqual(t, got, int64(15))
}

// Looking a message up by its commit-log offset (an offsetMsgId) or by key fails with the
// read error, never "not found" or an empty result, whether the commit log or the key
// index cannot be read.
func TestLookupsUnderReadFaults(t *testing.T) {
	for _, rf := range readFaults {
		t.Run(rf.name, func(t *testing.T) {
			o := indexOptions()
			o.IndexEntries = 5 // three keys a file: the lookups read sealed files' slots too
			s, ffs := openFaulty(t, o)
			var res []PutResult
			for i := range 8 {
				res = append(res, putKeyed(t, s, "T", fmt.Sprint("body-", i), fmt.Sprint("k", i%2), fmt.Sprint("u", i)))
			}
			waitDispatch(t, s)
			require.Equal(t, []string{"body-1", "body-3", "body-5", "body-7"}, query(t, s, "T", "k1", false, 64))

			faultAt(ffs, res[3], rf.short)
			_, err := s.MessageAt(res[3].CommitLogOffset)
			assert.ErrorIs(t, err, ErrReadFailed)
			assert.ErrorIs(t, err, rf.cause)
			assert.NotErrorIs(t, err, ErrNotFound)
			_, err = s.QueryMessages(context.Background(), "T", "k1", false, 64, 0, 1<<62)
			assert.ErrorIs(t, err, ErrReadFailed, "a key query")
			_, err = s.QueryMessages(context.Background(), "T", "u3", true, 1, 0, 1<<62)
			assert.ErrorIs(t, err, ErrReadFailed, "a unique-key query")

			for name, match := range map[string]func(string) bool{
				"sealed index file": func(n string) bool { return strings.Contains(n, "/index/") && filepath.Base(n) == offsetName(0) },
				"every index file":  func(n string) bool { return strings.Contains(n, "/index/") },
			} {
				ffs.FailReads(&vfs.ReadFault{Match: match, Short: rf.short})
				_, err = s.QueryMessages(context.Background(), "T", "k0", false, 64, 0, 1<<62)
				assert.ErrorIs(t, err, ErrReadFailed, name)
				assert.ErrorIs(t, err, rf.cause, name)
			}
			ffs.FailReads(nil)
			assert.Equal(t, []string{"body-1", "body-3", "body-5", "body-7"}, query(t, s, "T", "k1", false, 64))
			assert.Positive(t, s.Stats().ReadErrors)
		})
	}
}

// closedDirtily closes s and puts the abort marker back, so that the next Open recovers
// as after a crash.
func closedDirtily(t *testing.T, s *Store, dir string) {
	t.Helper()
	require.NoError(t, s.Close())
	require.NoError(t, os.WriteFile(filepath.Join(dir, abortFile), nil, 0o644))
}

// reopenFaulty opens dir with reads failing as rf says and returns Open's error.
func reopenFaulty(t *testing.T, dir string, o Options, rf *vfs.ReadFault) error {
	t.Helper()
	ffs := vfs.NewFaultFS(nil)
	ffs.FailReads(rf)
	o.FS = ffs
	s, err := Open(dir, o)
	if err == nil {
		s.Close()
	}
	assert.Positive(t, ffs.ReadFaults(), "the fault was reached")
	return err
}

// A read fault during recovery fails Open with an error naming the file, and changes
// nothing: Open without the fault finds every message. Before, a consume-queue unit that
// could not be read counted as a unit past the log's end (dropped) or below its start
// (the queue's min offset moved past it), and an index checkpoint read short made a crash
// recovery delete every key-index file.
func TestRecoveryFailsOnAReadFault(t *testing.T) {
	type recCase struct {
		name  string
		crash bool
		fault vfs.ReadFault
	}
	cases := []recCase{
		{"first consume-queue unit", false, vfs.ReadFault{Match: func(n string) bool {
			return onlyConsumeQueues(n) && filepath.Base(n) == offsetName(0)
		}, Off: 0, Len: cqUnitSize}},
		{"commit log", true, vfs.ReadFault{Match: onlyCommitLog, Off: 10 << 10}},
		{"checkpoint", true, vfs.ReadFault{Match: func(n string) bool { return filepath.Base(n) == checkpointFile && !strings.Contains(n, "/index/") }}},
		{"index checkpoint", true, vfs.ReadFault{Match: func(n string) bool { return strings.HasSuffix(n, "/index/"+indexCPName) }}},
	}
	for _, c := range cases {
		for _, rf := range readFaults {
			t.Run(c.name+"/"+rf.name, func(t *testing.T) {
				dir := t.TempDir()
				o := indexOptions()
				o.ConsumeQueueUnits = 100
				s := openT(t, dir, o)
				for i := range 250 {
					putKeyed(t, s, "T", fmt.Sprintf("T-0-body-%d", i), fmt.Sprint("k", i), "")
				}
				waitDispatch(t, s)
				if c.crash {
					closedDirtily(t, s, dir)
				} else {
					require.NoError(t, s.Close())
				}
				fault := c.fault
				fault.Short, fault.Err = rf.short, nil
				err := reopenFaulty(t, dir, o, &fault)
				require.Error(t, err, "Open under a read fault")
				assert.ErrorIs(t, err, ErrReadFailed)
				assert.ErrorIs(t, err, rf.cause)
				assert.Contains(t, err.Error(), dir)

				s = openT(t, dir, o)
				defer s.Close()
				assert.EqualValues(t, 0, s.MinOffset("T", 0))
				assert.EqualValues(t, 250, s.MaxOffset("T", 0))
				assert.False(t, s.Stats().Recovery.Cut)
				assert.Equal(t, []string{"T-0-body-0"}, query(t, s, "T", "k0", false, 64))
				assert.Equal(t, []string{"T-0-body-249"}, query(t, s, "T", "k249", false, 64))
				checkConsistent(t, s)
			})
		}
	}
}

// Recovery's cut of a queue's tail and retention's cleaning of queue files read units: a
// unit that cannot be read is an error, not a unit to drop (nor a file to delete).
func TestQueueMaintenanceStopsOnAReadFault(t *testing.T) {
	o := testOptions()
	o.ConsumeQueueUnits = 10
	s, ffs := openFaulty(t, o)
	putN(t, s, "T", 0, 25, "")
	waitDispatch(t, s)
	q := s.queue("T", 0)

	ffs.FailReads(&vfs.ReadFault{Match: onlyConsumeQueues, Off: 4 * cqUnitSize, Len: cqUnitSize})
	n, err := s.truncateQueue(q, s.written.Load())
	assert.ErrorIs(t, err, ErrReadFailed, "the last unit cannot be read")
	assert.Zero(t, n)
	assert.EqualValues(t, 25, q.max.Load())

	ffs.FailReads(&vfs.ReadFault{Match: onlyConsumeQueues, Off: 9 * cqUnitSize, Len: cqUnitSize})
	err = s.cleanQueues(0)
	assert.ErrorIs(t, err, ErrReadFailed, "the first file's last unit cannot be read")
	assert.EqualValues(t, 0, q.min.Load())
	q.mu.RLock()
	files := len(q.files)
	q.mu.RUnlock()
	assert.Equal(t, 3, files, "no consume-queue file was deleted")

	ffs.FailReads(nil)
	g := get(t, s, "T", 0, 0, 32, 0, nil)
	assert.Equal(t, bodyRange(0, 10), bodies(t, g))
	g.Release()
	checkConsistent(t, s)
}
