package pipeline_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/pipeline"
	"github.com/flowd-io/flowd/producer"
)

// commitDelay is how long the broker path of BenchmarkSlowCommits holds every commit.
const commitDelay = 2 * time.Millisecond

// BenchmarkSlowCommits measures a pipeline whose commits are slow (the path to the broker
// holds every UPDATE_CONSUMER_OFFSET for commitDelay, as a loaded broker or a distant one
// would) with one worker and with four, reading four queues (one per worker), a batch of 8
// messages at a time, into a stdout sink. Workers commit queues of their own, so four go
// about four times as fast when commits of different queues do not wait for each other.
// The timer runs from the first record delivered to the last.
func BenchmarkSlowCommits(b *testing.B) {
	for _, par := range []int{1, 4} {
		b.Run(fmt.Sprintf("parallelism=%d", par), func(b *testing.B) { benchSlowCommits(b, par) })
	}
}

func benchSlowCommits(b *testing.B, parallelism int) {
	br, px := startBrokerBehindProxy(b)
	topic := spreadTopic("bench", 4, 4)
	createTopic(b, br, topic, 4)
	p := newProducer(b, br) // round robin: the messages spread over the four queues
	ctx := context.Background()
	var wg sync.WaitGroup
	var failed sync.Once
	var sendErr error
	for i := range b.N {
		wg.Add(1)
		p.SendAsync(ctx, &producer.Message{Topic: topic, Body: fmt.Appendf(nil, "m-%d", i)}, func(_ producer.SendResult, err error) {
			if err != nil {
				failed.Do(func() { sendErr = err })
			}
			wg.Done()
		})
	}
	wg.Wait()
	require.NoError(b, sendErr)

	px.delayCommits(commitDelay)
	out := newCountingWriter(b.N)
	m := newManager(b, br, func(o *pipeline.Options) { o.Stdout = out })
	def := pipeline.Definition{Name: "bench", Topics: []string{topic}, StartFrom: pipeline.StartFirst,
		Parallelism: parallelism, PullBatchSize: 8, Sink: pipeline.SinkDefinition{Type: pipeline.SinkStdout}}
	require.NoError(b, m.Start(ctx, def))
	select {
	case <-out.first:
	case <-time.After(wait):
		b.Fatal("nothing delivered")
	}
	b.ResetTimer()
	select {
	case <-out.all:
	case <-time.After(10 * wait):
		b.Fatalf("%d of %d records delivered", out.count(), b.N)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// countingWriter counts the lines written to it, and tells when the first and the want-th
// arrive.
type countingWriter struct {
	mu    sync.Mutex
	n     int
	want  int
	first chan struct{}
	all   chan struct{}
}

func newCountingWriter(want int) *countingWriter {
	return &countingWriter{want: want, first: make(chan struct{}), all: make(chan struct{})}
}

func (w *countingWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	before := w.n
	w.n += bytes.Count(b, []byte{'\n'})
	if before == 0 && w.n > 0 {
		close(w.first)
	}
	if before < w.want && w.n >= w.want {
		close(w.all)
	}
	return len(b), nil
}

func (w *countingWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}
