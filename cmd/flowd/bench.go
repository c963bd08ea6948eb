package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
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
	samples  int    // latency samples
	baseline string // "jetstream" or "none"
	batch    int    // WithAsyncBatching count of the batched produce run; < 2: no such run
	json     bool   // print one JSON document instead of text
	profile  string // write a CPU profile of each flowd run to profile.<scenario>
}

// benchResult is one figure of a run, in the --json document. The schema is stable: fields
// are only ever added. Baseline and Ratio are null when the run had no baseline for the
// scenario.
type benchResult struct {
	Scenario string   `json:"scenario"`
	Unit     string   `json:"unit"`
	Flowd    float64  `json:"flowd"`
	Baseline *float64 `json:"baseline"`
	Ratio    *float64 `json:"ratio"`
	// BaselineName says what Baseline measured: "jetstream" (embedded NATS JetStream) or
	// "disk" (sequential writes to the data directory).
	BaselineName string `json:"baseline_name,omitempty"`
}

// benchReport is the --json document.
type benchReport struct {
	Messages int           `json:"messages"`
	Size     int           `json:"size"`
	InFlight int           `json:"inflight"`
	Queues   int           `json:"queues"`
	Results  []benchResult `json:"results"`
}

// benchLabel names a scenario in the text output.
func benchLabel(scenario string) string {
	switch scenario {
	case "produce":
		return "produce (async)"
	case "produce-batched":
		return "produce (async, batched)"
	case "consume":
		return "consume (poll)"
	case "send-to-poll-p50":
		return "send→poll delay p50"
	case "send-to-poll-p99":
		return "send→poll delay p99"
	case "send-round-trip-p50":
		return "sync send round trip p50"
	}
	return scenario
}

func newResult(scenario, unit string, flowd float64, baselineName string, baseline float64) benchResult {
	r := benchResult{Scenario: scenario, Unit: unit, Flowd: flowd}
	if baselineName != "" && baseline > 0 {
		ratio := flowd / baseline
		r.Baseline, r.Ratio, r.BaselineName = &baseline, &ratio, baselineName
	}
	return r
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
	fs.StringVar(&c.baseline, "baseline", "jetstream", `what to compare with: "jetstream" (an embedded NATS JetStream, file store, one replica, under the data directory) or "none"`)
	fs.IntVar(&c.batch, "batch", 64, "messages per batch of the batched produce run (producer.WithAsyncBatching); below 2: no batched run")
	fs.StringVar(&c.profile, "cpuprofile", "", "write a CPU profile of each flowd run (broker and client, in this process) to `FILE`.produce, FILE.produce-batched and FILE.consume")
	fs.BoolVar(&c.json, "json", false, `print one JSON document {"messages","size","inflight","queues","results":[{"scenario","unit","flowd","baseline","ratio","baseline_name"}]} instead of text`)
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
	case c.baseline != "jetstream" && c.baseline != "none":
		return fmt.Errorf(`bench: --baseline %q must be "jetstream" or "none"`, c.baseline)
	case c.samples < 1:
		return fmt.Errorf("bench: --latency-samples %d must be positive", c.samples)
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
	text := stdout
	if c.json {
		text = io.Discard
	}
	fmt.Fprintf(text, "flowd bench: %d messages of %d B, %d in flight, %d queues, name server %s\n", c.messages, c.size, c.inflight, c.queues, c.namesrv)
	report := benchReport{Messages: c.messages, Size: c.size, InFlight: c.inflight, Queues: c.queues}
	add := func(r benchResult, detail string) {
		report.Results = append(report.Results, r)
		label := benchLabel(r.Scenario)
		line := fmt.Sprintf("  %-22s %10.0f %-6s", label, r.Flowd, r.Unit)
		if r.Unit == "ns" {
			line = fmt.Sprintf("  %-22s %10v", label, time.Duration(r.Flowd).Round(time.Microsecond))
		}
		if r.Ratio != nil {
			line += fmt.Sprintf("  %s %.0f  ratio %.2f×", r.BaselineName, *r.Baseline, *r.Ratio)
		}
		fmt.Fprintln(text, line+detail)
	}

	base, err := diskBaseline(c)
	if err != nil {
		return err
	}
	fmt.Fprintf(text, "  disk baseline          %10.1f MB/s   sequential %d B writes to the data directory\n", base, c.size+150)

	var js *jetStreamPeer
	if c.baseline == "jetstream" {
		if js, err = startJetStream(ctx, c); err != nil {
			return err
		}
		defer js.close()
	}
	jsProduce, jsConsume := 0.0, 0.0
	if js != nil {
		if jsProduce, err = js.produce(ctx, c); err != nil {
			return err
		}
	}

	runProduce := func(scenario string, opts ...producer.Option) (string, error) {
		opts = append([]producer.Option{producer.WithNameServers(c.namesrv), producer.WithLogger(quiet),
			producer.WithDefaultTopicQueues(c.queues), producer.WithMaxInFlightAsync(c.inflight)}, opts...)
		p, err := producer.New("flowd-bench", opts...)
		if err != nil {
			return "", fmt.Errorf("bench: %w", err)
		}
		if err := p.Start(ctx); err != nil {
			return "", fmt.Errorf("bench: %w", err)
		}
		defer p.Close(context.Background())
		topic := fmt.Sprintf("flowd-bench-%d", time.Now().UnixNano())
		stop, err := startProfile(c.profile, scenario)
		if err != nil {
			return "", err
		}
		rate, err := produce(ctx, p, topic, c)
		stop()
		if err != nil {
			return "", err
		}
		mbs := rate * float64(c.size) / 1e6
		add(newResult(scenario, "msg/s", rate, c.baseline, jsProduce), fmt.Sprintf("   (%.1f MB/s, %.2f× the disk baseline)", mbs, mbs/base))
		return topic, nil
	}
	topic, err := runProduce("produce")
	if err != nil {
		return err
	}
	if c.batch >= 2 {
		if _, err := runProduce("produce-batched", producer.WithAsyncBatching(c.batch, 256<<10, 0)); err != nil {
			return err
		}
	}

	if js != nil {
		if jsConsume, err = js.consume(ctx, c); err != nil {
			return err
		}
	}
	stop, err := startProfile(c.profile, "consume")
	if err != nil {
		return err
	}
	rate, err := consume(ctx, topic, c, quiet)
	stop()
	if err != nil {
		return err
	}
	add(newResult("consume", "msg/s", rate, c.baseline, jsConsume), "")

	p, err := producer.New("flowd-bench-latency", producer.WithNameServers(c.namesrv), producer.WithLogger(quiet), producer.WithDefaultTopicQueues(c.queues))
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := p.Start(ctx); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer p.Close(context.Background())
	p50, p99, rtt, err := latency(ctx, p, c, quiet)
	if err != nil {
		return err
	}
	add(newResult("send-to-poll-p50", "ns", float64(p50), "", 0), "")
	add(newResult("send-to-poll-p99", "ns", float64(p99), "", 0), "")
	add(newResult("send-round-trip-p50", "ns", float64(rtt), "", 0), "")
	if c.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(report); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
	}
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

// startProfile starts a CPU profile written to file.scenario, and returns what stops it; with
// no file it does nothing.
func startProfile(file, scenario string) (stop func(), err error) {
	if file == "" {
		return func() {}, nil
	}
	f, err := os.Create(file + "." + scenario)
	if err != nil {
		return nil, fmt.Errorf("bench: cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("bench: cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
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
