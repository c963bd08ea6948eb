package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/flowd-io/flowd/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPutUnnamed: PutUnnamed stores as Put does but leaves MsgID empty; the id made from
// StoreHost and the offset finds the message.
func TestPutUnnamed(t *testing.T) {
	s := openT(t, t.TempDir(), testOptions())
	defer s.Close()
	putN(t, s, "T", 0, 2, "")
	m := newMsg("T", 0, "unnamed", "")
	r, err := s.PutUnnamed(context.Background(), m)
	require.NoError(t, err)
	assert.Empty(t, r.MsgID)
	assert.Positive(t, r.Size, "a stored message's result has a size")
	assert.Equal(t, int64(2), r.QueueOffset)
	assert.Equal(t, testHost, s.StoreHost())
	_, off, err := protocol.ParseOffsetMsgID(string(protocol.AppendOffsetMsgID(nil, s.StoreHost(), r.CommitLogOffset)))
	require.NoError(t, err)
	b, err := s.MessageAt(off)
	require.NoError(t, err)
	got, _, err := protocol.DecodeStored(b)
	require.NoError(t, err)
	assert.Equal(t, "unnamed", string(got.Body))

	_, err = s.PutUnnamed(context.Background(), newMsg("bad topic!", 0, "x", ""))
	require.ErrorIs(t, err, ErrBadTopic)
}

func TestPutGetReopen(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, testOptions())
	res := putN(t, s, "T", 0, 10, "a")
	putN(t, s, "T", 1, 3, "")
	for i, r := range res {
		assert.Equal(t, int64(i), r.QueueOffset)
		assert.Equal(t, protocol.OffsetMsgID(testHost, r.CommitLogOffset), r.MsgID)
		_, off, err := protocol.ParseOffsetMsgID(r.MsgID)
		require.NoError(t, err)
		assert.Equal(t, r.CommitLogOffset, off)
	}
	assert.True(t, strings.HasPrefix(res[0].MsgID, "0A010203"), res[0].MsgID)
	waitDispatch(t, s)
	g := get(t, s, "T", 0, 0, 32, 0, nil)
	assert.Equal(t, Found, g.Status)
	ms := decodeAll(t, g)
	require.Len(t, ms, 10)
	for i, m := range ms {
		assert.Equal(t, fmt.Sprintf("T-0-body-%d", i), string(m.Body))
		assert.Equal(t, int64(i), m.QueueOffset)
		assert.Equal(t, res[i].CommitLogOffset, m.CommitLogOffset)
		assert.Equal(t, res[i].StoreTimestamp, m.StoreTimestamp)
		assert.Equal(t, testHost, m.StoreHost)
	}
	assert.Equal(t, int64(10), g.NextBeginOffset)
	g.Release()
	g.Release()
	assert.Equal(t, map[string][]int32{"T": {0, 1}}, s.Queues())
	require.NoError(t, s.Close())
	assert.ErrorIs(t, s.Close(), ErrClosed)
	_, err := s.Put(context.Background(), newMsg("T", 0, "x", ""))
	assert.ErrorIs(t, err, ErrClosed)

	s = openT(t, dir, testOptions())
	defer s.Close()
	rep := s.Stats().Recovery
	assert.True(t, rep.Clean)
	assert.False(t, rep.Cut)
	assert.Equal(t, int64(10), s.MaxOffset("T", 0))
	assert.Equal(t, int64(3), s.MaxOffset("T", 1))
	r := putN(t, s, "T", 0, 1, "")
	assert.Equal(t, int64(10), r[0].QueueOffset)
	waitDispatch(t, s)
	checkConsistent(t, s)
}

func TestLocked(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, testOptions())
	_, err := Open(dir, testOptions())
	assert.ErrorIs(t, err, ErrLocked)
	require.NoError(t, s.Close())
	s = openT(t, dir, testOptions())
	require.NoError(t, s.Close())
}

func TestBadInput(t *testing.T) {
	s := openT(t, t.TempDir(), testOptions())
	defer s.Close()
	for _, topic := range []string{"", "a/b", "..", strings.Repeat("x", 128), "sp ace"} {
		_, err := s.Put(context.Background(), newMsg(topic, 0, "x", ""))
		assert.ErrorIs(t, err, ErrBadTopic, topic)
	}
	_, err := s.Put(context.Background(), newMsg("T", -1, "x", ""))
	assert.ErrorIs(t, err, ErrBadTopic)
	big := newMsg("T", 0, strings.Repeat("x", 1<<20), "")
	_, err = s.Put(context.Background(), big)
	assert.ErrorIs(t, err, ErrMessageTooLarge)
	_, err = Open(t.TempDir(), Options{SegmentSize: 1 << 16, MaxMessageSize: 1 << 20})
	assert.Error(t, err)
}

func TestGetStatuses(t *testing.T) {
	o := testOptions()
	o.ConsumeQueueUnits = 10
	s := openT(t, t.TempDir(), o)
	defer s.Close()
	putN(t, s, "T", 0, 25, "a")
	waitDispatch(t, s)

	type want struct {
		st   GetStatus
		next int64
		n    int
	}
	check := func(name string, off int64, w want) {
		t.Helper()
		g := get(t, s, "T", 0, off, 32, 0, nil)
		defer g.Release()
		assert.Equal(t, w.st, g.Status, name)
		assert.Equal(t, w.next, g.NextBeginOffset, name)
		assert.Len(t, g.Messages, w.n, name)
	}
	check("found, stops at file end", 0, want{Found, 10, 10})
	check("found mid", 12, want{Found, 20, 8})
	check("overflow one", 25, want{OffsetOverflowOne, 25, 0})
	check("overflow badly re-delivers from 0", 30, want{OffsetOverflowBadly, 0, 0})

	g := get(t, s, "nope", 0, 5, 32, 0, nil)
	assert.Equal(t, NoMatchedLogicQueue, g.Status)
	assert.Equal(t, int64(0), g.NextBeginOffset)

	empty, err := s.queueOrCreate([]byte("E"), 3)
	require.NoError(t, err)
	_ = empty
	g = get(t, s, "E", 3, 7, 32, 0, nil)
	assert.Equal(t, NoMessageInQueue, g.Status)
	assert.Equal(t, int64(0), g.NextBeginOffset)

	g = get(t, s, "T", 0, 0, 32, 0, tagsOf("b"))
	assert.Equal(t, NoMatchedMessage, g.Status)
	assert.Equal(t, int64(10), g.NextBeginOffset)
	assert.Empty(t, g.Messages)

	// OFFSET_FOUND_NULL: the file holding the offset is gone (as retention leaves it
	// for a moment before min moves).
	q := s.queue("T", 0)
	q.mu.Lock()
	first := q.files[0]
	q.files = q.files[1:]
	q.mu.Unlock()
	check("found null", 3, want{OffsetFoundNull, 10, 0})
	q.mu.Lock()
	q.files = append([]*cqFile{first}, q.files...)
	q.mu.Unlock()

	// OFFSET_TOO_SMALL once min moved.
	q.min.Store(5)
	check("too small", 2, want{OffsetTooSmall, 5, 0})
	check("overflow badly once the head is gone", 30, want{OffsetOverflowBadly, 25, 0})
	q.min.Store(0)

	// MESSAGE_WAS_REMOVING: units point below the commit log's min offset.
	s.minOffset.Store(s.opts.SegmentSize)
	check("was removing", 0, want{MessageWasRemoving, 10, 0})
	s.minOffset.Store(0)
}

func TestStatusStrings(t *testing.T) {
	assert.Equal(t, "OFFSET_FOUND_NULL", OffsetFoundNull.String())
	assert.Equal(t, "NO_MESSAGE_IN_QUEUE", NoMessageInQueue.String())
	assert.Equal(t, "GetStatus(99)", GetStatus(99).String())
	assert.Equal(t, "SYNC_FLUSH", FlushSync.String())
	assert.Equal(t, "FlushMode(7)", FlushMode(7).String())
}

func TestBatchCaps(t *testing.T) {
	o := testOptions()
	s := openT(t, t.TempDir(), o)
	defer s.Close()
	putN(t, s, "T", 0, 100, "")
	big := newMsg("T", 1, strings.Repeat("x", 100<<10), "")
	big.Properties = nil
	for range 5 {
		_, err := s.Put(context.Background(), big)
		require.NoError(t, err)
	}
	waitDispatch(t, s)
	size := int(s.queueUnitSize(t, "T", 0, 0))

	g := get(t, s, "T", 0, 0, 10, 0, nil)
	assert.Len(t, g.Messages, 10)
	assert.Equal(t, int64(10), g.NextBeginOffset)
	assert.Equal(t, 10*size, g.TotalBytes)

	g = get(t, s, "T", 0, 0, 0, 0, nil)
	assert.Len(t, g.Messages, 1, "maxMsgs 0 reads one")

	g = get(t, s, "T", 0, 0, 64, 0, nil)
	assert.Len(t, g.Messages, 32, "in-memory count cap")
	assert.Equal(t, int64(32), g.NextBeginOffset)
	assert.False(t, g.InDisk)

	g = get(t, s, "T", 0, 0, 64, 3*size+1, nil)
	assert.Len(t, g.Messages, 3, "byte cap")
	g = get(t, s, "T", 0, 0, 64, 1, nil)
	assert.Len(t, g.Messages, 1, "first message always taken")

	g = get(t, s, "T", 1, 0, 64, 0, nil)
	assert.Len(t, g.Messages, 2, "256 KiB in-memory byte cap")

	s.opts.MemoryBudget = 1 // everything is "on disk" now
	g = get(t, s, "T", 0, 0, 64, 0, nil)
	assert.Len(t, g.Messages, 8, "on-disk count cap")
	assert.True(t, g.InDisk, "the batch's messages lie beyond the budget")
	r, err := s.GetRegions(context.Background(), "T", 0, 0, 64, 0, nil)
	require.NoError(t, err)
	assert.True(t, r.InDisk, "GetRegions says so too")
	r.Release()
	g = get(t, s, "T", 1, 0, 64, 0, nil)
	assert.Len(t, g.Messages, 1, "64 KiB on-disk byte cap; first always taken")
}

func (s *Store) queueUnitSize(t testing.TB, topic string, qid int32, idx int64) int32 {
	_, size, _, err := s.queue(topic, qid).unitAt(idx)
	require.NoError(t, err)
	return size
}

func TestScanLimitAndFilters(t *testing.T) {
	s := openT(t, t.TempDir(), testOptions())
	defer s.Close()
	for i := range 1000 {
		tag := "skip"
		if i%100 == 99 {
			tag = "want"
		}
		_, err := s.Put(context.Background(), newMsg("T", 0, fmt.Sprint(i), tag))
		require.NoError(t, err)
	}
	waitDispatch(t, s)

	// A scan reads at most 16000 bytes (800 units) of consume queue.
	g := get(t, s, "T", 0, 0, 32, 0, tagsOf("none"))
	assert.Equal(t, NoMatchedMessage, g.Status)
	assert.Equal(t, int64(800), g.NextBeginOffset)
	g = get(t, s, "T", 0, 0, 1000, 0, tagsOf("none"))
	assert.Equal(t, int64(1000), g.NextBeginOffset, "maxMsgs×20 when larger")

	g = get(t, s, "T", 0, 0, 32, 0, tagsOf("want"))
	assert.Equal(t, Found, g.Status)
	ms := decodeAll(t, g)
	require.Len(t, ms, 8)
	assert.Equal(t, "99", string(ms[0].Body))
	assert.Equal(t, int64(800), g.NextBeginOffset)

	// The message filter sees the stored bytes of the units that pass the tag codes, a
	// window at a time: the first window is what the batch can take (5), and each window
	// that leaves room doubles (10, 4×4, 2×8, 1×8).
	f := tagsOf("skip", "want")
	cf := &countingFilter{match: func(c Candidate) bool {
		props, err := StoredProperties(c.Stored)
		require.NoError(t, err)
		v, _ := protocol.FindProperty(props, protocol.PropertyUniqueKey)
		return strings.HasSuffix(string(v), "7")
	}}
	f.Match = cf
	g = get(t, s, "T", 0, 0, 5, 0, f)
	ms = decodeAll(t, g)
	require.Len(t, ms, 5)
	for i, m := range ms {
		assert.Equal(t, fmt.Sprint(i*10+7), string(m.Body))
	}
	assert.Equal(t, int64(55), g.NextBeginOffset, "48..54 were evaluated in the last window and rejected")
	assert.Equal(t, int64(5), cf.calls.Load())
	assert.Equal(t, int64(55), cf.seen.Load())

	f.Match = &countingFilter{match: func(Candidate) bool { return false }}
	g = get(t, s, "T", 0, 990, 32, 0, f)
	assert.Equal(t, NoMatchedMessage, g.Status)
	assert.Equal(t, int64(1000), g.NextBeginOffset)
}

func TestInterleavedQueues(t *testing.T) {
	s := openT(t, t.TempDir(), testOptions())
	defer s.Close()
	for i := range 200 {
		_, err := s.Put(context.Background(), newMsg("T", int32(i%4), fmt.Sprint(i), ""))
		require.NoError(t, err)
	}
	waitDispatch(t, s)
	for qid := range int32(4) {
		g := get(t, s, "T", qid, 3, 32, 0, nil)
		ms := decodeAll(t, g)
		require.Len(t, ms, 32)
		for j, m := range ms {
			assert.Equal(t, fmt.Sprint((3+j)*4+int(qid)), string(m.Body))
		}
		g.Release()
	}
	checkConsistent(t, s)
}

func TestOffsetByTimestamp(t *testing.T) {
	o := testOptions()
	var now atomic.Int64
	now.Store(1_000_000)
	o.Now = func() time.Time { return time.UnixMilli(now.Load()) }
	s := openT(t, t.TempDir(), o)
	defer s.Close()
	for i := range 10 {
		now.Store(1_000_000 + int64(i)*1000)
		putN(t, s, "T", 0, 2, "") // two messages per second: offsets 2i, 2i+1
	}
	waitDispatch(t, s)
	assert.Equal(t, int64(0), s.OffsetByTimestamp("T", 0, 0))
	assert.Equal(t, int64(0), s.OffsetByTimestamp("T", 0, 1_000_000))
	assert.Equal(t, int64(2), s.OffsetByTimestamp("T", 0, 1_000_001))
	assert.Equal(t, int64(6), s.OffsetByTimestamp("T", 0, 1_003_000))
	assert.Equal(t, int64(18), s.OffsetByTimestamp("T", 0, 1_009_000))
	assert.Equal(t, int64(20), s.OffsetByTimestamp("T", 0, 1_009_001), "after the last: max")
	assert.Equal(t, int64(0), s.OffsetByTimestamp("nope", 0, 5))
	ts, err := s.StoreTimeAt("T", 0, 7)
	require.NoError(t, err)
	assert.Equal(t, int64(1_003_000), ts)
	_, err = s.StoreTimeAt("T", 0, 20)
	assert.ErrorIs(t, err, ErrNotFound)

	// A clock going backwards does not break the order.
	now.Store(5)
	r := putN(t, s, "T", 0, 1, "")
	assert.Equal(t, int64(1_009_000), r[0].StoreTimestamp)
}

func TestMessageAt(t *testing.T) {
	s := openT(t, t.TempDir(), testOptions())
	defer s.Close()
	res := putN(t, s, "T", 0, 3, "tg")
	b, err := s.MessageAt(res[1].CommitLogOffset)
	require.NoError(t, err)
	m, _, err := protocol.DecodeStored(b)
	require.NoError(t, err)
	assert.Equal(t, "T-0-body-1", string(m.Body))
	assert.Equal(t, "tg", m.Properties[protocol.PropertyTags])
	for _, off := range []int64{-1, res[1].CommitLogOffset + 1, res[2].CommitLogOffset + int64(res[2].Size), 1 << 40} {
		_, err = s.MessageAt(off)
		assert.ErrorIs(t, err, ErrNotFound, off)
	}
}

func TestSegmentRoll(t *testing.T) {
	dir := t.TempDir()
	o := testOptions()
	o.SegmentSize = 4096
	s := openT(t, dir, o)
	var res []PutResult
	for i := range 60 {
		r, err := s.Put(context.Background(), newMsg("T", int32(i%2), strings.Repeat("b", 100+i), ""))
		require.NoError(t, err)
		res = append(res, r)
	}
	st := s.Stats()
	assert.Greater(t, st.Segments, 3)
	// No message spans a segment.
	for _, r := range res {
		assert.Equal(t, r.CommitLogOffset/4096, (r.CommitLogOffset+int64(r.Size)-1)/4096, r)
	}
	// The first segment ends with the blank marker.
	var last PutResult
	for _, r := range res {
		if r.CommitLogOffset < 4096 {
			last = r
		}
	}
	tail := last.CommitLogOffset + int64(last.Size)
	b, err := os.ReadFile(filepath.Join(dir, "commitlog", "00000000000000000000"))
	require.NoError(t, err)
	require.Len(t, b, 4096)
	assert.Equal(t, uint32(4096-tail), binary.BigEndian.Uint32(b[tail:]))
	assert.Equal(t, uint32(protocol.MagicBlank), binary.BigEndian.Uint32(b[tail+4:]))
	_, err = os.Stat(filepath.Join(dir, "commitlog", "00000000000000004096"))
	require.NoError(t, err)
	waitDispatch(t, s)
	checkConsistent(t, s)
	g := get(t, s, "T", 0, 0, 64, 0, nil)
	assert.Len(t, g.Messages, 30)
	require.NoError(t, s.Close())

	s = openT(t, dir, o)
	defer s.Close()
	checkConsistent(t, s)
	assert.Equal(t, int64(30), s.MaxOffset("T", 1))
	assert.Equal(t, st.CommitLogMaxOffset, s.Stats().CommitLogMaxOffset)
}

func TestPutBatch(t *testing.T) {
	o := testOptions()
	o.FlushMode = FlushSync
	s := openT(t, t.TempDir(), o)
	defer s.Close()
	var ms []*protocol.MessageExt
	for i := range 20 {
		ms = append(ms, newMsg("B", 2, fmt.Sprint(i), ""))
	}
	res, err := s.PutBatch(context.Background(), ms)
	require.NoError(t, err)
	require.Len(t, res, 20)
	for i, r := range res {
		assert.Equal(t, int64(i), r.QueueOffset)
		if i > 0 {
			assert.Equal(t, res[i-1].CommitLogOffset+int64(res[i-1].Size), r.CommitLogOffset)
		}
	}
	assert.GreaterOrEqual(t, s.Stats().FlushedOffset, res[19].CommitLogOffset+int64(res[19].Size))
	waitDispatch(t, s)
	checkConsistent(t, s)
	res, err = s.PutBatch(context.Background(), nil)
	assert.NoError(t, err)
	assert.Empty(t, res)
}

func TestOnDispatchAndDeleteTopic(t *testing.T) {
	o := testOptions()
	var mu sync.Mutex
	var evs []DispatchEvent
	o.OnDispatch = func(e DispatchEvent) {
		mu.Lock()
		evs = append(evs, e)
		mu.Unlock()
	}
	dir := t.TempDir()
	s := openT(t, dir, o)
	defer s.Close()
	res := putN(t, s, "D", 1, 3, "red")
	waitDispatch(t, s)
	mu.Lock()
	got := append([]DispatchEvent(nil), evs...)
	mu.Unlock()
	require.Len(t, got, 3)
	e := got[2]
	assert.Equal(t, DispatchEvent{Topic: "D", QueueID: 1, QueueOffset: 2, CommitLogOffset: res[2].CommitLogOffset,
		Size: res[2].Size, TagsCode: protocol.TagsCode("red"), StoreTimestamp: res[2].StoreTimestamp}, e)

	require.NoError(t, s.DeleteTopic("D"))
	assert.Empty(t, s.Queues())
	assert.Equal(t, int64(0), s.MaxOffset("D", 1))
	_, err := os.Stat(filepath.Join(dir, "consumequeue", "D"))
	assert.True(t, os.IsNotExist(err))
	r := putN(t, s, "D", 1, 1, "")
	assert.Equal(t, int64(0), r[0].QueueOffset)
	waitDispatch(t, s)
	checkConsistent(t, s)
}

func TestRetention(t *testing.T) {
	dir := t.TempDir()
	o := testOptions()
	o.SegmentSize = 4096
	o.ConsumeQueueUnits = 8
	var now atomic.Int64
	now.Store(time.Now().UnixMilli())
	o.Now = func() time.Time { return time.UnixMilli(now.Load()) }
	o.Retention = time.Hour
	ffs := vfs.NewFaultFS(nil)
	ffs.SetDiskUsage(vfs.Usage{Total: 100 << 10, Free: 90 << 10})
	o.FS = ffs
	o.MaxDiskUsage = 0.5
	s := openT(t, dir, o)
	defer s.Close()
	for i := range 100 {
		_, err := s.Put(context.Background(), newMsg("T", 0, strings.Repeat("r", 200)+fmt.Sprint(i), ""))
		require.NoError(t, err)
	}
	waitDispatch(t, s)
	require.NoError(t, s.flushCommitLog())
	before := s.Stats()

	require.NoError(t, s.clean())
	assert.Equal(t, before.Segments, s.Stats().Segments, "nothing expired")

	ffs.SetDiskUsage(vfs.Usage{Total: 100 << 10, Free: 100<<10 - 58<<10}) // 58 % used: delete 2 segments of 4 KiB
	require.NoError(t, s.clean())
	st := s.Stats()
	assert.Equal(t, before.Segments-2, st.Segments)
	assert.Equal(t, int64(2*4096), st.CommitLogMinOffset)
	ffs.SetDiskUsage(vfs.Usage{Total: 100 << 10, Free: 90 << 10})

	q := s.queue("T", 0)
	min1 := q.min.Load()
	assert.Greater(t, min1, int64(0))
	off, _, _, err := q.unitAt(min1)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, off, st.CommitLogMinOffset)
	g := get(t, s, "T", 0, 0, 32, 0, nil)
	assert.Equal(t, OffsetTooSmall, g.Status)
	assert.Equal(t, min1, g.NextBeginOffset)
	g = get(t, s, "T", 0, min1, 32, 0, nil)
	assert.Equal(t, Found, g.Status)

	// Age: everything but the active segment expires.
	now.Add(2 * time.Hour.Milliseconds())
	require.NoError(t, s.clean())
	assert.Equal(t, 1, s.Stats().Segments)
	// Consume-queue files wholly below the new min were removed.
	cqFiles, err := os.ReadDir(filepath.Join(dir, "consumequeue", "T", "0"))
	require.NoError(t, err)
	first, _ := parseOffsetName(cqFiles[0].Name())
	assert.LessOrEqual(t, first/cqUnitSize, q.min.Load())
	assert.Greater(t, first/cqUnitSize+8, q.min.Load())
	checkConsistent(t, s)
	require.NoError(t, s.Close())

	s2 := openT(t, dir, o)
	defer s2.Close()
	assert.Equal(t, q.min.Load(), s2.MinOffset("T", 0))
	assert.Equal(t, int64(100), s2.MaxOffset("T", 0))
	checkConsistent(t, s2)
}

func TestConcurrentPutGet(t *testing.T) {
	o := testOptions()
	o.SegmentSize = 64 << 10
	o.FlushMode = FlushSync
	s := openT(t, t.TempDir(), o)
	defer s.Close()
	const writers, per = 4, 150
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				var err error
				if i%10 == 0 {
					_, err = s.PutBatch(context.Background(), []*protocol.MessageExt{newMsg("C", int32(w%2), "b1", "x"), newMsg("C", int32(w%2), "b2", "y")})
				} else {
					_, err = s.Put(context.Background(), newMsg("C", int32(w%2), fmt.Sprint(i), "x"))
				}
				if !assert.NoError(t, err) {
					return
				}
			}
		}()
	}
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for r := range 2 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			var next int64
			for {
				select {
				case <-stop:
					return
				default:
				}
				g, err := s.GetMessage(context.Background(), "C", int32(r), next, 32, 0, tagsOf("x", "y"))
				if !assert.NoError(t, err) {
					return
				}
				for _, b := range g.Messages {
					m, _, err := protocol.DecodeStored(b)
					if !assert.NoError(t, err) || !assert.Equal(t, next, m.QueueOffset) {
						return
					}
					next++
				}
				if g.Status == Found {
					assert.Equal(t, next, g.NextBeginOffset)
				}
				g.Release()
				_ = s.Stats()
			}
		}()
	}
	wg.Wait()
	waitDispatch(t, s)
	close(stop)
	readers.Wait()
	assert.Equal(t, int64(2*per*11/10*1), s.MaxOffset("C", 0))
	checkConsistent(t, s)
}

func TestSyncFlushTimeoutAndCancel(t *testing.T) {
	o := testOptions()
	o.FlushMode = FlushSync
	o.SyncFlushTimeout = 250 * time.Millisecond // room for the last Put's fsync on a busy disk
	s := openT(t, t.TempDir(), o)
	defer s.Close()
	s.flushRun.Lock() // an fsync that never ends
	_, err := s.Put(context.Background(), newMsg("T", 0, "x", ""))
	assert.ErrorIs(t, err, ErrFlushTimeout)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = s.Put(ctx, newMsg("T", 0, "y", ""))
	assert.ErrorIs(t, err, context.Canceled)
	s.flushRun.Unlock()
	_, err = s.Put(context.Background(), newMsg("T", 0, "z", ""))
	assert.NoError(t, err)
	assert.Equal(t, int64(3), s.queueOffsetNext("T", 0))
}

func (s *Store) queueOffsetNext(topic string, qid int32) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queueOffsetLocked(qkey{topic, qid})
}

var _ = errors.Is

func TestHalfMessagesAreNeverStored(t *testing.T) {
	s := openT(t, t.TempDir(), testOptions())
	defer s.Close()
	for _, flag := range []int32{protocol.MsgTransactionPrepared, protocol.MsgTransactionRollback} {
		m := newMsg("T", 0, "half", "")
		m.SysFlag = flag
		_, err := s.Put(context.Background(), m)
		assert.ErrorIs(t, err, ErrHalfMessage)
		_, err = s.PutBatch(context.Background(), []*protocol.MessageExt{newMsg("T", 0, "ok", ""), m})
		assert.ErrorIs(t, err, ErrHalfMessage)
	}
	r, err := s.Put(context.Background(), newMsg("T", 0, "normal", ""))
	require.NoError(t, err)
	assert.Equal(t, int64(0), r.QueueOffset, "nothing was stored before")
	assert.Equal(t, int64(0), r.CommitLogOffset)
}

// A pass over dispatchBatchBytes or more makes the dispatcher hold back for
// dispatchBatchWait, unless a reader waits for the next message (Options.DispatchAwaited):
// then the next append is dispatched at once. Whether it held is read from the hold count
// after the next pass, which comes only after the decision about the busy one.
func TestDispatchHoldsBackOnlyWhenNobodyWaits(t *testing.T) {
	o := testOptions()
	var awaited atomic.Bool
	o.DispatchAwaited = awaited.Load
	s := openT(t, t.TempDir(), o)
	defer s.Close()
	busyThenSmall := func() {
		t.Helper()
		m := newMsg("H", 0, "big", "")
		m.Body = make([]byte, dispatchBatchBytes+1024) // one message makes a busy pass
		_, err := s.Put(context.Background(), m)
		require.NoError(t, err)
		waitDispatch(t, s)
		putN(t, s, "H", 0, 1, "")
		waitDispatch(t, s)
	}

	busyThenSmall()
	require.Equal(t, int64(1), s.dispatchHolds.Load(), "nobody waits: the busy pass is followed by a hold")

	awaited.Store(true)
	busyThenSmall()
	require.Equal(t, int64(1), s.dispatchHolds.Load(), "a reader waits: no hold after the busy pass")
	assert.Equal(t, int64(4), s.MaxOffset("H", 0))
}

// TestTopicOKMemo: the memo of the last valid topic never lets an invalid one through.
func TestTopicOKMemo(t *testing.T) {
	s := openT(t, t.TempDir(), testOptions())
	defer s.Close()
	assert.True(t, s.topicOK("T1"))
	assert.True(t, s.topicOK("T1"), "the memo's hit")
	assert.False(t, s.topicOK("T1/.."))
	assert.False(t, s.topicOK(""))
	assert.True(t, s.topicOK("T2"))
	assert.False(t, s.topicOK(strings.Repeat("x", protocol.MaxTopicLength+1)))
	assert.True(t, s.topicOK("T1"))
}

// The memory budget is InMemoryMaxRatio (RocketMQ's accessMessageInMemoryMaxRatio, 40 by
// default) percent of Memory (the machine's by default), unless MemoryBudget is set.
func TestMemoryBudgetIsTheRatioOfMemory(t *testing.T) {
	o, err := Options{Memory: 1000}.withDefaults()
	require.NoError(t, err)
	assert.Equal(t, int64(400), o.MemoryBudget)
	o, err = Options{Memory: 1000, InMemoryMaxRatio: 10}.withDefaults()
	require.NoError(t, err)
	assert.Equal(t, int64(100), o.MemoryBudget)
	o, err = Options{Memory: 1000, MemoryBudget: 7}.withDefaults()
	require.NoError(t, err)
	assert.Equal(t, int64(7), o.MemoryBudget, "a budget set wins")
	o, err = Options{}.withDefaults()
	require.NoError(t, err)
	assert.Equal(t, o.Memory*40/100, o.MemoryBudget)
	assert.Positive(t, o.Memory)
	_, err = Options{InMemoryMaxRatio: 101}.withDefaults()
	require.Error(t, err)
}
