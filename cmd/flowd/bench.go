package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/producer"
)

// benchConfig is what "flowd bench" measures.
type benchConfig struct {
	namesrv  string // a running flowd or RocketMQ name server; empty: an embedded broker
	dataDir  string // where the embedded broker and the disk baseline write
	size     int
	messages int
	inflight int
	queues   int
	samples  int // latency samples
}

// bench measures, in one run on this machine: a raw sequential-write baseline on the data
// disk, async produce throughput, consume throughput with the lite-pull consumer, and the
// delay from a send to a polling consumer. Throughput is reported next to the baseline so
// that figures from a noisy machine still compare.
func bench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c benchConfig
	fs.StringVar(&c.namesrv, "namesrv", "", "name server of the broker to measure (default: start an embedded broker)")
	fs.StringVar(&c.dataDir, "data-dir", "", "data directory of the embedded broker and the disk baseline (default: a temporary directory, removed afterwards)")
	fs.IntVar(&c.size, "size", 1024, "message body size in bytes")
	fs.IntVar(&c.messages, "messages", 100000, "messages to produce and consume")
	fs.IntVar(&c.inflight, "inflight", 64, "async sends in flight")
	fs.IntVar(&c.queues, "queues", 8, "queues of the benchmark topic")
	fs.IntVar(&c.samples, "latency-samples", 2000, "send-to-poll delays to sample")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case c.size < 8 || c.size > 4<<20:
		return fmt.Errorf("bench: --size %d must be within 8..%d", c.size, 4<<20)
	case c.messages < 1:
		return fmt.Errorf("bench: --messages %d must be positive", c.messages)
	case c.inflight < 1:
		return fmt.Errorf("bench: --inflight %d must be positive", c.inflight)
	case c.queues < 1 || c.queues > 1024:
		return fmt.Errorf("bench: --queues %d must be within 1..1024", c.queues)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	if c.dataDir == "" {
		dir, err := os.MkdirTemp("", "flowd-bench-")
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer os.RemoveAll(dir)
		c.dataDir = dir
	}
	if c.namesrv == "" {
		b, err := broker.New(broker.Config{
			DataDir: filepath.Join(c.dataDir, "broker"), Listen: "127.0.0.1:0", NamesrvListen: "127.0.0.1:0",
			DefaultTopicQueues: c.queues, Logger: quiet,
		})
		if err != nil {
			return fmt.Errorf("bench: start embedded broker: %w", err)
		}
		if err := b.Start(); err != nil {
			return errors.Join(err, b.Shutdown(context.Background()))
		}
		defer b.Shutdown(context.Background())
		c.namesrv = b.NamesrvAddr()
	}
	fmt.Fprintf(stdout, "flowd bench: %d messages of %d B, %d in flight, %d queues, name server %s\n", c.messages, c.size, c.inflight, c.queues, c.namesrv)

	base, err := diskBaseline(c)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "  disk baseline      %10.1f MB/s   sequential %d B writes to the data directory\n", base, c.size+150)

	topic := fmt.Sprintf("flowd-bench-%d", time.Now().UnixNano())
	p, err := producer.New("flowd-bench", producer.WithNameServers(c.namesrv), producer.WithLogger(quiet), producer.WithDefaultTopicQueues(c.queues))
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := p.Start(ctx); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer p.Close(context.Background())

	rate, err := produce(ctx, p, topic, c)
	if err != nil {
		return err
	}
	mbs := rate * float64(c.size) / 1e6
	fmt.Fprintf(stdout, "  produce (async)    %10.0f msg/s  %7.1f MB/s   %.2f× the disk baseline\n", rate, mbs, mbs/base)

	rate, err = consume(ctx, topic, c, quiet)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "  consume (poll)     %10.0f msg/s  %7.1f MB/s\n", rate, rate*float64(c.size)/1e6)

	p50, p99, rtt, err := latency(ctx, p, c, quiet)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "  send→poll delay    p50 %v  p99 %v   (sync send round trip p50 %v)\n", p50, p99, rtt)
	return nil
}

// diskBaseline writes what the produce run will write, in message-sized writes to a file in
// the data directory, with one fsync at the end, and returns MB/s of bodies.
func diskBaseline(c benchConfig) (float64, error) {
	f, err := os.CreateTemp(c.dataDir, "baseline-")
	if err != nil {
		return 0, fmt.Errorf("bench: disk baseline: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, c.size+150) // a stored message adds about 150 bytes of header and properties
	start := time.Now()
	for range c.messages {
		if _, err := f.Write(buf); err != nil {
			return 0, fmt.Errorf("bench: disk baseline: %w", err)
		}
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("bench: disk baseline: %w", err)
	}
	return float64(c.messages) * float64(c.size) / 1e6 / time.Since(start).Seconds(), nil
}

func produce(ctx context.Context, p *producer.Producer, topic string, c benchConfig) (float64, error) {
	body := make([]byte, c.size)
	if _, err := p.Send(ctx, &producer.Message{Topic: topic, Body: body}); err != nil { // creates the topic
		return 0, fmt.Errorf("bench: first send: %w", err)
	}
	sem := make(chan struct{}, c.inflight)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	start := time.Now()
	for i := 1; i < c.messages; i++ {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		wg.Add(1)
		p.SendAsync(ctx, &producer.Message{Topic: topic, Body: body}, func(_ producer.SendResult, err error) {
			if err != nil {
				mu.Lock()
				firstErr = cmpOr(firstErr, err)
				mu.Unlock()
			}
			<-sem
			wg.Done()
		})
	}
	wg.Wait()
	if firstErr != nil {
		return 0, fmt.Errorf("bench: produce: %w", firstErr)
	}
	return float64(c.messages-1) / time.Since(start).Seconds(), nil
}

func consume(ctx context.Context, topic string, c benchConfig, log *slog.Logger) (float64, error) {
	lp, err := consumer.NewLitePull(fmt.Sprintf("flowd-bench-%d", time.Now().UnixNano()),
		consumer.WithNameServers(c.namesrv), consumer.WithLogger(log),
		consumer.WithConsumeFrom(consumer.ConsumeFromFirst), consumer.WithPullBatchSize(32))
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	if err := lp.Subscribe(topic, "*"); err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	start := time.Now()
	if err := lp.Start(ctx); err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	defer lp.Close(context.Background())
	got := 0
	for got < c.messages {
		msgs, err := lp.Poll(ctx)
		if err != nil {
			return 0, fmt.Errorf("bench: poll after %d messages: %w", got, err)
		}
		got += len(msgs)
	}
	return float64(got) / time.Since(start).Seconds(), nil
}

// latency sends messages one at a time carrying their send time and measures when a lite-pull
// consumer, already caught up and long polling, hands each out.
func latency(ctx context.Context, p *producer.Producer, c benchConfig, log *slog.Logger) (p50, p99, rtt time.Duration, err error) {
	topic := fmt.Sprintf("flowd-bench-lat-%d", time.Now().UnixNano())
	body := make([]byte, max(c.size, 8))
	if _, err := p.Send(ctx, &producer.Message{Topic: topic, Body: body}); err != nil {
		return 0, 0, 0, fmt.Errorf("bench: latency topic: %w", err)
	}
	lp, err := consumer.NewLitePull(fmt.Sprintf("flowd-bench-lat-%d", time.Now().UnixNano()),
		consumer.WithNameServers(c.namesrv), consumer.WithLogger(log), consumer.WithConsumeFrom(consumer.ConsumeFromLast))
	if err != nil {
		return 0, 0, 0, fmt.Errorf("bench: %w", err)
	}
	if err := lp.Subscribe(topic, "*"); err != nil {
		return 0, 0, 0, fmt.Errorf("bench: %w", err)
	}
	if err := lp.Start(ctx); err != nil {
		return 0, 0, 0, fmt.Errorf("bench: %w", err)
	}
	defer lp.Close(context.Background())
	time.Sleep(500 * time.Millisecond) // let it take its queues and park its pulls

	origin := time.Now()
	delays := make([]time.Duration, 0, c.samples)
	rtts := make([]time.Duration, 0, c.samples)
	received := make(chan struct{})
	var pollErr error
	go func() {
		defer close(received)
		for len(delays) < c.samples {
			msgs, err := lp.Poll(ctx)
			if err != nil {
				pollErr = err
				return
			}
			now := time.Since(origin)
			for _, m := range msgs {
				delays = append(delays, now-time.Duration(binary.BigEndian.Uint64(m.Body)))
			}
		}
	}()
	for range c.samples {
		binary.BigEndian.PutUint64(body, uint64(time.Since(origin)))
		start := time.Now()
		if _, err := p.Send(ctx, &producer.Message{Topic: topic, Body: body}); err != nil {
			return 0, 0, 0, fmt.Errorf("bench: latency send: %w", err)
		}
		rtts = append(rtts, time.Since(start))
		time.Sleep(200 * time.Microsecond)
	}
	select {
	case <-received:
	case <-time.After(30 * time.Second):
		return 0, 0, 0, errors.New("bench: the consumer did not receive every latency sample within 30 s")
	}
	if pollErr != nil {
		return 0, 0, 0, fmt.Errorf("bench: latency poll: %w", pollErr)
	}
	slices.Sort(delays)
	slices.Sort(rtts)
	at := func(d []time.Duration, q float64) time.Duration { return d[int(q*float64(len(d)-1))] }
	return at(delays, 0.5), at(delays, 0.99), at(rtts, 0.5), nil
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
