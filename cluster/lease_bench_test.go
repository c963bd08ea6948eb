package cluster_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowd-io/flowd/cluster"
)

// BenchmarkLeaseFailover measures the election part of promotion time: from the moment a
// master stops renewing (killed) to the moment an in-sync member holds the lease, with the
// default TTL (3 s) and a shorter one (the setting that trades it: lapses are noticed TTL
// after the last renewal, and a master fences itself at TTL - FenceMargin).
//
//	go test -run - -bench BenchmarkLeaseFailover -benchtime 3x ./cluster/
func BenchmarkLeaseFailover(b *testing.B) {
	for _, ttl := range []time.Duration{0, time.Second} {
		name := "ttl=default"
		if ttl > 0 {
			name = "ttl=" + ttl.String()
		}
		b.Run(name, func(b *testing.B) { benchFailover(b, ttl) })
	}
}

func benchFailover(b *testing.B, ttl time.Duration) {
	s := startNATS(b, false)
	var total time.Duration
	for i := range b.N {
		broker := fmt.Sprintf("b%d", i)
		open := func(node string, boot bool) (*cluster.Lease, func()) {
			nc := connect(b, s)
			js, err := jetstream.New(nc)
			if err != nil {
				b.Fatal(err)
			}
			kv, err := cluster.OpenReplicaSets(context.Background(), js, 1)
			if err != nil {
				b.Fatal(err)
			}
			l := cluster.NewLease(cluster.LeaseOptions{KV: kv, BrokerName: broker, Node: node, MayBootstrap: boot, TTL: ttl, Logger: quiet})
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			wg.Go(func() { l.Run(ctx) })
			return l, func() { cancel(); wg.Wait(); nc.Close() }
		}
		a, stopA := open("a", true)
		for !a.Held() {
			time.Sleep(time.Millisecond)
		}
		c, stopC := open("c", false)
		a.SetInSync([]string{"c"})
		for {
			if rec, ok := c.Leader(); ok && len(rec.InSync) == 1 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		t0 := time.Now()
		stopA()
		for !c.Held() {
			time.Sleep(time.Millisecond)
		}
		total += time.Since(t0)
		stopC()
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/failover")
}
