package metrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/flowd-io/flowd/metrics"
	"github.com/flowd-io/flowd/producer"
)

// BenchmarkSend measures a synchronous 1 KiB send through flowd's producer to a broker
// without an Observer and to one with the metrics Observer, in the same run, so that the
// two numbers compare: the difference is what the request-path counters cost.
func BenchmarkSend(b *testing.B) {
	body := make([]byte, 1024)
	for _, c := range []struct {
		name string
		m    *metrics.Metrics
	}{
		{"observer=off", nil},
		{"observer=on", metrics.New(metrics.Options{DisableRuntimeMetrics: true})},
	} {
		b.Run(c.name, func(b *testing.B) {
			br := startBroker(b, c.m, nil)
			createTopic(b, br, "bench", 4)
			p := newProducer(b, br)
			msg := &producer.Message{Topic: "bench", Body: body}
			if _, err := p.Send(context.Background(), msg); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := p.Send(context.Background(), &producer.Message{Topic: "bench", Body: body}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkObserver measures the Observer calls one send and one pull make.
func BenchmarkObserver(b *testing.B) {
	m := metrics.New(metrics.Options{DisableRuntimeMetrics: true})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.MessagesIn("bench", 1, 1024)
			m.MessagesOut("bench", 1, 1200)
			m.PullLatency(time.Millisecond, false)
		}
	})
}
