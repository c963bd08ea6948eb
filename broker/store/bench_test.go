package store

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/flowd-io/flowd/protocol"
	"github.com/stretchr/testify/require"
)

func benchMsg(size int) *protocol.MessageExt {
	m := newMsg("BenchTopic", 0, "", "TagA")
	m.Body = make([]byte, size)
	for i := range m.Body {
		m.Body[i] = byte(i)
	}
	return m
}

func benchOptions(mode FlushMode) Options {
	o := testOptions()
	o.SegmentSize = 256 << 20
	o.FlushMode = mode
	o.FlushInterval = 500 * time.Millisecond
	o.CheckpointInterval = time.Second
	return o
}

// BenchmarkAppend compares Put with raw sequential write(2)s of the same stored bytes to a
// file in the same directory; the sync variants' raw baseline fdatasyncs as often as the
// store did (messages per fsync measured in the store run just before).
func BenchmarkAppend(b *testing.B) {
	for _, size := range []int{128, 1024} {
		stored := benchMsg(size).StoredSize()
		for _, pw := range []bool{false, true} {
			name := fmt.Sprintf("async/%dB/store", size)
			if pw {
				name += "-pwrite"
			}
			b.Run(name, func(b *testing.B) {
				o := benchOptions(FlushAsync)
				o.DisableMmap = pw
				s := openT(b, b.TempDir(), o)
				defer s.Close()
				m := benchMsg(size)
				b.SetBytes(int64(stored))
				b.ReportAllocs()
				b.ResetTimer()
				cpu := processCPU()
				for range b.N {
					if _, err := s.Put(context.Background(), m); err != nil {
						b.Fatal(err)
					}
				}
				// Until the dispatcher has caught up: its work is part of each append's cost.
				if err := s.waitDispatched(context.Background(), s.written.Load()); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				reportCPU(b, cpu)
			})
		}
		b.Run(fmt.Sprintf("async/%dB/p8/store", size), func(b *testing.B) {
			benchAppendParallel(b, size, 8)
		})
		b.Run(fmt.Sprintf("async/%dB/raw", size), func(b *testing.B) {
			rawWrite(b, stored, 0, 0)
		})
		b.Run(fmt.Sprintf("async/%dB/raw-fsync500ms", size), func(b *testing.B) {
			rawWrite(b, stored, 0, 500*time.Millisecond)
		})
		for _, conc := range []int{1, 16, 64} {
			var perSync atomic.Int64
			b.Run(fmt.Sprintf("sync/%dB/c%d/store", size, conc), func(b *testing.B) {
				s := openT(b, b.TempDir(), benchOptions(FlushSync))
				defer s.Close()
				b.SetBytes(int64(stored))
				b.ResetTimer()
				f0 := s.Stats().Fsyncs
				var next atomic.Int64
				var wg sync.WaitGroup
				for range conc {
					wg.Add(1)
					go func() {
						defer wg.Done()
						m := benchMsg(size)
						for next.Add(1) <= int64(b.N) {
							if _, err := s.Put(context.Background(), m); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				fs := s.Stats().Fsyncs - f0
				perSync.Store(max(1, int64(b.N)/max(fs, 1)))
				b.ReportMetric(float64(b.N)/float64(max(fs, 1)), "msgs/fsync")
			})
			b.Run(fmt.Sprintf("sync/%dB/c%d/raw", size, conc), func(b *testing.B) {
				rawWrite(b, stored, int(perSync.Load()), 0)
			})
		}
	}
}

// rawWrite is the baseline: sequential write(2)s of size bytes, an fdatasync every
// syncEvery writes (0: never), and, if syncPeriod > 0, an fdatasync from another goroutine
// every syncPeriod (what the store's asynchronous flusher does every FlushInterval).
func rawWrite(b *testing.B, size, syncEvery int, syncPeriod time.Duration) {
	f, err := vfs.Default().Create(filepath.Join(b.TempDir(), "raw"))
	require.NoError(b, err)
	defer f.Close()
	if syncPeriod > 0 {
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			t := time.NewTicker(syncPeriod)
			defer t.Stop()
			for {
				select {
				case <-t.C:
					f.Sync()
				case <-stop:
					return
				}
			}
		}()
		defer func() { close(stop); <-done }()
	}
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte(i)
	}
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := range b.N {
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
		if syncEvery > 0 && (i+1)%syncEvery == 0 {
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
		}
	}
	if syncEvery > 0 {
		f.Sync()
	}
	if syncEvery > 0 {
		b.ReportMetric(float64(syncEvery), "msgs/fsync")
	}
}

// BenchmarkGetMessage32 reads 32-message batches of 1 KiB messages from one queue, as
// messages and as regions, next to a raw baseline preading the same number of bytes from a
// file.
func BenchmarkGetMessage32(b *testing.B) {
	const n = 20000
	dir := b.TempDir()
	s := openT(b, dir, benchOptions(FlushAsync))
	defer s.Close()
	m := benchMsg(1024)
	ms := make([]*protocol.MessageExt, 100)
	for i := range ms {
		ms[i] = m
	}
	for range n / len(ms) {
		_, err := s.PutBatch(context.Background(), ms)
		require.NoError(b, err)
	}
	waitDispatch(b, s)
	stored := m.StoredSize()
	b.Run("store", func(b *testing.B) {
		b.SetBytes(int64(32 * stored))
		b.ReportAllocs()
		off := int64(0)
		for range b.N {
			g, err := s.GetMessage(context.Background(), "BenchTopic", 0, off, 32, 0, nil)
			if err != nil || len(g.Messages) != 32 {
				b.Fatal(err, g.Status)
			}
			off = g.NextBeginOffset
			if off+32 > n {
				off = 0
			}
			g.Release()
		}
	})
	// GetRegions answers the same reads without copying: what selecting the units costs.
	b.Run("regions", func(b *testing.B) {
		b.SetBytes(int64(32 * stored))
		b.ReportAllocs()
		off := int64(0)
		for range b.N {
			g, err := s.GetRegions(context.Background(), "BenchTopic", 0, off, 32, 0, nil)
			if err != nil || g.Count != 32 {
				b.Fatal(err, g.Status)
			}
			off = g.NextBeginOffset
			if off+32 > n {
				off = 0
			}
			g.Release()
		}
	})
	b.Run("raw", func(b *testing.B) {
		f, err := os.Open(filepath.Join(dir, "commitlog", offsetName(0)))
		require.NoError(b, err)
		defer f.Close()
		buf := make([]byte, 32*stored)
		b.SetBytes(int64(len(buf)))
		off := int64(0)
		for range b.N {
			if _, err := f.ReadAt(buf, off); err != nil {
				b.Fatal(err)
			}
			off += int64(len(buf))
			if off+int64(len(buf)) > int64(n*stored) {
				off = 0
			}
		}
	})
}

var recoveryMiB = flag.Int("recovery.mib", 0, "TestRecoverySpeed: MiB to write before a simulated crash (0 skips)")

// TestRecoverySpeed writes recovery.mib MiB of 1 KiB messages over 4 queues, then makes
// the next Open a crash recovery without a checkpoint (the worst case: validate and
// re-dispatch everything) and reports its time per GiB. The page cache is warm.
func TestRecoverySpeed(t *testing.T) {
	if *recoveryMiB <= 0 {
		t.Skip("set -recovery.mib=256")
	}
	dir := t.TempDir()
	o := benchOptions(FlushAsync)
	s := openT(t, dir, o)
	ms := make([]*protocol.MessageExt, 64)
	for i := range ms {
		ms[i] = benchMsg(1024)
	}
	var total int64
	for i := 0; total < int64(*recoveryMiB)<<20; i++ {
		for _, m := range ms {
			m.QueueID = int32(i % 4)
		}
		_, err := s.PutBatch(context.Background(), ms)
		require.NoError(t, err)
		total = s.Stats().CommitLogMaxOffset
	}
	require.NoError(t, s.Close())
	require.NoError(t, os.Remove(filepath.Join(dir, checkpointFile)))
	require.NoError(t, os.WriteFile(filepath.Join(dir, abortFile), nil, 0o644))

	t0 := time.Now()
	s = openT(t, dir, o)
	d := time.Since(t0)
	defer s.Close()
	rep := s.Stats().Recovery
	require.Equal(t, total, rep.End)
	perGiB := time.Duration(float64(d) * float64(1<<30) / float64(total))
	t.Logf("recovered %d MiB (%d messages re-dispatched) in %v: %v per GiB", total>>20, rep.Redispatched, d, perGiB)
}

// passThrough is a batch filter that keeps everything: what a filter costs the read path
// beyond its own work.
type passThrough struct{}

func (passThrough) MatchBatch(_ context.Context, msgs []Candidate, keep []bool) error {
	for i := range keep {
		keep[i] = true
	}
	return nil
}

// propertyFilter keeps messages with a TAGS property of TagA, looked up in the stored
// bytes: roughly what an SQL92 selector over one property costs.
type propertyFilter struct{}

func (propertyFilter) MatchBatch(_ context.Context, msgs []Candidate, keep []bool) error {
	for i, m := range msgs {
		props, err := StoredProperties(m.Stored)
		if err != nil {
			return err
		}
		v, ok := protocol.FindProperty(props, protocol.PropertyTags)
		keep[i] = ok && string(v) == "TagA"
	}
	return nil
}

// BenchmarkGetMessageFilter reads 32-message batches of 1 KiB messages with no filter, a
// tag filter, a pass-through batch filter and a property filter; every message matches, so
// the batches are alike and the differences are the filters' cost (compare ns/op, or
// msgs/s).
func BenchmarkGetMessageFilter(b *testing.B) {
	const n = 20000
	s := openT(b, b.TempDir(), benchOptions(FlushAsync))
	defer s.Close()
	m := benchMsg(1024)
	ms := make([]*protocol.MessageExt, 100)
	for i := range ms {
		ms[i] = m
	}
	for range n / len(ms) {
		_, err := s.PutBatch(context.Background(), ms)
		require.NoError(b, err)
	}
	waitDispatch(b, s)
	for _, bc := range []struct {
		name string
		f    *Filter
	}{
		{"none", nil},
		{"tags", tagsOf("TagB", "TagA")},
		{"pass-through", &Filter{Match: passThrough{}}},
		{"tags+pass-through", &Filter{TagsCodes: tagsOf("TagA").TagsCodes, Match: passThrough{}}},
		{"property", &Filter{Match: propertyFilter{}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(32 * m.StoredSize()))
			b.ReportAllocs()
			off := int64(0)
			for range b.N {
				g, err := s.GetMessage(context.Background(), "BenchTopic", 0, off, 32, 0, bc.f)
				if err != nil || len(g.Messages) != 32 {
					b.Fatal(err, g.Status)
				}
				off = g.NextBeginOffset
				if off+32 > n {
					off = 0
				}
				g.Release()
			}
			b.ReportMetric(float64(32*b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

// BenchmarkGetMessageFilterInterleaved alternates reads with no filter and with a
// pass-through batch filter (and a tag filter) over the same data, timing each, so that a
// busy machine slows all alike; it reports each one's ns per read and the throughput of
// the filtered reads relative to the unfiltered ones (1 = no cost).
func BenchmarkGetMessageFilterInterleaved(b *testing.B) {
	const n = 20000
	s := openT(b, b.TempDir(), benchOptions(FlushAsync))
	defer s.Close()
	m := benchMsg(1024)
	ms := make([]*protocol.MessageExt, 100)
	for i := range ms {
		ms[i] = m
	}
	for range n / len(ms) {
		_, err := s.PutBatch(context.Background(), ms)
		require.NoError(b, err)
	}
	waitDispatch(b, s)
	filters := []*Filter{nil, {Match: passThrough{}}, tagsOf("TagB", "TagA")}
	var spent [3]time.Duration
	off := int64(0)
	for it := range b.N {
		for j := range filters {
			k := (it + j) % len(filters) // rotate, so no filter always reads cold data first
			f := filters[k]
			start := time.Now()
			g, err := s.GetMessage(context.Background(), "BenchTopic", 0, off, 32, 0, f)
			spent[k] += time.Since(start)
			if err != nil || len(g.Messages) != 32 {
				b.Fatal(err, g.Status)
			}
			g.Release()
		}
		off += 32
		if off+32 > n {
			off = 0
		}
	}
	b.ReportMetric(float64(spent[0].Nanoseconds())/float64(b.N), "none-ns/read")
	b.ReportMetric(float64(spent[1].Nanoseconds())/float64(b.N), "pass-through-ns/read")
	b.ReportMetric(float64(spent[2].Nanoseconds())/float64(b.N), "tags-ns/read")
	b.ReportMetric(float64(spent[0])/float64(spent[1]), "pass-through/none")
	b.ReportMetric(float64(spent[0])/float64(spent[2]), "tags/none")
}

// benchAppendParallel is BenchmarkAppend's async store run with conc goroutines appending
// at once, as the broker's connections do with several producers: what they cost is the
// append lock they queue on as well as each append.
func benchAppendParallel(b *testing.B, size, conc int) {
	s := openT(b, b.TempDir(), benchOptions(FlushAsync))
	defer s.Close()
	b.SetBytes(int64(benchMsg(size).StoredSize()))
	b.ReportAllocs()
	b.ResetTimer()
	cpu := processCPU()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			m := benchMsg(size)
			for next.Add(1) <= int64(b.N) {
				if _, err := s.Put(context.Background(), m); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := s.waitDispatched(context.Background(), s.written.Load()); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	reportCPU(b, cpu)
}
