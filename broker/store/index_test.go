package store

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/flowd-io/flowd/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func keyedMsg(topic, body, keys, uniq string) *protocol.MessageExt {
	m := newMsg(topic, 0, body, "")
	delete(m.Properties, protocol.PropertyUniqueKey)
	if keys != "" {
		m.Properties[protocol.PropertyKeys] = keys
	}
	if uniq != "" {
		m.Properties[protocol.PropertyUniqueKey] = uniq
	}
	return m
}

func putKeyed(t testing.TB, s *Store, topic, body, keys, uniq string) PutResult {
	t.Helper()
	r, err := s.Put(context.Background(), keyedMsg(topic, body, keys, uniq))
	require.NoError(t, err)
	return r
}

// query runs a key (or unique-key) query over all time and returns the bodies found.
func query(t testing.TB, s *Store, topic, key string, unique bool, maxNum int) []string {
	t.Helper()
	return queryRange(t, s, topic, key, unique, maxNum, 0, math.MaxInt64)
}

func queryRange(t testing.TB, s *Store, topic, key string, unique bool, maxNum int, begin, end int64) []string {
	t.Helper()
	r, err := s.QueryMessages(context.Background(), topic, key, unique, maxNum, begin, end)
	require.NoError(t, err)
	out := []string{}
	prev := int64(-1)
	for _, b := range r.Messages {
		m, _, err := protocol.DecodeStored(b)
		require.NoError(t, err)
		require.Greater(t, m.CommitLogOffset, prev, "results ascend by commit-log offset, without duplicates")
		prev = m.CommitLogOffset
		out = append(out, string(m.Body))
	}
	return out
}

func indexOptions() Options {
	o := testOptions()
	o.IndexSlots = 64
	o.IndexEntries = 1000
	return o
}

func TestIndexFindsMessagesByKeyAndUniqueKey(t *testing.T) {
	s := openT(t, t.TempDir(), indexOptions())
	defer s.Close()
	putKeyed(t, s, "T", "m0", "order-1 customer-7", "U0")
	putKeyed(t, s, "T", "m1", "order-2  customer-7 ", "U1") // extra spaces are separators
	putKeyed(t, s, "T", "m2", "", "U2")
	putKeyed(t, s, "Other", "o0", "order-1", "U0") // same key, other topic
	waitDispatch(t, s)

	assert.Equal(t, []string{"m0"}, query(t, s, "T", "order-1", false, 32))
	assert.Equal(t, []string{"m0", "m1"}, query(t, s, "T", "customer-7", false, 32))
	assert.Equal(t, []string{"o0"}, query(t, s, "Other", "order-1", false, 32))
	assert.Equal(t, []string{"m2"}, query(t, s, "T", "U2", true, 32))
	assert.Empty(t, query(t, s, "T", "U2", false, 32), "a key query matches KEYS, not UNIQ_KEY")
	assert.Empty(t, query(t, s, "T", "order-1", true, 32), "a unique-key query matches UNIQ_KEY only")
	assert.Empty(t, query(t, s, "T", "nope", false, 32))
	assert.Empty(t, query(t, s, "Nope", "order-1", false, 32))

	r, err := s.QueryMessages(context.Background(), "T", "customer-7", false, 1, 0, math.MaxInt64)
	require.NoError(t, err)
	require.Len(t, r.Messages, 1, "maxNum bounds the result; the newest wins")
	m, _, err := protocol.DecodeStored(r.Messages[0])
	require.NoError(t, err)
	assert.Equal(t, "m1", string(m.Body))
	assert.Equal(t, s.Stats().CommitLogMaxOffset-int64(len(encodeT(t, s, keyedMsg("Other", "o0", "order-1", "U0")))), r.IndexLastUpdatePhyOffset,
		"indexLastUpdatePhyoffset is the offset of the last message indexed")
	assert.Positive(t, r.IndexLastUpdateTimestamp)
}

func encodeT(t testing.TB, s *Store, m *protocol.MessageExt) []byte {
	t.Helper()
	b, err := s.encode(nil, m)
	require.NoError(t, err)
	return b
}

func TestIndexUniqueQueryReturnsOneMessage(t *testing.T) {
	s := openT(t, t.TempDir(), indexOptions())
	defer s.Close()
	putKeyed(t, s, "T", "first", "", "DUP")
	putKeyed(t, s, "T", "again", "", "DUP") // a producer retry stored it twice
	waitDispatch(t, s)
	assert.Equal(t, []string{"again"}, query(t, s, "T", "DUP", true, 32))
	assert.Equal(t, []string{"again"}, query(t, s, "T", "DUP", true, 0), "a unique query ignores maxNum")
}

func TestIndexQueryRejectsBadInput(t *testing.T) {
	s := openT(t, t.TempDir(), indexOptions())
	defer s.Close()
	_, err := s.QueryMessages(context.Background(), "T", "k", false, 1, 10, 9)
	assert.ErrorIs(t, err, ErrBadQuery)
	_, err = s.QueryMessages(context.Background(), "T", "k", false, 0, 0, 9)
	assert.ErrorIs(t, err, ErrBadQuery)
	_, err = s.QueryMessages(context.Background(), "T", "", false, 1, 0, 9)
	assert.ErrorIs(t, err, ErrBadQuery)
	_, err = s.QueryMessages(context.Background(), "bad/topic", "k", false, 1, 0, 9)
	assert.ErrorIs(t, err, ErrBadTopic)
}

// TestIndexFiltersHashCollisions: "Aa" and "BB" have the same Java hash code, and with one
// slot every key shares a chain; only exact matches come back.
func TestIndexFiltersHashCollisions(t *testing.T) {
	require.Equal(t, indexHash([]byte("T"), []byte("Aa")), indexHash([]byte("T"), []byte("BB")))
	o := indexOptions()
	o.IndexSlots = 1
	s := openT(t, t.TempDir(), o)
	defer s.Close()
	putKeyed(t, s, "T", "aa", "Aa", "")
	putKeyed(t, s, "T", "bb", "BB", "")
	putKeyed(t, s, "T", "cc", "C", "")
	putKeyed(t, s, "T", "aa2", "x Aa", "")
	waitDispatch(t, s)
	assert.Equal(t, []string{"aa", "aa2"}, query(t, s, "T", "Aa", false, 32))
	assert.Equal(t, []string{"bb"}, query(t, s, "T", "BB", false, 32))
	assert.Equal(t, []string{"cc"}, query(t, s, "T", "C", false, 32))
}

func TestIndexRollsOverFiles(t *testing.T) {
	dir := t.TempDir()
	o := indexOptions()
	o.IndexSlots = 5
	o.IndexEntries = 8 // 7 keys a file
	s := openT(t, dir, o)
	var want []string
	for i := range 40 {
		body := fmt.Sprintf("b%02d", i)
		putKeyed(t, s, "T", body, fmt.Sprintf("k%d all", i%3), "") // two keys each
		if i%3 == 1 {
			want = append(want, body)
		}
	}
	waitDispatch(t, s)
	files, err := os.ReadDir(filepath.Join(dir, indexDirName))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, len(files), 1+80/7, "index files and their checkpoint")

	assert.Equal(t, want, query(t, s, "T", "k1", false, 64))
	all := query(t, s, "T", "all", false, 64)
	assert.Len(t, all, 40)
	assert.Equal(t, "b39", all[39])
	assert.Equal(t, want[len(want)-3:], query(t, s, "T", "k1", false, 3), "the newest maxNum")
	require.NoError(t, s.Close())

	// A clean reopen reads the slot table written at Close and keeps indexing.
	s = openT(t, dir, o)
	defer s.Close()
	assert.Equal(t, want, query(t, s, "T", "k1", false, 64))
	putKeyed(t, s, "T", "b40", "k1", "")
	waitDispatch(t, s)
	assert.Equal(t, append(want, "b40"), query(t, s, "T", "k1", false, 64))
}

func TestIndexTimeRange(t *testing.T) {
	var now atomic.Int64
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	now.Store(t0)
	o := indexOptions()
	o.Now = func() time.Time { return time.UnixMilli(now.Load()) }
	o.IndexEntries = 6 // files roll, so the file-level time checks are exercised too
	s := openT(t, t.TempDir(), o)
	defer s.Close()
	for i := range 10 {
		now.Store(t0 + int64(i)*1500) // 1.5 s apart: time differences are whole seconds
		putKeyed(t, s, "T", fmt.Sprintf("m%d", i), "k", "")
	}
	waitDispatch(t, s)
	ts := func(i int) int64 { return t0 + int64(i)*1500 }
	assert.Equal(t, []string{"m3"}, queryRange(t, s, "T", "k", false, 32, ts(3), ts(3)), "millisecond bounds are exact")
	assert.Equal(t, []string{"m3", "m4", "m5"}, queryRange(t, s, "T", "k", false, 32, ts(3), ts(5)))
	assert.Equal(t, []string{"m4", "m5"}, queryRange(t, s, "T", "k", false, 32, ts(3)+1, ts(5)+1))
	assert.Empty(t, queryRange(t, s, "T", "k", false, 32, ts(3)+1, ts(4)-1))
	assert.Equal(t, []string{"m0"}, queryRange(t, s, "T", "k", false, 32, 0, ts(0)))
	assert.Equal(t, []string{"m9"}, queryRange(t, s, "T", "k", false, 32, ts(9), math.MaxInt64))
	assert.Empty(t, queryRange(t, s, "T", "k", false, 32, ts(9)+1, math.MaxInt64))
}

// TestIndexRecoversFromPowerCut loses everything unsynced and reopens: every acknowledged
// (FlushSync) message is found by its keys exactly once, and nothing that does not exist
// is returned. The checkpoint is never written after Open, so recovery re-dispatches (and
// re-indexes) everything.
func TestIndexRecoversFromPowerCut(t *testing.T) {
	for _, mode := range []FlushMode{FlushSync, FlushAsync} {
		t.Run(mode.String(), func(t *testing.T) {
			for _, cpEvery := range []time.Duration{time.Hour, 5 * time.Millisecond} {
				dir := t.TempDir()
				ffs := vfs.NewFaultFS(nil)
				ffs.TrackUnsynced()
				o := indexOptions()
				o.IndexSlots = 7
				o.IndexEntries = 50
				o.SegmentSize = 16 << 10
				o.FS = ffs
				o.FlushMode = mode
				o.CheckpointInterval = cpEvery
				s := openT(t, dir, o)
				var acked []int
				for i := range 300 {
					_, err := s.Put(context.Background(), keyedMsg("T", fmt.Sprintf("m%03d", i), fmt.Sprintf("k%d all", i%5), fmt.Sprintf("U%d", i)))
					require.NoError(t, err)
					acked = append(acked, i)
					if i == 150 {
						waitDispatch(t, s)
						require.NoError(t, s.checkpoint())
					}
				}
				waitDispatch(t, s)
				require.NoError(t, ffs.Crash())
				s.Close()

				o.FS = nil
				s = openT(t, dir, o)
				rep := s.Stats().Recovery
				assert.False(t, rep.Clean)
				all := query(t, s, "T", "all", false, 64)
				for _, body := range all {
					assert.True(t, strings.HasPrefix(body, "m"))
				}
				byKey := 0
				for k := range 5 {
					got := queryRange(t, s, "T", fmt.Sprintf("k%d", k), false, 64, 0, math.MaxInt64)
					byKey += len(got)
				}
				// Count what survived in the log, and check each one is found by its unique key.
				kept := 0
				for _, i := range acked {
					got := query(t, s, "T", fmt.Sprintf("U%d", i), true, 1)
					if len(got) == 1 {
						assert.Equal(t, fmt.Sprintf("m%03d", i), got[0])
						kept++
					}
					if mode == FlushSync {
						assert.Len(t, got, 1, "acknowledged message %d is found by its unique key", i)
					}
				}
				assert.Equal(t, kept, byKey, "every surviving message is found by its key exactly once")
				assert.Equal(t, min(kept, 64), len(all))
				assert.Equal(t, int64(kept), s.MaxOffset("T", 0), "every message the log kept is found, no other")
				// Indexing continues after the recovered end.
				putKeyed(t, s, "T", "after", "k0", "Uafter")
				waitDispatch(t, s)
				assert.Equal(t, []string{"after"}, query(t, s, "T", "Uafter", true, 1))
				require.NoError(t, s.Close())
			}
		})
	}
}

// TestIndexForgetsMessagesCutByRecovery: when recovery cuts a corrupt tail, the index must
// forget the cut messages, or a new message stored at the same offset would be taken for a
// duplicate and never indexed.
func TestIndexForgetsMessagesCutByRecovery(t *testing.T) {
	dir := t.TempDir()
	o := indexOptions()
	s := openT(t, dir, o)
	putKeyed(t, s, "T", "m0", "k0", "")
	last := putKeyed(t, s, "T", "m1", "k1", "")
	require.NoError(t, s.Close())

	// Flip a body byte of the last message and leave the abort marker: a crash recovery cuts it.
	path := filepath.Join(dir, commitLogDir, offsetName(0))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	var b [1]byte
	at := last.CommitLogOffset + int64(last.Size) - 10
	_, err = f.ReadAt(b[:], at)
	require.NoError(t, err)
	b[0] ^= 0xFF
	_, err = f.WriteAt(b[:], at)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, os.WriteFile(filepath.Join(dir, abortFile), nil, 0o644))

	s = openT(t, dir, o)
	defer s.Close()
	require.True(t, s.Stats().Recovery.Cut)
	assert.Empty(t, query(t, s, "T", "k1", false, 8))
	r := putKeyed(t, s, "T", "new", "k2", "")
	require.Equal(t, last.CommitLogOffset, r.CommitLogOffset, "the new message takes the cut one's place")
	waitDispatch(t, s)
	assert.Equal(t, []string{"new"}, query(t, s, "T", "k2", false, 8))
	assert.Equal(t, []string{"m0"}, query(t, s, "T", "k0", false, 8))
}

func TestIndexRetentionDeletesOldFiles(t *testing.T) {
	dir := t.TempDir()
	var now atomic.Int64
	now.Store(time.Now().UnixMilli())
	o := indexOptions()
	o.SegmentSize = 4096
	o.IndexSlots = 3
	o.IndexEntries = 5
	o.Retention = time.Hour
	o.Now = func() time.Time { return time.UnixMilli(now.Load()) }
	s := openT(t, dir, o)
	defer s.Close()
	for i := range 60 {
		putKeyed(t, s, "T", fmt.Sprintf("m%02d-%s", i, strings.Repeat("x", 100)), "k", "")
	}
	waitDispatch(t, s)
	require.NoError(t, s.flushCommitLog())
	before, err := os.ReadDir(filepath.Join(dir, indexDirName))
	require.NoError(t, err)
	require.Len(t, query(t, s, "T", "k", false, 64), 60)

	now.Add((2 * time.Hour).Milliseconds()) // every segment but the active one expires
	require.NoError(t, s.clean())
	minOff := s.Stats().CommitLogMinOffset
	require.Positive(t, minOff)
	after, err := os.ReadDir(filepath.Join(dir, indexDirName))
	require.NoError(t, err)
	assert.Less(t, len(after), len(before), "index files below the log's min offset are deleted")
	s.index.mu.RLock()
	for _, f := range s.index.files[:len(s.index.files)-1] {
		assert.GreaterOrEqual(t, f.hdr.endPhy, minOff)
	}
	s.index.mu.RUnlock()
	got := query(t, s, "T", "k", false, 64)
	assert.NotEmpty(t, got)
	assert.Less(t, len(got), 60, "messages of deleted segments are not returned")
	for _, body := range got {
		assert.GreaterOrEqual(t, body, "m", body)
	}
}

func TestIndexForgetsDeletedTopics(t *testing.T) {
	s := openT(t, t.TempDir(), indexOptions())
	defer s.Close()
	putKeyed(t, s, "T", "old", "k", "")
	waitDispatch(t, s)
	require.NoError(t, s.DeleteTopic("T"))
	putKeyed(t, s, "T", "new", "k", "")
	waitDispatch(t, s)
	assert.Equal(t, []string{"new"}, query(t, s, "T", "k", false, 8))
}

func TestIndexDisabled(t *testing.T) {
	dir := t.TempDir()
	o := indexOptions()
	o.DisableIndex = true
	s := openT(t, dir, o)
	defer s.Close()
	putKeyed(t, s, "T", "m", "k", "")
	waitDispatch(t, s)
	assert.Empty(t, query(t, s, "T", "k", false, 8))
	_, err := os.Stat(filepath.Join(dir, indexDirName))
	assert.True(t, os.IsNotExist(err))
}

// TestIndexSlotWriteFailureAtCloseKeepsTheAbortMarker: a clean Open trusts the slot table
// Close wrote, so Close must not declare the stop clean when writing it failed.
func TestIndexSlotWriteFailureAtCloseKeepsTheAbortMarker(t *testing.T) {
	dir := t.TempDir()
	ffs := vfs.NewFaultFS(nil)
	o := indexOptions()
	o.FS = ffs
	s := openT(t, dir, o)
	putKeyed(t, s, "T", "m0", "k", "")
	waitDispatch(t, s)
	ffs.Match(func(name string) bool { return name == filepath.Join(dir, indexDirName, offsetName(0)) })
	ffs.ShortWrites(1)
	require.Error(t, s.Close())

	o.FS = nil
	s = openT(t, dir, o)
	defer s.Close()
	assert.False(t, s.Stats().Recovery.Clean)
	assert.Equal(t, []string{"m0"}, query(t, s, "T", "k", false, 8))
}

// TestIndexRedispatchAddsNoDuplicates: when the index is durable beyond the checkpoint
// (its record is written just before the store's), recovery re-dispatches messages the
// index already holds; they must not be indexed twice.
func TestIndexRedispatchAddsNoDuplicates(t *testing.T) {
	dir := t.TempDir()
	o := indexOptions()
	s := openT(t, dir, o)
	var rs []PutResult
	for i := range 10 {
		rs = append(rs, putKeyed(t, s, "T", fmt.Sprintf("m%d", i), "k", fmt.Sprintf("U%d", i)))
	}
	require.NoError(t, s.Close())

	// A checkpoint from before message 5 was dispatched, and a crash.
	now := time.Now().UnixMilli()
	rec := checkpointRecord{logOffset: rs[5].CommitLogOffset, logTime: now, queueOffset: rs[5].CommitLogOffset, queueTime: now}
	require.NoError(t, os.WriteFile(filepath.Join(dir, checkpointFile), rec.encode(), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, abortFile), nil, 0o644))

	s = openT(t, dir, o)
	defer s.Close()
	require.Equal(t, int64(5), s.Stats().Recovery.Redispatched)
	s.index.mu.RLock()
	entries := 0
	for _, f := range s.index.files {
		entries += int(f.hdr.count) - 1
	}
	s.index.mu.RUnlock()
	assert.Equal(t, 20, entries, "two keys for each of ten messages, none twice")
	assert.Len(t, query(t, s, "T", "k", false, 64), 10)
}

// TestIndexFileCreatedAfterTheLastCheckpointIsDropped: after recovery emptied the index,
// its checkpoint says "no entries"; a file created after that and never synced (its size
// lost in a power cut) must be dropped at the next Open, not reported as corrupt.
func TestIndexFileCreatedAfterTheLastCheckpointIsDropped(t *testing.T) {
	dir := t.TempDir()
	o := indexOptions()
	o.CheckpointInterval = time.Hour
	crashWith := func(body, key string) {
		ffs := vfs.NewFaultFS(nil)
		ffs.TrackUnsynced()
		o.FS = ffs
		s := openT(t, dir, o)
		r := putKeyed(t, s, "T", body, key, "")
		require.Zero(t, r.CommitLogOffset)
		waitDispatch(t, s)
		require.NoError(t, s.checkpoint()) // the index is durable, the log (async, not flushed) is not
		require.NoError(t, ffs.Crash())
		s.Close()
	}
	crashWith("m1", "k1")
	o.FS = nil
	s := openT(t, dir, o) // the log lost m1: the index is emptied
	assert.Empty(t, query(t, s, "T", "k1", false, 8))
	require.NoError(t, s.Close())

	ffs := vfs.NewFaultFS(nil)
	ffs.TrackUnsynced()
	o.FS = ffs
	s = openT(t, dir, o)
	putKeyed(t, s, "T", "m2", "k2", "")
	waitDispatch(t, s)
	require.NoError(t, ffs.Crash())
	s.Close()

	o.FS = nil
	s = openT(t, dir, o)
	defer s.Close()
	assert.Empty(t, query(t, s, "T", "k2", false, 8))
	putKeyed(t, s, "T", "m3", "k3", "")
	waitDispatch(t, s)
	assert.Equal(t, []string{"m3"}, query(t, s, "T", "k3", false, 8))
}

// TestIndexMessageWithMoreKeysThanAFileHolds: every file takes one key here, so one
// message spreads over three files, which must not share a name.
func TestIndexMessageWithMoreKeysThanAFileHolds(t *testing.T) {
	dir := t.TempDir()
	o := indexOptions()
	o.IndexEntries = 2
	s := openT(t, dir, o)
	putKeyed(t, s, "T", "m0", "a b c", "")
	putKeyed(t, s, "T", "m1", "c", "")
	waitDispatch(t, s)
	for _, k := range []string{"a", "b"} {
		assert.Equal(t, []string{"m0"}, query(t, s, "T", k, false, 8), k)
	}
	assert.Equal(t, []string{"m0", "m1"}, query(t, s, "T", "c", false, 8))
	require.NoError(t, s.Close())
	s = openT(t, dir, o)
	defer s.Close()
	assert.Equal(t, []string{"m0", "m1"}, query(t, s, "T", "c", false, 8))
}

// TestIndexSizesChanged: index files of other sizes cannot be read; they are dropped
// instead of keeping the store from opening.
func TestIndexSizesChanged(t *testing.T) {
	dir := t.TempDir()
	o := indexOptions()
	s := openT(t, dir, o)
	putKeyed(t, s, "T", "old", "k", "")
	require.NoError(t, s.Close())
	o.IndexEntries = 500
	s = openT(t, dir, o)
	defer s.Close()
	assert.Empty(t, query(t, s, "T", "k", false, 8))
	putKeyed(t, s, "T", "new", "k", "")
	waitDispatch(t, s)
	assert.Equal(t, []string{"new"}, query(t, s, "T", "k", false, 8))
}
