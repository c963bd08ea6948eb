package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/broker/store"
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
	// syncBroker is the embedded broker whose store is in SYNC_FLUSH, started by the first
	// sync-flush scenario.
	syncBroker *broker.Broker
	fsyncRate  float64 // disk-fsync writes/s, once measured
	// asyncTopic and jsSubject hold, per message size, what the single-producer async run
	// wrote, for the consume scenario of that size to read.
	asyncTopic map[int]string
	jsSubject  map[int]string
	// jsAsync is JetStream's async produce rate per (size, producers): the baseline of the
	// batched runs too, JetStream having no batching of its own in this comparison.
	jsAsync map[[2]int]float64
}

func (r *benchRun) close() {
	if r.syncBroker != nil {
		_ = r.syncBroker.Shutdown(context.Background())
	}
	if r.js != nil {
		r.js.close()
	}
}

func (r *benchRun) run(ctx context.Context, sc benchScenario) ([]benchResult, error) {
	c := r.c
	switch sc.kind {
	case "disk-write":
		rate, err := diskWrite(c, sc.size)
		if err != nil {
			return nil, err
		}
		res := newResult(sc.name, "rec/s", rate, "", 0)
		res.Size, res.Durability = sc.size, durNone
		return []benchResult{res}, nil
	case "disk-fsync":
		rate, err := r.diskFsyncRate()
		if err != nil {
			return nil, err
		}
		res := newResult(sc.name, "rec/s", rate, "", 0)
		res.Size, res.Durability = sc.size, durFsync
		return []benchResult{res}, nil
	case "produce":
		return r.produce(ctx, sc)
	case "consume":
		return r.consume(ctx, sc)
	case "syncflush":
		return r.syncFlush(ctx, sc)
	case "e2e":
		return r.e2e(ctx, sc)
	}
	return nil, fmt.Errorf("bench: unknown scenario kind %q", sc.kind)
}

func (r *benchRun) produce(ctx context.Context, sc benchScenario) ([]benchResult, error) {
	c := r.c
	jsRate := 0.0
	if r.js != nil {
		var err error
		if sc.mode == "batched" {
			jsRate, err = r.jsAsyncRate(ctx, sc.size, sc.producers)
		} else {
			var subject string
			subject, jsRate, err = r.js.produce(ctx, sc.size, sc.mode, sc.producers, c.inflight, c.messages)
			switch {
			case err != nil:
			case sc.mode == "async" && sc.producers == 1:
				r.jsAsync[[2]int{sc.size, 1}] = jsRate
				r.jsSubject[sc.size] = subject
			default:
				if sc.mode == "async" {
					r.jsAsync[[2]int{sc.size, sc.producers}] = jsRate
				}
				err = r.js.purge(ctx, subject)
			}
		}
		if err != nil {
			return nil, err
		}
	}
	topic, rate, err := flowdProduce(ctx, c, c.namesrv, sc.mode, sc.size, sc.producers, r.log)
	if err != nil {
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
	return []benchResult{res}, nil
}

// jsAsyncRate is JetStream's async produce rate at a size and producer count, measured now
// unless an earlier scenario of the run did.
func (r *benchRun) jsAsyncRate(ctx context.Context, size, producers int) (float64, error) {
	if rate, ok := r.jsAsync[[2]int{size, producers}]; ok {
		return rate, nil
	}
	subject, rate, err := r.js.produce(ctx, size, "async", producers, r.c.inflight, r.c.messages)
	if err != nil {
		return 0, err
	}
	r.jsAsync[[2]int{size, producers}] = rate
	return rate, r.js.purge(ctx, subject)
}

func (r *benchRun) consume(ctx context.Context, sc benchScenario) ([]benchResult, error) {
	c := r.c
	topic, ok := r.asyncTopic[sc.size]
	if !ok { // the produce run was not selected: write what to read, unmeasured
		var err error
		if topic, _, err = flowdProduce(ctx, c, c.namesrv, "async", sc.size, 1, r.log); err != nil {
			return nil, err
		}
		r.asyncTopic[sc.size] = topic
	}
	jsRate := 0.0
	if r.js != nil {
		subject, ok := r.jsSubject[sc.size]
		if !ok {
			var err error
			if subject, _, err = r.js.produce(ctx, sc.size, "async", 1, c.inflight, c.messages); err != nil {
				return nil, err
			}
		}
		var err error
		if jsRate, err = r.js.consume(ctx, subject, c.messages); err != nil {
			return nil, err
		}
		delete(r.jsSubject, sc.size)
		if err := r.js.purge(ctx, subject); err != nil {
			return nil, err
		}
	}
	rate, err := consume(ctx, topic, c, r.log)
	if err != nil {
		return nil, err
	}
	res := newResult(sc.name, "msg/s", rate, "jetstream", jsRate)
	res.Size = sc.size
	return []benchResult{res}, nil
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

// syncFlush produces with many synchronous producers to an embedded broker whose store
// acknowledges a message only once an fsync covers it. One fsync covers every append that
// arrived while the previous one ran (group commit), so the figure should be a multiple of
// the disk's fsync-per-write rate, measured just before and just after it (a shared
// disk's rate drifts within a run).
func (r *benchRun) syncFlush(ctx context.Context, sc benchScenario) ([]benchResult, error) {
	var err error
	if r.syncBroker == nil {
		if r.syncBroker, err = startBenchBroker(r.c, "broker-syncflush", store.FlushSync, r.log); err != nil {
			return nil, err
		}
	}
	before, err := diskFsync(r.c)
	if err != nil {
		return nil, err
	}
	fsyncs := r.syncBroker.StoreStats().Fsyncs
	_, rate, err := flowdProduce(ctx, r.c, r.syncBroker.NamesrvAddr(), "sync", sc.size, sc.producers, r.log)
	if err != nil {
		return nil, err
	}
	fsyncs = r.syncBroker.StoreStats().Fsyncs - fsyncs
	after, err := diskFsync(r.c)
	if err != nil {
		return nil, err
	}
	res := newResult(sc.name, "msg/s", rate, "disk-fsync", 2/(1/before+1/after))
	res.BaselineBefore, res.BaselineAfter = before, after
	if fsyncs > 0 { // the first sends of each producer, outside the clock, are counted too
		res.MessagesPerFsync = float64(r.c.messages+sc.producers) / float64(fsyncs)
	}
	res.Size, res.Producers, res.InFlight = sc.size, sc.producers, 1
	res.Durability, res.BaselineDurability = durSyncFlush, durFsync
	return []benchResult{res}, nil
}

func (r *benchRun) e2e(ctx context.Context, sc benchScenario) ([]benchResult, error) {
	h, hs, pc, rt, err := e2eDelay(ctx, r.c, sc.size, r.log)
	if err != nil {
		return nil, err
	}
	var out []benchResult
	for _, q := range []struct {
		suffix string
		pct    float64
	}{{"p50", 50}, {"p99", 99}, {"p999", 99.9}} {
		res := newResult(sc.name+"-"+q.suffix, "ns", float64(h.ValueAtQuantile(q.pct)), "", 0)
		res.Size, res.Producers, res.Durability = sc.size, 1, durAsync
		res.FromSchedule = float64(hs.ValueAtQuantile(q.pct))
		if q.suffix == "p99" { // once, with the figure the target is about
			res.LateSends, res.MaxSendLateness = pc.lateShare(), int64(pc.maxLate)
			res.SchedLatencyP99, res.SchedLatencyMax, res.GCCycles = int64(rt.schedP99), int64(rt.schedMax), rt.gcs
		}
		out = append(out, res)
	}
	return out, nil
}

func newBenchProducer(c benchConfig, namesrv, group string, log *slog.Logger, opts ...producer.Option) (*producer.Producer, error) {
	opts = append([]producer.Option{producer.WithClientOptions(client.WithNameServers(namesrv), client.WithLogger(log)),
		producer.WithDefaultTopicQueues(c.queues), producer.WithMaxInFlightAsync(c.inflight)}, opts...)
	p, err := producer.New(group, opts...)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	return p, nil
}

// flowdProduce sends c.messages bodies of size bytes to a new topic, shared out among
// producers (each its own client and connection): one at a time each ("sync"), or with
// c.inflight awaiting their answer each ("async", "batched"), and returns the topic and
// messages per second once every send is answered.
func flowdProduce(ctx context.Context, c benchConfig, namesrv, mode string, size, producers int, log *slog.Logger) (string, float64, error) {
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
		p, err := newBenchProducer(c, namesrv, fmt.Sprintf("flowd-bench-%d", i), log, opts...)
		if err != nil {
			return "", 0, err
		}
		if err := p.Start(ctx); err != nil {
			return "", 0, fmt.Errorf("bench: %w", err)
		}
		ps = append(ps, p)
		// The first send creates the topic; every producer learns its route outside the clock.
		if _, err := p.Send(ctx, &producer.Message{Topic: topic, Body: body}); err != nil {
			return "", 0, fmt.Errorf("bench: first send: %w", err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, len(ps))
	start := time.Now()
	for i, p := range ps {
		n := c.messages / producers
		if i < c.messages%producers {
			n++
		}
		wg.Go(func() { errs[i] = sendN(ctx, p, topic, body, n, mode, c.inflight) })
	}
	wg.Wait()
	elapsed := time.Since(start)
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
	sem := make(chan struct{}, inflight)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return ctx.Err()
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
	return firstErr
}

func consume(ctx context.Context, topic string, c benchConfig, log *slog.Logger) (float64, error) {
	lp, err := consumer.NewLitePull(fmt.Sprintf("flowd-bench-%d", time.Now().UnixNano()),
		consumer.WithClientOptions(client.WithNameServers(c.namesrv), client.WithLogger(log)),
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

// pacer schedules the sends of the delay scenario: send i is due at start + i×interval. It
// counts the sends made more than lateAfter past their time. Such a send says that the
// sending goroutine did not run in time (the process or the machine stalled, or the sends in
// flight were at their limit) and that the sends it owed went out together as a burst. The
// delay is measured twice: from the send call, which leaves the lateness out (flowd's delay
// for the message it was handed; the burst's queueing is in it), and from the schedule,
// which counts it (the delay an application sending on that schedule would see, stalls of
// its own process included, and a Go timer's wake-up up to a millisecond late on an idle
// process too). A run whose tail is made of bursts tells a stalled machine.
type pacer struct {
	start    time.Time
	interval time.Duration
	sends    int
	late     int           // sends more than lateAfter past their time
	maxLate  time.Duration // the latest send's lateness
}

// lateAfter is the lateness from which a send counts as late: twice the resolution of a Go
// timer in an idle process (the runtime waits in epoll with a millisecond timeout, so a
// sleep of 100 µs may last a millisecond and a little more), which a pacer that runs when
// it asks to does not reach.
const lateAfter = 2 * time.Millisecond

// due is when send i is due.
func (p *pacer) due(i int) time.Time { return p.start.Add(time.Duration(i) * p.interval) }

// sent records that send i went at now.
func (p *pacer) sent(i int, now time.Time) {
	late := now.Sub(p.due(i))
	if late > lateAfter {
		p.late++
	}
	p.maxLate = max(p.maxLate, late)
	p.sends++
}

// lateShare is the share of the sends that were late.
func (p *pacer) lateShare() float64 {
	if p.sends == 0 {
		return 0
	}
	return float64(p.late) / float64(p.sends)
}

// e2eDelay offers c.samples messages at c.rate msg/s (async sends, paced by the clock, late
// sends catching up at once) to a topic a lite-pull consumer is long polling, and returns the
// delays to Poll handing the message out from each send call and from when it was due, and
// how punctual the sends were, and how long goroutines waited to run meanwhile. Each body
// carries both times; one process holds both ends, so the clocks are one.
func e2eDelay(ctx context.Context, c benchConfig, size int, log *slog.Logger) (sent, due *hdrhistogram.Histogram, pc *pacer, rt runtimeDelta, err error) {
	topic := fmt.Sprintf("flowd-bench-e2e-%d", time.Now().UnixNano())
	p, err := newBenchProducer(c, c.namesrv, "flowd-bench-e2e", log)
	if err != nil {
		return nil, nil, nil, rt, err
	}
	if err := p.Start(ctx); err != nil {
		return nil, nil, nil, rt, fmt.Errorf("bench: %w", err)
	}
	defer p.Close(context.Background())
	const (
		stampAt = 0  // 8 bytes: send time, ns since origin
		kindAt  = 8  // 0: warm-up, 1: measured
		dueAt   = 9  // 8 bytes: when the send was due, ns since origin
		minBody = 17 // the fields above
	)
	newBody := func(measured bool) []byte {
		b := make([]byte, max(size, minBody))
		if measured {
			b[kindAt] = 1
		}
		return b
	}
	if _, err := p.Send(ctx, &producer.Message{Topic: topic, Body: newBody(false)}); err != nil {
		return nil, nil, nil, rt, fmt.Errorf("bench: e2e topic: %w", err)
	}
	lp, err := consumer.NewLitePull(fmt.Sprintf("flowd-bench-e2e-%d", time.Now().UnixNano()),
		consumer.WithClientOptions(client.WithNameServers(c.namesrv), client.WithLogger(log)), consumer.WithConsumeFrom(consumer.ConsumeFromLast))
	if err != nil {
		return nil, nil, nil, rt, fmt.Errorf("bench: %w", err)
	}
	if err := lp.Subscribe(topic, "*"); err != nil {
		return nil, nil, nil, rt, fmt.Errorf("bench: %w", err)
	}
	if err := lp.Start(ctx); err != nil {
		return nil, nil, nil, rt, fmt.Errorf("bench: %w", err)
	}
	defer lp.Close(context.Background())

	origin := time.Now()
	hist := hdrhistogram.New(1, int64(time.Minute), 3)
	histDue := hdrhistogram.New(1, int64(time.Minute), 3)
	warm := make(chan struct{}) // closed once a warm-up message arrived from every queue
	done := make(chan error, 1)
	pollCtx, stopPoll := context.WithCancel(ctx)
	defer stopPoll()
	go func() {
		seen := map[int]bool{}
		got := 0
		for got < c.samples {
			msgs, err := lp.Poll(pollCtx)
			if err != nil {
				done <- fmt.Errorf("bench: e2e poll: %w", err)
				return
			}
			now := time.Since(origin)
			for _, m := range msgs {
				if m.Body[kindAt] == 0 {
					if !seen[m.Queue.QueueID] {
						if seen[m.Queue.QueueID] = true; len(seen) == c.queues {
							close(warm)
						}
					}
					continue
				}
				_ = hist.RecordValue(int64(now - time.Duration(binary.BigEndian.Uint64(m.Body[stampAt:]))))
				_ = histDue.RecordValue(int64(now - time.Duration(binary.BigEndian.Uint64(m.Body[dueAt:]))))
				got++
			}
		}
		done <- nil
	}()

	// Until the consumer holds every queue and polls it, a message sent "from last" could
	// be skipped: send warm-up messages until one arrived from each queue.
	warmBy := time.After(30 * time.Second)
	for warming := true; warming; {
		if _, err := p.Send(ctx, &producer.Message{Topic: topic, Body: newBody(false)}); err != nil {
			return nil, nil, nil, rt, fmt.Errorf("bench: e2e warm-up: %w", err)
		}
		select {
		case <-warm:
			warming = false
		case err := <-done:
			return nil, nil, nil, rt, cmpOr(err, errors.New("bench: e2e poller ended during warm-up"))
		case <-warmBy:
			return nil, nil, nil, rt, errors.New("bench: e2e: the consumer did not receive from every queue within 30 s")
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			return nil, nil, nil, rt, ctx.Err()
		}
	}

	sem := make(chan struct{}, c.inflight)
	var mu sync.Mutex
	var sendErr error
	before := readRuntime()
	pc = &pacer{start: time.Now(), interval: time.Second / time.Duration(c.rate)}
	for i := range c.samples {
		if d := time.Until(pc.due(i)); d > 0 {
			time.Sleep(d)
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return nil, nil, nil, rt, ctx.Err()
		}
		body := newBody(true)
		now := time.Now()
		pc.sent(i, now)
		binary.BigEndian.PutUint64(body[stampAt:], uint64(now.Sub(origin)))
		binary.BigEndian.PutUint64(body[dueAt:], uint64(pc.due(i).Sub(origin)))
		p.SendAsync(ctx, &producer.Message{Topic: topic, Body: body}, func(_ producer.SendResult, err error) {
			if err != nil {
				mu.Lock()
				sendErr = cmpOr(sendErr, err)
				mu.Unlock()
			}
			<-sem
		})
	}
	select {
	case err := <-done:
		if err != nil {
			return nil, nil, nil, rt, err
		}
	case <-time.After(30 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		return nil, nil, nil, rt, cmpOr(sendErr, errors.New("bench: e2e: the consumer did not receive every message within 30 s"))
	case <-ctx.Done():
		return nil, nil, nil, rt, ctx.Err()
	}
	return hist, histDue, pc, before.until(readRuntime()), nil
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
