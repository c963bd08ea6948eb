package store

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// BenchmarkRecovery measures how long Open takes over a commit log of a given size: after a
// clean Close, after a crash (the abort marker left behind, the checkpoint intact), and after
// a crash that also lost the checkpoint, which re-reads and re-validates the whole log. The
// baseline of the same run is reading the same segment files sequentially (io.Copy to
// io.Discard): what a recovery that only read the log would cost. The files are in the page
// cache in every case (they were just written).
//
//	go test -run '^$' -bench 'Recovery' -benchtime 3x ./broker/store/
func BenchmarkRecovery(b *testing.B) {
	for _, logMiB := range []int{64, 256, 1024} {
		b.Run(fmt.Sprintf("log=%dMiB", logMiB), func(b *testing.B) {
			dir := b.TempDir()
			o := testOptions()
			o.SegmentSize = 64 << 20
			s := openT(b, dir, o)
			body := make([]byte, 1024)
			batch := make([]*protocol.MessageExt, 64)
			for written := int64(0); written < int64(logMiB)<<20; {
				for i := range batch {
					m := newMsg("Recovery", int32(i%8), "", "TagA")
					m.Body = body
					batch[i] = m
				}
				rs, err := s.PutBatch(context.Background(), batch)
				require.NoError(b, err)
				for _, r := range rs {
					written += int64(r.Size)
				}
			}
			waitDispatch(b, s)
			require.NoError(b, s.Close())

			readAll := func() time.Duration {
				start := time.Now()
				segs, err := filepath.Glob(filepath.Join(dir, "commitlog", "*"))
				require.NoError(b, err)
				require.NotEmpty(b, segs)
				for _, p := range segs {
					f, err := os.Open(p)
					require.NoError(b, err)
					_, err = io.Copy(io.Discard, f)
					require.NoError(b, err)
					f.Close()
				}
				return time.Since(start)
			}
			open := func(crash, loseCheckpoint bool) time.Duration {
				if crash {
					require.NoError(b, os.WriteFile(filepath.Join(dir, abortFile), nil, 0o644))
				}
				if loseCheckpoint {
					require.NoError(b, os.Remove(filepath.Join(dir, checkpointFile)))
				}
				start := time.Now()
				s, err := Open(dir, o)
				require.NoError(b, err)
				d := time.Since(start)
				require.NoError(b, s.Close())
				return d
			}
			var base, clean, crash, full time.Duration
			b.ResetTimer()
			for range b.N {
				base += readAll()
				clean += open(false, false)
				crash += open(true, false)
				full += open(true, true)
			}
			n := time.Duration(b.N)
			b.ReportMetric(float64(base/n)/1e6, "read-ms")
			b.ReportMetric(float64(clean/n)/1e6, "clean-open-ms")
			b.ReportMetric(float64(crash/n)/1e6, "crash-open-ms")
			b.ReportMetric(float64(full/n)/1e6, "crash-no-checkpoint-ms")
			b.ReportMetric(float64(full)/float64(base), "full-recovery/read")
		})
	}
}
