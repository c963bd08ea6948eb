package grpcserver_test

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/client"
	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
	"github.com/flowd-io/flowd/producer"
)

// benchSenders is how many goroutines send at once in the send benchmarks, each one message
// at a time and waiting for its answer, as a synchronous producer does.
const benchSenders = 16

// latencies records per-call latencies and reports their median and 99th percentile.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

func (l *latencies) report(b *testing.B, n int, elapsed time.Duration) {
	slices.Sort(l.d)
	if len(l.d) > 0 {
		b.ReportMetric(float64(l.d[len(l.d)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(l.d[len(l.d)*99/100].Microseconds()), "p99-µs")
	}
	b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
}

// runSenders calls send b.N times over benchSenders goroutines.
func runSenders(b *testing.B, send func(i int) error) {
	var next atomic.Int64
	var lat latencies
	var wg sync.WaitGroup
	start := time.Now()
	b.ResetTimer()
	for range benchSenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1))
				if i > b.N {
					return
				}
				t0 := time.Now()
				if err := send(i); err != nil {
					b.Error(err)
					return
				}
				lat.add(time.Since(t0))
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	lat.report(b, b.N, time.Since(start))
}

// BenchmarkSend1KiB compares a 1 KiB synchronous send over gRPC (a 5.x producer) with one
// over remoting (flowd's producer) on the same broker: throughput and latency.
func BenchmarkSend1KiB(b *testing.B) {
	body := make([]byte, 1024)
	b.Run("grpc", func(b *testing.B) {
		e := start(b, nil)
		e.topic(b, "bench", 4)
		ctx := callCtx(b, "bench-producer")
		runSenders(b, func(i int) error {
			m := message("bench", "01BENCH"+strconv.Itoa(i), "")
			m.Body = body
			resp, err := e.client.SendMessage(ctx, &pb.SendMessageRequest{Messages: []*pb.Message{m}})
			if err == nil && resp.Status.Code != pb.Code_OK {
				b.Fatalf("send: %v", resp.Status)
			}
			return err
		})
	})
	b.Run("remoting", func(b *testing.B) {
		e := start(b, withNamesrv)
		e.topic(b, "bench", 4)
		ctx := context.Background()
		cl, err := client.New(client.WithNameServers(e.b.NamesrvAddr()), client.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		require.NoError(b, err)
		defer cl.Close(ctx)
		p, err := producer.New("bench", producer.WithClient(cl))
		require.NoError(b, err)
		require.NoError(b, p.Start(ctx))
		defer p.Close(ctx)
		runSenders(b, func(int) error {
			_, err := p.Send(ctx, &producer.Message{Topic: "bench", Body: body})
			return err
		})
	})
}
