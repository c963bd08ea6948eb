//go:build unix

package broker

import (
	"context"
	"io"
	"log/slog"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// suggestingMaster is a Replication of a master with an in-sync replica (broker id 1) to
// suggest: every pull's answer decides on suggestWhichBrokerId.
type suggestingMaster struct{}

func (suggestingMaster) Writable() error                          { return nil }
func (suggestingMaster) Sync() bool                               { return false }
func (suggestingMaster) Await(int64, time.Time, func(error))      {}
func (suggestingMaster) ReadReplica() (int64, bool)               { return 1, true }
func (suggestingMaster) BrokerID() int64                          { return 0 }
func (suggestingMaster) BrokerAddrs(self string) map[int64]string { return map[int64]string{0: self} }

// BenchmarkPullSuggest measures the pull path of a replica-set master that suggests a
// replica (suggestWhichBrokerId), called directly (no transport): pulls of 8 from a queue
// of 1 KiB messages, all beyond a 64 KiB memory budget ("history", the answer suggests the
// replica) or within it ("recent", the answer suggests the master). What it compares is
// the suggestion's cost per pull: the store's read tells whether its messages lie beyond
// the budget, where a second consume-queue read at the next offset did before.
func BenchmarkPullSuggest(b *testing.B) {
	const msgs = 4096
	cfg := Config{DataDir: b.TempDir(), Listen: "127.0.0.1:0", NamesrvListen: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Replication: suggestingMaster{}}
	cfg.Store.SegmentSize = 64 << 20
	cfg.Store.MemoryBudget = 64 << 10
	cfg.ReplicaReads = true
	br, err := New(cfg)
	require.NoError(b, err)
	require.NoError(b, br.Start())
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(b, br.Shutdown(ctx))
	})
	_, err = br.topicForWrite("suggest", 1)
	require.NoError(b, err)
	ctx := context.Background()
	body := make([]byte, 1024)
	for range msgs {
		_, err := br.Send(ctx, protocol.Message{Topic: "suggest", Body: body}, 0)
		require.NoError(b, err)
	}
	for deadline := time.Now().Add(10 * time.Second); br.store.MaxOffset("suggest", 0) < msgs; {
		if time.Now().After(deadline) {
			b.Fatal("messages not dispatched")
		}
		time.Sleep(time.Millisecond)
	}
	for _, c := range []struct {
		name     string
		from, to int64
		suggest  int64
	}{
		{"history", 0, msgs / 2, 1},
		{"recent", msgs - 32, msgs - 8, 0},
	} {
		b.Run(c.name, func(b *testing.B) {
			off := c.from
			b.ReportAllocs()
			b.ResetTimer()
			cpu := rusageCPU()
			for range b.N {
				h := &protocol.PullMessageRequestHeader{ConsumerGroup: "g", Topic: "suggest", QueueOffset: off, MaxMsgNums: 8,
					SysFlag: protocol.PullFlagSubscription, Subscription: "*", ExpressionType: "TAG"}
				resp := br.processPull(ctx, nil, protocol.NewRequestWith(protocol.PullMessage, h, nil))
				var rh protocol.PullMessageResponseHeader
				if err := resp.DecodeHeader(&rh); err != nil || resp.ResponseCode() != protocol.Success || rh.SuggestWhichBrokerID != c.suggest {
					b.Fatalf("pull at %d: %v %v suggest %d", off, err, resp, rh.SuggestWhichBrokerID)
				}
				if off = rh.NextBeginOffset; off >= c.to {
					off = c.from
				}
			}
			b.ReportMetric(float64(rusageCPU()-cpu)/float64(b.N), "cpu-ns/pull")
		})
	}
}

// rusageCPU is the CPU time (user and system) the process used so far, in ns: a figure a
// machine busy with other work disturbs much less than the time per pull.
func rusageCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
