package store

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A message larger than recovery's 4 MiB scan buffer (allowed by MaxMessageSize) must not
// make the store unopenable.
func TestRecoverLargeMessage(t *testing.T) {
	dir := t.TempDir()
	o := testOptions()
	o.SegmentSize = 16 << 20
	o.MaxMessageSize = 6 << 20
	s := openT(t, dir, o)
	m := newMsg("T", 0, "big", "")
	m.Body = []byte(strings.Repeat("x", 5<<20))
	r, err := s.Put(context.Background(), m)
	require.NoError(t, err)
	putN(t, s, "T", 0, 3, "")
	require.NoError(t, s.Close())
	// Clean reopen validates the last segments; a crash reopen validates everything.
	s = openT(t, dir, o)
	require.Equal(t, int64(4), s.MaxOffset("T", 0))
	require.NoError(t, s.Close())
	require.NoError(t, os.WriteFile(filepath.Join(dir, abortFile), nil, 0o644))
	s = openT(t, dir, o)
	defer s.Close()
	assert.False(t, s.Stats().Recovery.Cut)
	assert.Equal(t, int64(4), s.MaxOffset("T", 0))
	b, err := s.MessageAt(r.CommitLogOffset)
	require.NoError(t, err)
	assert.Len(t, b, int(r.Size))
	checkConsistent(t, s)
}

// After DeleteTopic (which writes a checkpoint) and a crash, recovery must not re-dispatch
// the deleted topic's old messages into the queues of the topic created again.
func TestCrashAfterDeleteTopic(t *testing.T) {
	dir := t.TempDir()
	ffs := vfs.NewFaultFS(nil)
	ffs.TrackUnsynced()
	o := testOptions()
	o.FS = ffs
	o.FlushMode = FlushSync
	s := openT(t, dir, o)
	putN(t, s, "A", 0, 5, "")
	waitDispatch(t, s)
	require.NoError(t, s.DeleteTopic("A"))
	r, err := s.Put(context.Background(), newMsg("A", 0, "new", ""))
	require.NoError(t, err)
	require.Equal(t, int64(0), r.QueueOffset)
	waitDispatch(t, s)
	require.NoError(t, ffs.Crash())
	s.Close()

	o.FS = nil
	s = openT(t, dir, o)
	defer s.Close()
	assert.False(t, s.Stats().Recovery.Clean)
	assert.Equal(t, int64(1), s.MaxOffset("A", 0))
	g := get(t, s, "A", 0, 0, 32, 0, nil)
	defer g.Release()
	require.Len(t, g.Messages, 1)
	assert.Equal(t, "new", string(decodeAll(t, g)[0].Body))
	checkConsistent(t, s)
}

// The checkpoint fsyncs dirty consume-queue files from a snapshot; one that retention or
// DeleteTopic closed meanwhile must be skipped, not fail the store (EBADF before the fix).
func TestCheckpointSkipsClosedQueueFile(t *testing.T) {
	s := openT(t, t.TempDir(), testOptions())
	defer s.Close()
	putN(t, s, "A", 0, 3, "")
	waitDispatch(t, s)
	q := s.queue("A", 0)
	q.mu.RLock()
	f := q.files[0]
	q.mu.RUnlock()
	f.dirty.Store(true)
	require.NoError(t, f.f.Close()) // as cleanQueues/DeleteTopic do, racing the snapshot
	require.NoError(t, s.checkpoint())
	assert.NoError(t, s.Stats().WriteFailure)
}

func TestHugeMaxMsgsDoesNotSizeTheScan(t *testing.T) {
	s := openT(t, t.TempDir(), testOptions())
	putN(t, s, "T", 0, 3, "")
	waitDispatch(t, s)
	g := get(t, s, "T", 0, 0, math.MaxInt32, 0, nil)
	assert.Equal(t, Found, g.Status)
	assert.Len(t, g.Messages, 3)
}

// Without a checkpoint recovery re-dispatches the whole commit log; the deleted topic's old
// messages must not come back (they did before deletions were recorded).
func TestDeletedTopicStaysDeletedAfterCrashWithoutCheckpoint(t *testing.T) {
	dir := t.TempDir()
	ffs := vfs.NewFaultFS(nil)
	ffs.TrackUnsynced()
	o := testOptions()
	o.FS = ffs
	o.FlushMode = FlushSync
	s := openT(t, dir, o)
	putN(t, s, "A", 0, 5, "")
	putN(t, s, "B", 0, 2, "")
	waitDispatch(t, s)
	require.NoError(t, s.DeleteTopic("A"))
	_, err := s.Put(context.Background(), newMsg("A", 0, "new", ""))
	require.NoError(t, err)
	waitDispatch(t, s)
	require.NoError(t, ffs.Crash())
	s.Close()
	require.NoError(t, os.Remove(filepath.Join(dir, checkpointFile)))

	o.FS = nil
	s = openT(t, dir, o)
	defer s.Close()
	rep := s.Stats().Recovery
	require.False(t, rep.CheckpointFound)
	assert.Equal(t, int64(1), s.MaxOffset("A", 0), "only the message sent after the deletion")
	g := get(t, s, "A", 0, 0, 32, 0, nil)
	defer g.Release()
	require.Len(t, g.Messages, 1)
	assert.Equal(t, "new", string(decodeAll(t, g)[0].Body))
	assert.Equal(t, int64(2), s.MaxOffset("B", 0), "other topics are re-dispatched")
	checkConsistent(t, s)
}

// A deletion record is dropped once retention removed every message it covers.
func TestTombstonesPrune(t *testing.T) {
	tb := tombstones{"A": 100, "B": 300}
	assert.True(t, tb.buried([]byte("A"), 99))
	assert.False(t, tb.buried([]byte("A"), 100))
	assert.False(t, tb.buried([]byte("C"), 0))
	assert.True(t, tb.prune(200))
	assert.Equal(t, tombstones{"B": 300}, tb)
	assert.False(t, tb.prune(200))
}
