package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/flowd-io/flowd/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func onlyCommitLog(name string) bool { return strings.Contains(name, "/commitlog/") }

// faultCase stores 20 good messages, injects a fault, expects the next Put to fail with
// ErrWriteFailed (and cause), the store to refuse further writes, reads to keep working,
// and a reopen to keep the 20 messages intact.
func faultCase(t *testing.T, mode FlushMode, inject func(*vfs.FaultFS), cause error) {
	dir := t.TempDir()
	ffs := vfs.NewFaultFS(nil)
	ffs.Match(onlyCommitLog)
	o := testOptions()
	o.FS = ffs
	o.FlushMode = mode
	s := openT(t, dir, o)
	good := putN(t, s, "T", 0, 20, "")
	waitDispatch(t, s)
	inject(ffs)
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = s.Put(context.Background(), newMsg("T", 0, strings.Repeat("z", 500), ""))
	}
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrWriteFailed)
	if cause != nil {
		assert.ErrorIs(t, err, cause)
	}
	_, err = s.Put(context.Background(), newMsg("T", 0, "after", ""))
	assert.ErrorIs(t, err, ErrWriteFailed, "later writes are refused")
	_, err = s.PutBatch(context.Background(), []*protocol.MessageExt{newMsg("T", 0, "after", "")})
	assert.ErrorIs(t, err, ErrWriteFailed)
	assert.ErrorIs(t, s.Stats().WriteFailure, ErrWriteFailed)
	g := get(t, s, "T", 0, 0, 32, 0, nil)
	assert.Equal(t, Found, g.Status)
	assert.GreaterOrEqual(t, len(g.Messages), 20)
	s.Close()

	o.FS = nil
	s = openT(t, dir, o)
	defer s.Close()
	assert.False(t, s.Stats().Recovery.Clean, "a failed store keeps its abort marker")
	for i, r := range good {
		b, err := s.MessageAt(r.CommitLogOffset)
		require.NoError(t, err)
		m, _, err := protocol.DecodeStored(b)
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprintf("T-0-body-%d", i), string(m.Body))
	}
	checkConsistent(t, s)
	r := putN(t, s, "T", 0, 1, "")
	assert.GreaterOrEqual(t, r[0].QueueOffset, int64(20))
}

func TestFaultShortWrite(t *testing.T) {
	faultCase(t, FlushAsync, func(f *vfs.FaultFS) { f.ShortWrites(1) }, vfs.ErrInjected)
}

func TestFaultFsyncError(t *testing.T) {
	faultCase(t, FlushSync, func(f *vfs.FaultFS) { f.FailSyncs(syscall.EIO) }, syscall.EIO)
}

func TestFaultDiskFull(t *testing.T) {
	faultCase(t, FlushAsync, func(f *vfs.FaultFS) { f.NoSpaceAfter(1500) }, syscall.ENOSPC)
}

func TestFaultDiskFullAtRoll(t *testing.T) {
	dir := t.TempDir()
	ffs := vfs.NewFaultFS(nil)
	o := testOptions()
	o.SegmentSize = 4096
	o.FS = ffs
	s := openT(t, dir, o)
	defer s.Close()
	ffs.Match(func(name string) bool { return strings.HasSuffix(name, offsetName(4096)) })
	ffs.ShortWrites(1 << 20)
	var err error
	n := 0
	for ; n < 100 && err == nil; n++ {
		_, err = s.Put(context.Background(), newMsg("T", 0, strings.Repeat("q", 300), ""))
	}
	assert.ErrorIs(t, err, ErrWriteFailed)
	assert.Less(t, n, 20)
}

// TestPowerCut simulates losing everything unsynced: with FlushSync, every acknowledged
// message survives; with FlushAsync, the store recovers to a consistent prefix.
func TestPowerCut(t *testing.T) {
	for _, mode := range []FlushMode{FlushSync, FlushAsync} {
		t.Run(mode.String(), func(t *testing.T) {
			dir := t.TempDir()
			ffs := vfs.NewFaultFS(nil)
			ffs.TrackUnsynced()
			o := testOptions()
			o.SegmentSize = 64 << 10
			o.ConsumeQueueUnits = 100
			o.FS = ffs
			o.FlushMode = mode
			s := openT(t, dir, o)
			var mu sync.Mutex
			var acks []ack
			var wg sync.WaitGroup
			stop := make(chan struct{})
			for g := range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), 1))
					for {
						select {
						case <-stop:
							return
						default:
						}
						m := newMsg("K", int32(g), "", "")
						m.Body = make([]byte, 1+rng.IntN(2000))
						for j := range m.Body {
							m.Body[j] = byte(rng.Uint32())
						}
						r, err := s.Put(context.Background(), m)
						if err != nil {
							return
						}
						mu.Lock()
						acks = append(acks, ack{int32(g), r.QueueOffset, r.CommitLogOffset, bodyHash(m.Body)})
						mu.Unlock()
					}
				}()
			}
			s, snapshot := cutPower(t, s, ffs, 300<<10, &mu, &acks, stop, &wg, dir, o)
			if mode == FlushSync {
				verifyAcks(t, s, snapshot)
			}
			checkConsistent(t, s)
		})
	}
}

var _ = errors.Is

// cutPower waits until s has appended size bytes, loses everything unsynced (ffs.Crash)
// and takes the acknowledgements made by then (acks, under mu); then it stops the writers
// (closing stop, waiting for wg), closes s and reopens dir on the real file system. The
// reopened store is closed when the test ends.
func cutPower(t *testing.T, s *Store, ffs *vfs.FaultFS, size int64, mu *sync.Mutex, acks *[]ack,
	stop chan struct{}, wg *sync.WaitGroup, dir string, o Options) (*Store, []ack) {
	t.Helper()
	for s.Stats().CommitLogMaxOffset < size {
		runtimeGosched()
	}
	mu.Lock()
	require.NoError(t, ffs.Crash())
	snapshot := append([]ack(nil), *acks...)
	mu.Unlock()
	close(stop)
	wg.Wait()
	s.Close()

	o.FS = nil
	s = openT(t, dir, o)
	t.Cleanup(func() { s.Close() })
	t.Logf("%d acknowledged; recovery: %+v", len(snapshot), s.Stats().Recovery)
	return s, snapshot
}

// OnFlush reports every commit-log flush: the bytes made durable (all that was written, in
// FlushSync mode, over the flushes) and, for the fsync that failed the store, its error.
func TestOnFlushReportsFlushes(t *testing.T) {
	ffs := vfs.NewFaultFS(nil)
	ffs.Match(onlyCommitLog)
	o := testOptions()
	o.FS = ffs
	o.FlushMode = FlushSync
	var mu sync.Mutex
	var bytes, calls int
	var errs []error
	o.OnFlush = func(d time.Duration, n int, err error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		bytes += n
		if err != nil {
			errs = append(errs, err)
		}
		if d < 0 {
			t.Errorf("negative flush duration %v", d)
		}
	}
	s := openT(t, t.TempDir(), o)
	defer s.Close()
	putN(t, s, "T", 0, 20, "")
	require.NoError(t, s.Sync())
	mu.Lock()
	assert.Positive(t, calls)
	assert.EqualValues(t, s.Stats().FlushedOffset, bytes, "every byte made durable was reported once")
	assert.Empty(t, errs)
	mu.Unlock()

	ffs.FailSyncs(syscall.EIO)
	_, err := s.Put(context.Background(), newMsg("T", 0, "doomed", ""))
	require.ErrorIs(t, err, syscall.EIO)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, errs, 1)
	assert.ErrorIs(t, errs[0], syscall.EIO)
}
