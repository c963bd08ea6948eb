package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/producer"
)

// benchRun is the state of one "flowd bench" run: the peers it started and the figures later
// scenarios compare with or read from.
type benchRun struct {
	c   benchConfig
	log *slog.Logger
	js  *jetStreamPeer // nil with --baseline none
	// syncBroker is the broker whose store is in SYNC_FLUSH, started by the first sync-flush
	// scenario.
	syncBroker *syncTarget
	fsyncRate  float64 // disk-fsync writes/s, once measured
	// asyncTopic and jsSubject hold, per message size, what the single-producer async run
	// wrote, for the consume scenario of that size to read.
	asyncTopic map[int]string
	jsSubject  map[int]string
	// jsAsync is JetStream's async produce rate per (size, producers): the baseline of the
	// batched runs too, JetStream having no batching of its own in this comparison.
	jsAsync map[[2]int]jsFigures
}

func (r *benchRun) close() {
	if r.syncBroker != nil {
		r.syncBroker.stop()
	}
	if r.js != nil {
		r.js.close()
	}
}

// profiled runs a scenario, under a CPU profile of it with --cpuprofile.
func (r *benchRun) profiled(ctx context.Context, sc benchScenario) ([]benchResult, error) {
	stop, err := startProfile(r.c.profile, sc.name)
	if err != nil {
		return nil, err
	}
	results, err := r.run(ctx, sc)
	stop()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sc.name, err)
	}
	return results, nil
}

func (r *benchRun) run(ctx context.Context, sc benchScenario) ([]benchResult, error) {
	switch sc.kind {
	case "disk-write", "disk-fsync":
		return r.disk(sc)
	case "produce":
		return r.produce(ctx, sc)
	case "consume":
		return r.consume(ctx, sc)
	case "syncflush":
		return r.syncFlush(ctx, sc)
	case "e2e":
		return r.e2e(ctx, sc)
	case "grpc-send":
		return r.grpcSend(ctx, sc)
	case "pop":
		return r.grpcPop(ctx, sc)
	case "pop-floor":
		return r.grpcFloor(ctx, sc)
	case "pop-remoting":
		return r.remotingPop(ctx, sc)
	}
	return nil, fmt.Errorf("bench: unknown scenario kind %q", sc.kind)
}

// disk is a disk baseline: records per second written to the data directory, without an
// fsync ("disk-write") or with one after every write ("disk-fsync").
func (r *benchRun) disk(sc benchScenario) ([]benchResult, error) {
	measure, durability := func() (float64, error) { return diskWrite(r.c, sc.size) }, durNone
	if sc.kind == "disk-fsync" {
		measure, durability = r.diskFsyncRate, durFsync
	}
	rate, err := measure()
	if err != nil {
		return nil, err
	}
	res := newResult(sc.name, "rec/s", rate, "", 0)
	res.Size, res.Durability = sc.size, durability
	return []benchResult{res}, nil
}

func (r *benchRun) produce(ctx context.Context, sc benchScenario) ([]benchResult, error) {
	c := r.c
	jsRate := 0.0
	var jw *window
	if r.js != nil {
		var err error
		if sc.mode == "batched" {
			var js jsFigures
			js, err = r.jsAsyncRate(ctx, sc.size, sc.producers)
			jsRate, jw = js.rate, js.w
		} else {
			var subject string
			jw = newWindow(r.js.pid)
			subject, jsRate, err = r.js.produce(ctx, sc.size, sc.mode, sc.producers, c.inflight, c.messages, jw)
			switch {
			case err != nil:
			case sc.mode == "async" && sc.producers == 1:
				r.jsAsync[[2]int{sc.size, 1}] = jsFigures{jsRate, jw}
				r.jsSubject[sc.size] = subject
			default:
				if sc.mode == "async" {
					r.jsAsync[[2]int{sc.size, sc.producers}] = jsFigures{jsRate, jw}
				}
				err = r.js.purge(ctx, subject)
			}
		}
		if err != nil {
			return nil, err
		}
	}
	fw := newWindow(c.brokerPID)
	topic, rate, err := flowdProduce(ctx, c, c.namesrv, sc.mode, sc.size, sc.producers, r.log, fw)
	if err != nil {
		return nil, err
	}
	if err := windowErr(fw, jw); err != nil {
		return nil, err
	}
	if sc.mode == "async" && sc.producers == 1 {
		r.asyncTopic[sc.size] = topic
	}
	res := newResult(sc.name, "msg/s", rate, "jetstream", jsRate)
	res.Size, res.Producers, res.InFlight, res.Durability = sc.size, sc.producers, c.inflight, durAsync
	if sc.mode == "sync" {
		res.InFlight = 1
	}
	if res.Ratio != nil {
		res.BaselineDurability = durJetStream
	}
	res.addCosts(fw, jw, c.messages)
	return []benchResult{res}, nil
}

// jsFigures is what a JetStream async produce run measured: its rate and, in a separate run,
// its processes' costs.
type jsFigures struct {
	rate float64
	w    *window
}

// jsAsyncRate is JetStream's async produce rate at a size and producer count, measured now
// unless an earlier scenario of the run did.
func (r *benchRun) jsAsyncRate(ctx context.Context, size, producers int) (jsFigures, error) {
	if js, ok := r.jsAsync[[2]int{size, producers}]; ok {
		return js, nil
	}
	w := newWindow(r.js.pid)
	subject, rate, err := r.js.produce(ctx, size, "async", producers, r.c.inflight, r.c.messages, w)
	if err != nil {
		return jsFigures{}, err
	}
	r.jsAsync[[2]int{size, producers}] = jsFigures{rate, w}
	return jsFigures{rate, w}, r.js.purge(ctx, subject)
}

func (r *benchRun) consume(ctx context.Context, sc benchScenario) ([]benchResult, error) {
	c := r.c
	topic, ok := r.asyncTopic[sc.size]
	if !ok { // the produce run was not selected: write what to read, unmeasured
		var err error
		if topic, _, err = flowdProduce(ctx, c, c.namesrv, "async", sc.size, 1, r.log, nil); err != nil {
			return nil, err
		}
		r.asyncTopic[sc.size] = topic
	}
	jsRate := 0.0
	var jw *window
	if r.js != nil {
		subject, ok := r.jsSubject[sc.size]
		if !ok {
			var err error
			if subject, _, err = r.js.produce(ctx, sc.size, "async", 1, c.inflight, c.messages, nil); err != nil {
				return nil, err
			}
		}
		var err error
		jw = newWindow(r.js.pid)
		if jsRate, err = r.js.consume(ctx, subject, c.messages, 1, jw); err != nil {
			return nil, err
		}
		delete(r.jsSubject, sc.size)
		if err := r.js.purge(ctx, subject); err != nil {
			return nil, err
		}
	}
	fw := newWindow(c.brokerPID)
	rate, err := consume(ctx, topic, c, r.log, fw)
	if err != nil {
		return nil, err
	}
	return consumeResult(sc, rate, jsRate, fw, jw, c.messages)
}

func (r *benchRun) diskFsyncRate() (float64, error) {
	if r.fsyncRate == 0 {
		rate, err := diskFsync(r.c)
		if err != nil {
			return 0, err
		}
		r.fsyncRate = rate
	}
	return r.fsyncRate, nil
}

func (r *benchRun) e2e(ctx context.Context, sc benchScenario) ([]benchResult, error) {
	d, err := e2eDelay(ctx, r.c, sc.size, r.log)
	if err != nil {
		return nil, err
	}
	var out []benchResult
	for _, q := range []struct {
		suffix string
		pct    float64
	}{{"p50", 50}, {"p99", 99}, {"p999", 99.9}} {
		res := newResult(sc.name+"-"+q.suffix, "ns", float64(d.sent.ValueAtQuantile(q.pct)), "", 0)
		res.Size, res.Producers, res.Durability = sc.size, 1, durAsync
		res.FromSchedule = float64(d.due.ValueAtQuantile(q.pct))
		if q.suffix == "p99" { // once, with the figure the target is about
			res.LateSends, res.MaxSendLateness = d.pacer.lateShare(), int64(d.pacer.maxLate)
			res.SchedLatencyP99, res.SchedLatencyMax, res.GCCycles = int64(d.runtime.schedP99), int64(d.runtime.schedMax), d.runtime.gcs
		}
		out = append(out, res)
	}
	return out, nil
}

// startBenchProducer starts a producer (its own client and connection) of the bench's
// queues and sends in flight.
func startBenchProducer(ctx context.Context, c benchConfig, namesrv, group string, log *slog.Logger, opts ...producer.Option) (*producer.Producer, error) {
	opts = append([]producer.Option{producer.WithClientOptions(client.WithNameServers(namesrv), client.WithLogger(log)),
		producer.WithDefaultTopicQueues(c.queues), producer.WithMaxInFlightAsync(c.inflight)}, opts...)
	p, err := producer.New(group, opts...)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if err := p.Start(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("bench: %w", err), p.Close(context.Background()))
	}
	return p, nil
}

// shareOf is producer i's share of messages sent by producers: as even as they divide.
func shareOf(messages, producers, i int) int {
	n := messages / producers
	if i < messages%producers {
		n++
	}
	return n
}

// flowdProduce sends c.messages bodies of size bytes to a new topic, shared out among
// producers (each its own client and connection): one at a time each ("sync"), or with
// c.inflight awaiting their answer each ("async", "batched"), and returns the topic and
// messages per second once every send is answered.
//
// A non-nil w measures the processes over the timed section.
func flowdProduce(ctx context.Context, c benchConfig, namesrv, mode string, size, producers int, log *slog.Logger, w *window) (string, float64, error) {
	topic := fmt.Sprintf("flowd-bench-%d-%s-%d", size, mode, time.Now().UnixNano())
	var opts []producer.Option
	if mode == "batched" {
		opts = append(opts, producer.WithAsyncBatching(c.batch, 256<<10, 0))
	}
	ps := make([]*producer.Producer, 0, producers)
	defer func() {
		for _, p := range ps {
			_ = p.Close(context.Background())
		}
	}()
	body := make([]byte, size)
	for i := range producers {
		p, err := startBenchProducer(ctx, c, namesrv, fmt.Sprintf("flowd-bench-%d", i), log, opts...)
		if err != nil {
			return "", 0, err
		}
		ps = append(ps, p)
		// The first send creates the topic; every producer learns its route outside the clock.
		if _, err := p.Send(ctx, &producer.Message{Topic: topic, Body: body}); err != nil {
			return "", 0, fmt.Errorf("bench: first send: %w", err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, len(ps))
	w.begin()
	start := time.Now()
	for i, p := range ps {
		n := shareOf(c.messages, producers, i)
		wg.Go(func() { errs[i] = sendN(ctx, p, topic, body, n, mode, c.inflight) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	w.end()
	if err := errors.Join(errs...); err != nil {
		return "", 0, fmt.Errorf("bench: produce: %w", err)
	}
	return topic, float64(c.messages) / elapsed.Seconds(), nil
}

// sendN sends n messages with one producer: each waiting for its answer ("sync"), or with up
// to inflight awaiting theirs.
func sendN(ctx context.Context, p *producer.Producer, topic string, body []byte, n int, mode string, inflight int) error {
	if mode == "sync" {
		for range n {
			if _, err := p.Send(ctx, &producer.Message{Topic: topic, Body: body}); err != nil {
				return err
			}
		}
		return nil
	}
	sends := newAsyncSends(inflight)
	for range n {
		if err := sends.acquire(ctx); err != nil {
			sends.wait()
			return err
		}
		p.SendAsync(ctx, &producer.Message{Topic: topic, Body: body}, sends.answered)
	}
	return sends.wait()
}

// asyncSends bounds the asynchronous sends awaiting their answer and keeps the first error
// among the answers.
type asyncSends struct {
	slots chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	err   error
}

func newAsyncSends(inflight int) *asyncSends {
	return &asyncSends{slots: make(chan struct{}, inflight)}
}

// acquire waits for a slot for one more send.
func (s *asyncSends) acquire(ctx context.Context) error {
	select {
	case s.slots <- struct{}{}:
		s.wg.Add(1)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// answered is a send's callback: it frees the send's slot.
func (s *asyncSends) answered(_ producer.SendResult, err error) {
	if err != nil {
		s.mu.Lock()
		s.err = cmpOr(s.err, err)
		s.mu.Unlock()
	}
	<-s.slots
	s.wg.Done()
}

// firstErr is the first error answered so far.
func (s *asyncSends) firstErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// wait waits for every send's answer and returns the first error among them.
func (s *asyncSends) wait() error {
	s.wg.Wait()
	return s.firstErr()
}

// consume reads c.messages of topic from its first with a lite-pull consumer, pulling 32 a
// request, and returns messages per second; a non-nil w measures the processes meanwhile.
func consume(ctx context.Context, topic string, c benchConfig, log *slog.Logger, w *window) (float64, error) {
	lp, err := newBenchLitePull(c, fmt.Sprintf("flowd-bench-%d", time.Now().UnixNano()), topic, log,
		consumer.WithConsumeFrom(consumer.ConsumeFromFirst), consumer.WithPullBatchSize(32))
	if err != nil {
		return 0, err
	}
	w.begin()
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
	elapsed := time.Since(start)
	w.end()
	return float64(got) / elapsed.Seconds(), nil
}

// newBenchLitePull is a lite-pull consumer of group subscribed to every message of topic,
// not started yet.
func newBenchLitePull(c benchConfig, group, topic string, log *slog.Logger, opts ...consumer.Option) (*consumer.LitePull, error) {
	opts = append([]consumer.Option{consumer.WithClientOptions(client.WithNameServers(c.namesrv), client.WithLogger(log))}, opts...)
	lp, err := consumer.NewLitePull(group, opts...)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if err := lp.Subscribe(topic, "*"); err != nil {
		return nil, errors.Join(fmt.Errorf("bench: %w", err), lp.Close(context.Background()))
	}
	return lp, nil
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
