//go:build linux

package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/flowd-io/flowd/protocol"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mappedPages counts the pages of m that are present in this process's page tables
// (/proc/self/pagemap, bit 63), that is, faulted in: a page only in the page cache (read
// ahead, say) is not counted.
func mappedPages(t *testing.T, m []byte) (present, total int) {
	t.Helper()
	f, err := os.Open("/proc/self/pagemap")
	require.NoError(t, err)
	defer f.Close()
	page := os.Getpagesize()
	start := uintptr(unsafe.Pointer(unsafe.SliceData(m)))
	total = len(m) / page
	buf := make([]byte, 8*total)
	_, err = f.ReadAt(buf, int64(start/uintptr(page))*8)
	require.NoError(t, err)
	for i := range total {
		if binary.LittleEndian.Uint64(buf[8*i:])>>63 == 1 {
			present++
		}
	}
	return present, total
}

// copyTree copies dir into a new directory the way a crash of the process leaves it: the
// files as the page cache holds them, the abort marker included.
func copyTree(t *testing.T, dir string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if rel == lockFileName {
			return nil
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		out, err := os.Create(filepath.Join(dst, rel))
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, src); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
	require.NoError(t, err)
	return dst
}

// TestPrefaultKeepsPagesAheadMapped: past several prefault steps into a segment, the pages
// just ahead of the write position are mapped (before alignment was fixed, prefaulting
// stopped after its first step), they hold zeros, and a crash with them populated but
// unwritten recovers exactly what was appended.
func TestPrefaultKeepsPagesAheadMapped(t *testing.T) {
	dir := t.TempDir()
	o := testOptions()
	o.SegmentSize = 32 << 20
	o.FlushInterval = time.Hour // the populated zero pages stay dirty in the page cache
	s := openT(t, dir, o)
	defer s.Close()
	seg := s.activeSeg.Load()
	seg.mu.RLock()
	m := seg.m
	seg.mu.RUnlock()
	if m == nil {
		t.Skip("the file system does not support mapping the segment")
	}
	if err := prefault(m[len(m)-prefaultAlign:]); err != nil {
		t.Skipf("the kernel cannot populate a mapping (MADV_POPULATE_WRITE is Linux 5.14+): %v", err)
	}

	msg := benchMsg(1024)
	page := int64(os.Getpagesize())
	var n int64
	var w, from int64
	var ahead []byte
	// Step by step: past each prefaultStep boundary (the write position then unaligned),
	// wait for the prefaulter to populate the pages up to prefaultAhead past it.
	for step := int64(1); step <= 6; step++ {
		for s.written.Load() < step*prefaultStep {
			_, err := s.Put(context.Background(), msg)
			require.NoError(t, err)
			n++
		}
		w = s.written.Load()
		from = (w + page - 1) / page * page
		ahead = m[from : w+prefaultAhead-prefaultAlign]
		require.Eventually(t, func() bool {
			present, total := mappedPages(t, ahead)
			return present == total
		}, 10*time.Second, time.Millisecond, "the %d KiB after the write position %d are mapped", len(ahead)>>10, w)
	}
	for i, b := range ahead {
		if b != 0 {
			require.Failf(t, "populated page not zero", "byte %d past the write position is %d", int64(i)+from-w, b)
		}
	}

	waitDispatch(t, s)
	crashed := copyTree(t, dir)
	o.FlushInterval = testOptions().FlushInterval
	s2 := openT(t, crashed, o)
	defer s2.Close()
	rep := s2.Stats().Recovery
	assert.False(t, rep.Clean, "the copy has the abort marker: recovered as after a crash")
	assert.False(t, rep.Cut, "nothing torn: %s", rep.CutReason)
	assert.Equal(t, w, rep.End)
	assert.Equal(t, w, s2.Stats().CommitLogMaxOffset)
	assert.Equal(t, n, s2.MaxOffset(msg.Topic, msg.QueueID))
	g := get(t, s2, msg.Topic, msg.QueueID, n-3, 32, 0, nil)
	defer g.Release()
	got := decodeAll(t, g)
	require.Len(t, got, 3)
	assert.Equal(t, msg.Body, got[2].Body)
	checkConsistent(t, s2)
	r, err := s2.Put(context.Background(), msg)
	require.NoError(t, err)
	assert.Equal(t, w, r.CommitLogOffset, "appends continue at the recovered end")
}

// allocated is how many bytes of path's blocks the file system has allocated.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	return fi.Sys().(*syscall.Stat_t).Blocks * 512
}

// In FlushSync mode the active segment (written with pwrite, not mapped) is zeroed and
// synced ahead of the write position: its blocks are allocated before appends reach them,
// in the new segment after a roll too. Appends racing with the zeroing keep their bytes.
func TestSyncFlushZeroesAhead(t *testing.T) {
	o := testOptions()
	o.FlushMode = FlushSync
	o.SegmentSize = 8 << 20
	dir := t.TempDir()
	s := openT(t, dir, o)
	defer s.Close()
	first := filepath.Join(dir, commitLogDir, offsetName(0))
	require.Eventually(t, func() bool { return allocated(t, first) >= prefaultAhead }, 10*time.Second, time.Millisecond,
		"the first steps ahead of an empty segment are zeroed")

	// Concurrent appenders through one roll and beyond.
	type put struct {
		res  PutResult
		body string
	}
	var mu sync.Mutex
	var puts []put
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 400 {
				body := fmt.Sprintf("g%d-%d-", g, i) + strings.Repeat("z", 3000)
				r, err := s.Put(context.Background(), newMsg("Z", int32(g), body, ""))
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				puts = append(puts, put{r, body})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Greater(t, s.Stats().Segments, 1)
	for _, p := range puts {
		b, err := s.MessageAt(p.res.CommitLogOffset)
		require.NoError(t, err)
		m, _, err := protocol.DecodeStored(b)
		require.NoError(t, err)
		require.Equal(t, p.body, string(m.Body), "message at %d", p.res.CommitLogOffset)
	}
	seg := s.activeSeg.Load()
	w := s.written.Load() - seg.start
	require.Eventually(t, func() bool { return allocated(t, seg.path) >= w+prefaultAhead-prefaultStep }, 10*time.Second, time.Millisecond,
		"the active segment is zeroed ahead of its write position %d", w)
}

// TestZeroMappedKeepsAppends: the prefaulter writes zeros ahead of the mapped active segment
// with pwrite while eight goroutines append through the mapping, over several rolls; no
// message is overwritten by those zeros, in the running store or after a reopen.
func TestZeroMappedKeepsAppends(t *testing.T) {
	dir := t.TempDir()
	o := testOptions()
	o.SegmentSize = 4 << 20
	s := openT(t, dir, o)
	if s.activeSeg.Load().m == nil {
		t.Skip("segments are not mapped here")
	}
	const writers, each = 8, 2000
	body := strings.Repeat("z", 1000)
	type put struct {
		off  int64
		body string
	}
	got := make([][]put, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				b := fmt.Sprintf("%d-%d-%s", w, i, body)
				r, err := s.Put(context.Background(), newMsg("Z", int32(w), b, ""))
				if !assert.NoError(t, err) {
					return
				}
				got[w] = append(got[w], put{r.CommitLogOffset, b})
			}
		})
	}
	wg.Wait()
	require.Positive(t, s.zeroWrites.Load(), "the prefaulter wrote zeros ahead")
	require.Greater(t, s.Stats().CommitLogMaxOffset, 3*o.SegmentSize, "the appends rolled segments")
	check := func(s *Store) {
		t.Helper()
		for w := range got {
			for _, p := range got[w] {
				raw, err := s.MessageAt(p.off)
				require.NoError(t, err, "message at %d", p.off)
				m, _, err := protocol.DecodeStored(raw)
				require.NoError(t, err)
				require.Equal(t, p.body, string(m.Body), "message at %d", p.off)
			}
		}
		waitDispatch(t, s)
		checkConsistent(t, s)
	}
	check(s)
	require.NoError(t, s.Close())
	s = openT(t, dir, o)
	defer s.Close()
	check(s)
}
