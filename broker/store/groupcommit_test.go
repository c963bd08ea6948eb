package store

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/flowd-io/flowd/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// syncOptions are FlushSync options on ffs with a timeout no test run reaches.
func syncOptions(ffs *vfs.FaultFS) Options {
	o := testOptions()
	o.FS = ffs
	o.FlushMode = FlushSync
	o.SyncFlushTimeout = time.Hour
	return o
}

type completion struct {
	res PutResult
	err error
	// flushed is the store's flushed offset when the completion ran.
	flushed int64
}

// PutAsync completes nothing before an fsync covers it, then everything the fsync covered,
// in the order of the appends, each with its message id.
func TestPutAsyncCompletesInOrderAfterTheFsync(t *testing.T) {
	ffs := vfs.NewFaultFS(nil)
	s := openT(t, t.TempDir(), syncOptions(ffs))
	defer s.Close()
	putN(t, s, "T", 0, 1, "") // the segment exists and is synced

	hold := make(chan struct{})
	ffs.HoldSyncs(hold)
	var mu sync.Mutex
	var got []completion
	const n = 200
	for i := range n {
		m := newMsg("T", int32(i%3), "m-"+strconv.Itoa(i), "")
		s.PutAsync(context.Background(), m, func(r PutResult, err error) {
			mu.Lock()
			got = append(got, completion{r, err, s.flushed.Load()})
			mu.Unlock()
		})
	}
	mu.Lock()
	assert.Empty(t, got, "completed while the fsync was held")
	mu.Unlock()
	ffs.HoldSyncs(nil)
	close(hold)

	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == n }, 10*time.Second, time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for i, c := range got {
		require.NoError(t, c.err)
		assert.GreaterOrEqual(t, c.flushed, c.res.CommitLogOffset+int64(c.res.Size), "completion %d before its fsync", i)
		assert.Equal(t, protocol.OffsetMsgID(testHost, c.res.CommitLogOffset), c.res.MsgID)
		if i > 0 {
			assert.Greater(t, c.res.CommitLogOffset, got[i-1].res.CommitLogOffset, "completion %d out of order", i)
		}
		b, err := s.MessageAt(c.res.CommitLogOffset)
		require.NoError(t, err)
		m, _, err := protocol.DecodeStored(b)
		require.NoError(t, err)
		assert.Equal(t, "m-"+strconv.Itoa(i), string(m.Body))
	}
}

// A group commit whose fsync does not finish in SyncFlushTimeout completes its waiters with
// ErrFlushTimeout and their results (the messages are stored); an fsync that fails
// completes them with the store's failure.
func TestPutAsyncTimeoutAndFailure(t *testing.T) {
	ffs := vfs.NewFaultFS(nil)
	o := syncOptions(ffs)
	o.SyncFlushTimeout = 250 * time.Millisecond // the first put's fsync must fit in it on a busy machine
	s := openT(t, t.TempDir(), o)
	putN(t, s, "T", 0, 1, "")

	hold := make(chan struct{})
	ffs.HoldSyncs(hold)
	type outcome struct {
		res  PutResult
		ress []PutResult
		err  error
	}
	out := make(chan outcome, 2)
	s.PutAsync(context.Background(), newMsg("T", 0, "slow", ""), func(r PutResult, err error) { out <- outcome{res: r, err: err} })
	s.PutBatchAsync(context.Background(), []*protocol.MessageExt{newMsg("T", 0, "b0", ""), newMsg("T", 1, "b1", "")},
		func(rs []PutResult, err error) { out <- outcome{ress: rs, err: err} })
	one, batch := <-out, <-out
	require.ErrorIs(t, one.err, ErrFlushTimeout)
	assert.NotEmpty(t, one.res.MsgID, "a timed-out message is stored: its answer carries its id")
	require.ErrorIs(t, batch.err, ErrFlushTimeout)
	require.Len(t, batch.ress, 2)
	assert.Equal(t, one.res.CommitLogOffset+int64(one.res.Size), batch.ress[0].CommitLogOffset)
	// Put waits the same way.
	_, err := s.Put(context.Background(), newMsg("T", 0, "slow-put", ""))
	require.ErrorIs(t, err, ErrFlushTimeout)

	ffs.FailSyncs(errors.New("disk unplugged"))
	ffs.HoldSyncs(nil)
	close(hold)
	done := make(chan error, 1)
	s.PutAsync(context.Background(), newMsg("T", 0, "lost", ""), func(_ PutResult, err error) { done <- err })
	require.ErrorIs(t, <-done, ErrWriteFailed)
	// A failed store refuses the append itself, on the caller's goroutine.
	called := false
	s.PutAsync(context.Background(), newMsg("T", 0, "refused", ""), func(r PutResult, err error) {
		called = true
		assert.ErrorIs(t, err, ErrWriteFailed)
		assert.Empty(t, r.MsgID)
	})
	assert.True(t, called)
	_ = s.Close() // fails: the disk is gone
}

// Appends still waiting when the store closes are completed by Close: its final flush
// covers them. A canceled context refuses the append.
func TestPutAsyncCloseCompletesWaiters(t *testing.T) {
	s := openT(t, t.TempDir(), syncOptions(vfs.NewFaultFS(nil)))
	var mu sync.Mutex
	errs := map[int]error{}
	const n = 500
	for i := range n {
		s.PutAsync(context.Background(), newMsg("T", 0, "c-"+strconv.Itoa(i), ""), func(_ PutResult, err error) {
			mu.Lock()
			_, twice := errs[i]
			assert.False(t, twice, "completed twice")
			errs[i] = err
			mu.Unlock()
		})
	}
	require.NoError(t, s.Close())
	mu.Lock()
	assert.Len(t, errs, n)
	for i, err := range errs {
		assert.NoError(t, err, "append %d", i)
	}
	mu.Unlock()

	var closedErr error
	s.PutAsync(context.Background(), newMsg("T", 0, "late", ""), func(_ PutResult, err error) { closedErr = err })
	assert.ErrorIs(t, closedErr, ErrClosed)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var ctxErr error
	s2 := openT(t, t.TempDir(), syncOptions(vfs.NewFaultFS(nil)))
	defer s2.Close()
	s2.PutAsync(ctx, newMsg("T", 0, "x", ""), func(_ PutResult, err error) { ctxErr = err })
	assert.ErrorIs(t, ctxErr, context.Canceled)
	assert.Zero(t, s2.Stats().CommitLogMaxOffset-s2.Stats().CommitLogMinOffset, "a canceled put appended")
}

// In FlushAsync mode PutAsync completes on the caller's goroutine, before it returns.
func TestPutAsyncAsyncModeCompletesAtOnce(t *testing.T) {
	s := openT(t, t.TempDir(), testOptions())
	defer s.Close()
	var got PutResult
	s.PutAsync(context.Background(), newMsg("T", 0, "a", ""), func(r PutResult, err error) {
		require.NoError(t, err)
		got = r
	})
	assert.NotEmpty(t, got.MsgID)
	var gotB []PutResult
	s.PutBatchAsync(context.Background(), []*protocol.MessageExt{newMsg("T", 0, "b", "")}, func(rs []PutResult, err error) {
		require.NoError(t, err)
		gotB = rs
	})
	require.Len(t, gotB, 1)
	assert.Equal(t, got.QueueOffset+1, gotB[0].QueueOffset)
}

// TestPowerCutPutAsync cuts the power (every unsynced write is lost) while many appenders
// keep PutAsync and PutBatchAsync calls waiting: every message acknowledged before the cut
// is there after recovery, at its offsets.
func TestPowerCutPutAsync(t *testing.T) {
	for round := range 3 {
		t.Run(strconv.Itoa(round), func(t *testing.T) {
			dir := t.TempDir()
			ffs := vfs.NewFaultFS(nil)
			ffs.TrackUnsynced()
			o := syncOptions(ffs)
			o.SegmentSize = 64 << 10
			o.ConsumeQueueUnits = 100
			s := openT(t, dir, o)
			var mu sync.Mutex
			var acks []ack
			var wg sync.WaitGroup
			stop := make(chan struct{})
			for g := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), uint64(round)))
					window := make(chan struct{}, 8) // appends of this goroutine waiting at once
					for {
						select {
						case <-stop:
							return
						case window <- struct{}{}:
						}
						var ms []*protocol.MessageExt
						for range 1 + rng.IntN(2) {
							m := newMsg("K", int32(g), "", "")
							m.Body = make([]byte, 1+rng.IntN(1500))
							for j := range m.Body {
								m.Body[j] = byte(rng.Uint32())
							}
							ms = append(ms, m)
						}
						record := func(rs []PutResult, err error) {
							<-window
							if err != nil {
								return
							}
							mu.Lock()
							for i, r := range rs {
								acks = append(acks, ack{int32(g), r.QueueOffset, r.CommitLogOffset, bodyHash(ms[i].Body)})
							}
							mu.Unlock()
						}
						if len(ms) == 1 {
							s.PutAsync(context.Background(), ms[0], func(r PutResult, err error) { record([]PutResult{r}, err) })
						} else {
							s.PutBatchAsync(context.Background(), ms, record)
						}
					}
				}()
			}
			s, snapshot := cutPower(t, s, ffs, 200<<10, &mu, &acks, stop, &wg, dir, o)
			require.NotEmpty(t, snapshot)
			verifyAcks(t, s, snapshot)
			checkConsistent(t, s)
		})
	}
}
