//go:build linux

package store

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGuardedCopySIGBUS: touching a mapped page past the end of its file raises SIGBUS; the
// guard turns it into an error.
func TestGuardedCopySIGBUS(t *testing.T) {
	p := filepath.Join(t.TempDir(), "seg")
	f, err := vfs.Default().Create(p)
	require.NoError(t, err)
	defer f.Close()
	m, err := mapSegment(f, 1<<16)
	require.NoError(t, err)
	require.NotNil(t, m)
	defer unmapSegment(m)
	require.NoError(t, guardedCopy(m[100:], []byte("hello")))
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(b[100:105]), "a store to the mapping is in the file at once")
	require.NoError(t, os.Truncate(p, 0))
	dst := make([]byte, 10)
	err = guardedCopy(dst, m[8192:])
	assert.ErrorContains(t, err, "fault")
	assert.Error(t, guardedCopy(m[8192:], dst))
}

func TestMappedAndPwritePathsAgree(t *testing.T) {
	for _, disable := range []bool{false, true} {
		dir := t.TempDir()
		o := testOptions()
		o.SegmentSize = 8192
		o.DisableMmap = disable
		s := openT(t, dir, o)
		res := putN(t, s, "M", 0, 100, "x")
		s.activeSeg.Load().mu.RLock()
		mapped := s.activeSeg.Load().m != nil
		s.activeSeg.Load().mu.RUnlock()
		assert.Equal(t, !disable, mapped)
		waitDispatch(t, s)
		checkConsistent(t, s)
		require.NoError(t, s.Close())
		s = openT(t, dir, o)
		checkConsistent(t, s)
		assert.Equal(t, int64(100), s.MaxOffset("M", 0))
		b, err := s.MessageAt(res[99].CommitLogOffset)
		require.NoError(t, err)
		assert.Len(t, b, int(res[99].Size))
		require.NoError(t, s.Close())
	}
}

// TestMappedConsumeQueue: the dispatcher writes units through a mapping of the full-size
// file (DisableMmap: by pwrite, the file as long as its units); a clean Close cuts the file
// back to its units, and a crash recovery drops the zeros after them without counting them
// as removed units.
func TestMappedConsumeQueue(t *testing.T) {
	const units = 64
	for _, disable := range []bool{false, true} {
		dir := t.TempDir()
		o := testOptions()
		o.ConsumeQueueUnits = units
		o.DisableMmap = disable
		o.CheckpointInterval = time.Hour        // the test checkpoints, so that the copy below is coherent
		o.IndexSlots, o.IndexEntries = 64, 1024 // a small index file to copy
		s := openT(t, dir, o)
		putN(t, s, "Q", 0, units+10, "a") // two files: the first full, the second mapped part-used
		waitDispatch(t, s)
		q := s.queue("Q", 0)
		q.mu.RLock()
		require.Len(t, q.files, 2)
		first, last := q.files[0], q.files[1]
		q.mu.RUnlock()
		last.mmu.Lock()
		mapped := last.m != nil
		last.mmu.Unlock()
		assert.Equal(t, !disable, mapped)
		first.mmu.Lock()
		assert.Nil(t, first.m, "a full file is unmapped when the next one is mapped")
		first.mmu.Unlock()
		size := func() int64 {
			fi, err := os.Stat(last.path)
			require.NoError(t, err)
			return fi.Size()
		}
		if disable {
			assert.Equal(t, int64(10*cqUnitSize), size())
		} else {
			assert.Equal(t, int64(units*cqUnitSize), size(), "a mapped file is full size")
		}
		checkConsistent(t, s)

		// With the checkpoint covering every unit, the crash recovery below re-dispatches
		// nothing: the units it finds are the ones the mapping wrote.
		require.NoError(t, s.checkpoint())
		// A copy of the directory now is what a kill -9 leaves: the page cache.
		crashed := t.TempDir()
		require.NoError(t, os.CopyFS(crashed, os.DirFS(dir)))
		require.NoError(t, os.Remove(filepath.Join(crashed, lockFileName)))

		require.NoError(t, s.Close())
		assert.Equal(t, int64(10*cqUnitSize), size(), "Close cuts a mapped file back to its units")
		s = openT(t, dir, o)
		assert.Equal(t, int64(units+10), s.MaxOffset("Q", 0))
		assert.Zero(t, s.Stats().Recovery.RemovedUnits)
		checkConsistent(t, s)
		require.NoError(t, s.Close())

		s = openT(t, crashed, o)
		assert.Equal(t, int64(units+10), s.MaxOffset("Q", 0))
		assert.Zero(t, s.Stats().Recovery.RemovedUnits, "the zeros after the last unit are not units")
		assert.Zero(t, s.Stats().Recovery.Redispatched)
		checkConsistent(t, s)
		putN(t, s, "Q", 0, 5, "a")
		waitDispatch(t, s)
		assert.Equal(t, int64(units+15), s.MaxOffset("Q", 0))
		checkConsistent(t, s)
		require.NoError(t, s.Close())
	}
}

// TestMappedConsumeQueuesAreCapped: past the store's cap on mapped consume-queue files, a
// queue's file is written with pwrite; the units are the same either way, and every
// mapping is counted back when its file closes.
func TestMappedConsumeQueuesAreCapped(t *testing.T) {
	o := testOptions()
	s := openT(t, t.TempDir(), o)
	s.cqMapCap = 2 // before the first dispatch maps a file
	for qid := range int32(3) {
		putN(t, s, "C", qid, 5, "c")
	}
	waitDispatch(t, s)
	mapped := 0
	for qid := range int32(3) {
		q := s.queue("C", qid)
		q.mu.RLock()
		f := q.files[len(q.files)-1]
		q.mu.RUnlock()
		f.mmu.Lock()
		if f.m != nil {
			mapped++
		}
		f.mmu.Unlock()
		assert.Equal(t, int64(5), s.MaxOffset("C", qid))
	}
	assert.Equal(t, 2, mapped, "two files mapped, the third written with pwrite")
	assert.Equal(t, int64(2), s.cqMaps.Load())
	checkConsistent(t, s)
	require.NoError(t, s.DeleteTopic("C"))
	assert.Zero(t, s.cqMaps.Load(), "the deleted topic's mappings are counted back")
	putN(t, s, "D", 0, 1, "d")
	waitDispatch(t, s)
	assert.Equal(t, int64(1), s.cqMaps.Load(), "and the room is used again")
	require.NoError(t, s.Close())
	assert.Zero(t, s.cqMaps.Load())
}
