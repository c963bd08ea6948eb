package replication

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// BenchmarkProduce measures appends of 1 KiB messages by 16 concurrent producers on one
// store, each acknowledged as its mode requires: "single" (no replica set), "async" (a
// master with two replicas, acknowledged at once) and "sync" (acknowledged once one of two
// replicas holds it, min_in_sync 2), all on loopback. It reports msgs/s and the p50 and p99
// of the acknowledgement latency.
//
//	go test -run - -bench BenchmarkProduce -benchtime 20000x ./internal/replication/
func BenchmarkProduce(b *testing.B) {
	for _, mode := range []string{"single", "async", "sync"} {
		b.Run(mode, func(b *testing.B) { benchProduce(b, mode) })
	}
}

func benchProduce(b *testing.B, mode string) {
	mn := benchNode(b, "m")
	var m *Master
	if mode != "single" {
		var err error
		m, err = StartMaster(benchListener(b), MasterConfig{Store: mn.st, Epochs: mn.epochs, Epoch: 1, Cluster: "c", BrokerName: "b",
			Sync: mode == "sync", MinInSync: 2, Logger: quietLogger()})
		if err != nil {
			b.Fatal(err)
		}
		defer m.Close()
		for _, name := range []string{"r1", "r2"} {
			r := benchNode(b, name)
			f := NewFollower(ReplicaConfig{Store: r.st, Epochs: r.epochs, Cluster: "c", BrokerName: "b", Node: name,
				Master: func() string { return m.Addr().String() }, Logger: quietLogger()})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go f.Run(ctx)
		}
		for len(m.InSync()) < 2 {
			time.Sleep(time.Millisecond)
		}
	}
	body := make([]byte, 1024)
	const producers = 16
	var next atomic.Int64
	lat := make([][]time.Duration, producers)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				msg := &protocol.MessageExt{QueueID: int32(p % 8), BornHost: netip.MustParseAddrPort("127.0.0.1:1")}
				msg.Topic, msg.Body = "bench", body
				t0 := time.Now()
				res, err := mn.st.Put(context.Background(), msg)
				if err != nil {
					b.Error(err)
					return
				}
				if m != nil {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					err = m.Wait(ctx, res.CommitLogOffset+int64(res.Size))
					cancel()
					if err != nil {
						b.Error(err)
						return
					}
				}
				lat[p] = append(lat[p], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) == 0 {
		return
	}
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkCatchUp measures how fast a replica copies a master's log it is behind by
// (64 MiB of 1 KiB messages), as after a restart: MB/s of commit log.
//
//	go test -run - -bench BenchmarkCatchUp -benchtime 3x ./internal/replication/
func BenchmarkCatchUp(b *testing.B) {
	mn := benchNode(b, "m")
	body := make([]byte, 1024)
	for mn.end() < 64<<20 {
		msg := &protocol.MessageExt{BornHost: netip.MustParseAddrPort("127.0.0.1:1")}
		msg.Topic, msg.Body = "bench", body
		if _, err := mn.st.Put(context.Background(), msg); err != nil {
			b.Fatal(err)
		}
	}
	m, err := StartMaster(benchListener(b), MasterConfig{Store: mn.st, Epochs: mn.epochs, Epoch: 1, Cluster: "c", BrokerName: "b", Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		r := benchNode(b, "r")
		b.StartTimer()
		f := NewFollower(ReplicaConfig{Store: r.st, Epochs: r.epochs, Cluster: "c", BrokerName: "b", Node: "r",
			Master: func() string { return m.Addr().String() }, Logger: quietLogger()})
		ctx, cancel := context.WithCancel(context.Background())
		go f.Run(ctx)
		for r.end() < mn.end() {
			time.Sleep(100 * time.Microsecond)
		}
		cancel()
	}
	b.SetBytes(mn.end())
}

func benchNode(b *testing.B, name string) *node { return newNode(b, name) }

func benchListener(b *testing.B) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	return ln
}
