package store

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/flowd-io/flowd/protocol"
	"github.com/stretchr/testify/require"
)

// BenchmarkDispatchIndex measures what the key index adds to dispatch: the same log of
// 20 000 messages of 1 KiB (a UNIQ_KEY and two KEYS each) is dispatched again and again
// through the real dispatch path, without and with a (fresh, default-sized) index. ns/msg
// is the dispatch cost per message; the difference between the two is the index's.
// Measured here (2 shared cores, ext4; noisy): 0.4-1 µs/msg without the index, 1.0-1.5 µs/msg
// with it (three keys a message). Lookups: ~18 µs by unique key, ~165 µs for 32 messages.
func BenchmarkDispatchIndex(b *testing.B) {
	const n = 20000
	o := benchOptions(FlushAsync)
	o.DisableIndex = true
	s := openT(b, b.TempDir(), o)
	defer s.Close()
	ms := make([]*protocol.MessageExt, 100)
	for i := range n / len(ms) {
		for j := range ms {
			m := benchMsg(1024)
			m.Properties[protocol.PropertyUniqueKey] = fmt.Sprintf("U-%d-%d", i, j)
			m.Properties[protocol.PropertyKeys] = fmt.Sprintf("order-%d customer-%d", i*len(ms)+j, j)
			ms[j] = m
		}
		_, err := s.PutBatch(context.Background(), ms)
		require.NoError(b, err)
	}
	waitDispatch(b, s)
	for _, indexed := range []bool{false, true} {
		name := "noindex"
		if indexed {
			name = "index"
		}
		b.Run(name, func(b *testing.B) {
			d := newDispatcher(s, false)
			var elapsed time.Duration
			for range b.N {
				if indexed {
					s.index.close()
					require.NoError(b, os.RemoveAll(filepath.Join(s.dir, indexDirName)))
					x, err := openIndex(s, false)
					require.NoError(b, err)
					// Creating a file (sizing it, fsyncing the directory) happens once per
					// IndexEntries keys; it is left out of the per-message cost.
					x.mu.Lock()
					_, err = x.activeFile(s.minOffset.Load())
					x.mu.Unlock()
					require.NoError(b, err)
					s.index = x
				}
				s.dispatched.Store(s.minOffset.Load())
				t0 := time.Now()
				require.NoError(b, s.dispatchAvailable(d))
				elapsed += time.Since(t0)
			}
			b.ReportMetric(float64(elapsed.Nanoseconds())/float64(b.N*n), "ns/msg")
			if indexed {
				r, err := s.QueryMessages(context.Background(), "BenchTopic", "order-4242", false, 1, 0, math.MaxInt64)
				require.NoError(b, err)
				require.Len(b, r.Messages, 1)
				s.index.close()
				s.index = nil
			}
		})
	}
}

// BenchmarkQueryMessages measures lookup latency over 100 000 indexed messages: by unique
// key (one match) and by a key 100 messages share (32 returned, as RocketMQ's admin asks).
func BenchmarkQueryMessages(b *testing.B) {
	const n = 100000
	s := openT(b, b.TempDir(), benchOptions(FlushAsync))
	defer s.Close()
	ms := make([]*protocol.MessageExt, 100)
	for i := range n / len(ms) {
		for j := range ms {
			m := benchMsg(256)
			m.Properties[protocol.PropertyUniqueKey] = fmt.Sprintf("U-%d", i*len(ms)+j)
			m.Properties[protocol.PropertyKeys] = fmt.Sprintf("customer-%d", (i*len(ms)+j)%1000)
			ms[j] = m
		}
		_, err := s.PutBatch(context.Background(), ms)
		require.NoError(b, err)
	}
	waitDispatch(b, s)
	b.Run("unique", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			r, err := s.QueryMessages(context.Background(), "BenchTopic", fmt.Sprintf("U-%d", (i*7919)%n), true, 1, 0, math.MaxInt64)
			if err != nil || len(r.Messages) != 1 {
				b.Fatal(err)
			}
		}
	})
	b.Run("key-32-of-100", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			r, err := s.QueryMessages(context.Background(), "BenchTopic", fmt.Sprintf("customer-%d", i%1000), false, 32, 0, math.MaxInt64)
			if err != nil || len(r.Messages) != 32 {
				b.Fatal(err, len(r.Messages))
			}
		}
	})
}
