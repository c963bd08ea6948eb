package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/flowd-io/flowd/protocol"
)

// regionBytes concatenates r's regions read with ReadAt (from the mapping of the active
// segment, else pread).
func regionBytes(t testing.TB, r *GetResult) []byte {
	t.Helper()
	var out []byte
	for _, g := range r.Regions {
		b := make([]byte, g.Length)
		n, err := g.File.ReadAt(b, g.Offset)
		require.NoError(t, err)
		require.Equal(t, len(b), n)
		out = append(out, b...)
	}
	return out
}

// regionBytesFromFile concatenates r's regions read from the segment files' descriptors with
// pread: through the page cache, which is what sendfile reads, never through the mapping.
func regionBytesFromFile(t testing.TB, r *GetResult) []byte {
	t.Helper()
	var out []byte
	for _, g := range r.Regions {
		rc, err := g.File.SyscallConn()
		require.NoError(t, err)
		b := make([]byte, g.Length)
		var n int
		var rerr error
		require.NoError(t, rc.Control(func(fd uintptr) { n, rerr = syscall.Pread(int(fd), b, g.Offset) }))
		require.NoError(t, rerr)
		require.Equal(t, len(b), n)
		out = append(out, b...)
	}
	return out
}

func getRegions(t testing.TB, s *Store, topic string, qid int32, off int64, maxMsgs, maxBytes int, f *Filter) *GetResult {
	t.Helper()
	r, err := s.GetRegions(context.Background(), topic, qid, off, maxMsgs, maxBytes, f)
	require.NoError(t, err)
	return r
}

// TestGetRegionsMatchesGetMessage reads every queue from every offset both ways, over many
// segment boundaries, with and without a tag filter and byte caps, in each write mode: the
// regions must select the same messages and hold byte for byte what GetMessage copies.
func TestGetRegionsMatchesGetMessage(t *testing.T) {
	modes := map[string]func(*Options){
		"async-mmap": func(o *Options) {},
		"async-pwrite": func(o *Options) {
			o.DisableMmap = true
		},
		"sync": func(o *Options) { o.FlushMode = FlushSync },
		"fault-vfs": func(o *Options) {
			o.FS = vfs.NewFaultFS(nil)
		},
	}
	for name, mod := range modes {
		t.Run(name, func(t *testing.T) {
			o := testOptions()
			o.SegmentSize = 4096 // a few messages per segment: many boundaries
			mod(&o)
			s := openT(t, t.TempDir(), o)
			defer s.Close()
			tags := []string{"a", "b", "c"}
			for i := range 300 {
				qid := int32(i % 3)
				if i%7 == 0 {
					qid = 0 // runs of adjacent messages in queue 0
				}
				body := fmt.Sprintf("m%d-%s", i, strings.Repeat("x", (i*37)%400))
				_, err := s.Put(context.Background(), newMsg("T", qid, body, tags[i%len(tags)]))
				require.NoError(t, err)
			}
			waitDispatch(t, s)
			require.Greater(t, s.Stats().Segments, 20)
			_, fault := o.FS.(*vfs.FaultFS)
			filters := []*Filter{nil, tagsOf("a"), tagsOf("b", "c"), tagsOf("none")}
			for qid := range int32(3) {
				hi := s.MaxOffset("T", qid)
				for _, f := range filters {
					for _, caps := range [][2]int{{32, 0}, {5, 1500}, {1, 0}} {
						for off := int64(0); off <= hi; off++ {
							want := get(t, s, "T", qid, off, caps[0], caps[1], f)
							got := getRegions(t, s, "T", qid, off, caps[0], caps[1], f)
							at := fmt.Sprintf("queue %d offset %d filter %v caps %v", qid, off, f, caps)
							require.Equal(t, want.Status, got.Status, at)
							require.Equal(t, want.NextBeginOffset, got.NextBeginOffset, at)
							require.Equal(t, len(want.Messages), got.Count, at)
							require.Equal(t, want.TotalBytes, got.TotalBytes, at)
							require.Nil(t, got.Messages, at)
							body := bytes.Join(want.Messages, nil)
							require.True(t, bytes.Equal(body, regionBytes(t, got)), at)
							if fault {
								for _, g := range got.Regions {
									_, err := g.File.SyscallConn()
									require.ErrorIs(t, err, ErrNoDescriptor, "the fault vfs exposes no descriptor: callers copy")
								}
							} else if len(got.Regions) > 0 {
								require.True(t, bytes.Equal(body, regionBytesFromFile(t, got)), at)
							}
							want.Release()
							got.Release()
						}
					}
				}
			}
		})
	}
}

// TestGetRegionsWithContentFilterCopies: a filter on the content needs the bytes, so
// GetRegions reads them as GetMessage does.
func TestGetRegionsWithContentFilterCopies(t *testing.T) {
	s := openT(t, t.TempDir(), testOptions())
	defer s.Close()
	putN(t, s, "T", 0, 10, "a")
	waitDispatch(t, s)
	f := &Filter{Match: &countingFilter{match: func(c Candidate) bool { return c.QueueOffset%2 == 0 }}}
	got := getRegions(t, s, "T", 0, 0, 32, 0, f)
	defer got.Release()
	assert.Nil(t, got.Regions)
	require.Len(t, got.Messages, 5)
	assert.Equal(t, 5, got.Count)
}

// TestRegionsOutliveRetention: a region handed out before retention deletes its segment
// still reads the right bytes (the file is unlinked but stays open) until Release, which
// closes it; later reads answer as for removed data.
func TestRegionsOutliveRetention(t *testing.T) {
	dir := t.TempDir()
	o := testOptions()
	o.SegmentSize = 4096
	o.ConsumeQueueUnits = 8
	var now atomic.Int64
	now.Store(time.Now().UnixMilli())
	o.Now = func() time.Time { return time.UnixMilli(now.Load()) }
	o.Retention = time.Hour
	s := openT(t, dir, o)
	defer s.Close()
	for i := range 60 {
		_, err := s.Put(context.Background(), newMsg("T", 0, strings.Repeat("r", 200)+fmt.Sprint(i), ""))
		require.NoError(t, err)
	}
	waitDispatch(t, s)
	require.NoError(t, s.flushCommitLog())
	want := get(t, s, "T", 0, 0, 32, 0, nil)
	defer want.Release()
	held := getRegions(t, s, "T", 0, 0, 32, 0, nil)
	require.Equal(t, Found, held.Status)
	first := held.Regions[0].File.(*segment)
	require.Equal(t, int64(0), first.start)

	now.Add(2 * time.Hour.Milliseconds())
	require.NoError(t, s.clean())
	require.Equal(t, 1, s.Stats().Segments, "every segment but the active one is gone")
	_, err := os.Stat(first.path)
	require.ErrorIs(t, err, os.ErrNotExist, "the segment file was unlinked")

	body := bytes.Join(want.Messages, nil)
	assert.Equal(t, body, regionBytes(t, held), "pinned regions keep their bytes")
	assert.Equal(t, body, regionBytesFromFile(t, held))

	held.Release()
	_, err = first.ReadAt(make([]byte, 8), 0)
	assert.Error(t, err, "released: the deleted segment's file is closed")
	g := getRegions(t, s, "T", 0, 0, 32, 0, nil)
	assert.Equal(t, OffsetTooSmall, g.Status)
	assert.Empty(t, g.Regions)
	held.Release() // idempotent
}

// TestRegionsConcurrentWithRetention reads regions while retention deletes the oldest
// segments under the readers: each read gives either stored messages with their right bytes
// or a status saying the data moved, never other bytes, and nothing crashes.
func TestRegionsConcurrentWithRetention(t *testing.T) {
	testReadsConcurrentWithRetention(t, true)
}

// TestGetMessageConcurrentWithRetention is TestRegionsConcurrentWithRetention for the copy
// path (GetMessage).
func TestGetMessageConcurrentWithRetention(t *testing.T) {
	testReadsConcurrentWithRetention(t, false)
}

func testReadsConcurrentWithRetention(t *testing.T, regions bool) {
	o := testOptions()
	o.SegmentSize = 4096
	o.ConsumeQueueUnits = 16
	// Disk usage just over the limit by less than a segment: each clean deletes one segment.
	ffs := vfs.NewFaultFS(nil)
	ffs.SetDiskUsage(vfs.Usage{Total: 100 << 10, Free: 100<<10 - (54<<10 - 1)})
	o.FS = ffs
	o.MaxDiskUsage = 0.5
	s := openT(t, t.TempDir(), o)
	defer s.Close()
	const n = 400
	bodies := make([][]byte, n) // the stored bytes of each queue offset
	for i := range n {
		_, err := s.Put(context.Background(), newMsg("T", 0, fmt.Sprintf("%03d-%s", i, strings.Repeat("q", 150)), ""))
		require.NoError(t, err)
	}
	waitDispatch(t, s)
	require.NoError(t, s.flushCommitLog())
	for i := range n {
		g := get(t, s, "T", 0, int64(i), 1, 0, nil)
		require.Equal(t, Found, g.Status)
		bodies[i] = bytes.Clone(g.Messages[0])
		g.Release()
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var found, moved, gaps atomic.Int64
	errs := make(chan error, 4)
	for r := range 4 {
		wg.Go(func() {
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				off := int64((k*13 + r*101) % n)
				var g *GetResult
				var err error
				if regions {
					g, err = s.GetRegions(context.Background(), "T", 0, off, 32, 0, nil)
				} else {
					g, err = s.GetMessage(context.Background(), "T", 0, off, 32, 0, nil)
				}
				if err != nil {
					errs <- err
					return
				}
				if g.Status != Found {
					moved.Add(1)
					g.Release()
					continue
				}
				msgs := g.Messages
				if regions {
					msgs, err = splitRegions(g)
				}
				if err == nil {
					err = checkBatch(g, msgs, off, bodies, s.minOffset.Load(), &gaps)
				}
				g.Release()
				if err != nil {
					errs <- err
					return
				}
				found.Add(1)
			}
		})
	}
	// Delete the log from its start, one segment at a time, while the readers run.
	for s.Stats().Segments > 1 {
		// Let the readers take messages of the oldest segment first.
		require.Eventually(t, func() bool { return found.Load() >= 20 || len(errs) > 0 }, 10*time.Second, time.Millisecond)
		if len(errs) > 0 {
			break
		}
		found.Store(0)
		segs := s.Stats().Segments
		require.NoError(t, s.clean())
		require.Equal(t, segs-1, s.Stats().Segments)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	files, err := os.ReadDir(filepath.Join(s.dir, "commitlog"))
	require.NoError(t, err)
	assert.Len(t, files, 1)
	assert.Positive(t, moved.Load(), "some reads found their data deleted")
	t.Logf("batches that passed over removed messages: %d", gaps.Load())
}

// splitRegions reads g's regions (pinned, so readable even once retention deleted their
// segment) and cuts them into the stored messages they hold, by each one's total size.
func splitRegions(g *GetResult) ([][]byte, error) {
	var got []byte
	for _, reg := range g.Regions {
		b := make([]byte, reg.Length)
		if _, err := reg.File.ReadAt(b, reg.Offset); err != nil {
			return nil, fmt.Errorf("read pinned region: %w", err)
		}
		got = append(got, b...)
	}
	if len(got) != g.TotalBytes {
		return nil, fmt.Errorf("regions hold %d bytes, TotalBytes says %d", len(got), g.TotalBytes)
	}
	var msgs [][]byte
	for len(got) > 0 {
		if len(got) < protocol.StoredPhysicalOffsetAt+8 {
			return nil, fmt.Errorf("regions end in %d bytes, not a message", len(got))
		}
		size := int(binary.BigEndian.Uint32(got[protocol.StoredTotalSizeAt:]))
		if size < protocol.StoredPhysicalOffsetAt+8 || size > len(got) {
			return nil, fmt.Errorf("regions hold a message of size %d with %d bytes left", size, len(got))
		}
		msgs = append(msgs, got[:size])
		got = got[size:]
	}
	return msgs, nil
}

// checkBatch checks a Found batch that a read from queue offset off answered: its Count
// messages are, in order, stored messages of increasing queue offsets in [off,
// NextBeginOffset) with their stored bytes. A queue offset the batch passes over (a read
// skips the rest of a segment that retention removed under it, and may take later messages
// after it, as RocketMQ does) must be one whose message is really gone: its commit-log
// offset is below logMin, the log's start read after the batch. gaps counts batches with a
// hole between two of their messages.
func checkBatch(g *GetResult, msgs [][]byte, off int64, bodies [][]byte, logMin int64, gaps *atomic.Int64) error {
	if len(msgs) != g.Count || g.Count == 0 {
		return fmt.Errorf("offset %d: %d messages, Count %d", off, len(msgs), g.Count)
	}
	next := off // the first queue offset not yet accounted for
	for k, m := range msgs {
		qo := int64(binary.BigEndian.Uint64(m[protocol.StoredQueueOffsetAt:]))
		if qo < next || qo >= g.NextBeginOffset || qo >= int64(len(bodies)) {
			return fmt.Errorf("offset %d: message %d has queue offset %d, outside [%d, %d)", off, k, qo, next, g.NextBeginOffset)
		}
		if !bytes.Equal(m, bodies[qo]) {
			return fmt.Errorf("offset %d: message %d (queue offset %d) holds other bytes than stored", off, k, qo)
		}
		if err := passedOver(bodies, next, qo, logMin, off); err != nil {
			return err
		}
		if k > 0 && qo > next {
			gaps.Add(1)
		}
		next = qo + 1
	}
	return passedOver(bodies, next, g.NextBeginOffset, logMin, off)
}

// passedOver checks that the messages of queue offsets [from, to) are below logMin.
func passedOver(bodies [][]byte, from, to, logMin, off int64) error {
	for j := from; j < to; j++ {
		if phy := int64(binary.BigEndian.Uint64(bodies[j][protocol.StoredPhysicalOffsetAt:])); phy >= logMin {
			return fmt.Errorf("offset %d: queue offset %d (log offset %d) passed over, but the log starts at %d", off, j, phy, logMin)
		}
	}
	return nil
}
