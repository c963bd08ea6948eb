package producer_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/producer"
)

// BenchmarkSendSync measures sequential Send of 1 KiB messages (one round trip each).
func BenchmarkSendSync(b *testing.B) {
	br := startBroker(b, nil)
	createTopic(b, br, "bench-sync", 8)
	p := newProducer(b, br)
	msg := &producer.Message{Topic: "bench-sync", Body: make([]byte, 1024)}
	ctx := context.Background()
	b.SetBytes(1024)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := p.Send(ctx, msg); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkSendAsync measures SendAsync of 1 KiB messages with up to 64 in flight.
func BenchmarkSendAsync(b *testing.B) {
	benchSendAsync(b)
}

// BenchmarkSendAsyncBatched is BenchmarkSendAsync with WithAsyncBatching (up to 64 messages
// or 256 KiB a batch, no linger).
func BenchmarkSendAsyncBatched(b *testing.B) {
	benchSendAsync(b, producer.WithAsyncBatching(64, 256<<10, 0))
}

// BenchmarkSendAsyncBounded is SendAsync of 1 KiB messages bounded by the producer alone
// (WithMaxInFlightAsync(64)): each SendAsync past the first 64 waits for a callback to return.
func BenchmarkSendAsyncBounded(b *testing.B) {
	br := startBroker(b, nil)
	createTopic(b, br, "bench-bounded", 8)
	p := newProducer(b, br, producer.WithMaxInFlightAsync(64))
	msg := &producer.Message{Topic: "bench-bounded", Body: make([]byte, 1024)}
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	b.SetBytes(1024)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		wg.Add(1)
		p.SendAsync(ctx, msg, func(_ producer.SendResult, err error) {
			if err != nil {
				select {
				case errs <- err:
				default:
				}
			}
			wg.Done()
		})
	}
	wg.Wait()
	b.StopTimer()
	select {
	case err := <-errs:
		require.NoError(b, err)
	default:
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

func benchSendAsync(b *testing.B, opts ...producer.Option) {
	br := startBroker(b, nil)
	createTopic(b, br, "bench-async", 8)
	p := newProducer(b, br, opts...)
	msg := &producer.Message{Topic: "bench-async", Body: make([]byte, 1024)}
	ctx := context.Background()
	sem := make(chan struct{}, 64)
	errs := make(chan error, 1)
	b.SetBytes(1024)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sem <- struct{}{}
		p.SendAsync(ctx, msg, func(_ producer.SendResult, err error) {
			if err != nil {
				select {
				case errs <- err:
				default:
				}
			}
			<-sem
		})
	}
	for range cap(sem) {
		sem <- struct{}{}
	}
	b.StopTimer()
	select {
	case err := <-errs:
		require.NoError(b, err)
	default:
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
