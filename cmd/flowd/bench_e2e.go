package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/producer"
)

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

// Layout of a delay-scenario message body: each carries both of its times, so the consumer
// needs no other record of the sends.
const (
	e2eStampAt = 0  // 8 bytes: send time, ns since origin
	e2eKindAt  = 8  // 0: warm-up, 1: measured
	e2eDueAt   = 9  // 8 bytes: when the send was due, ns since origin
	e2eMinBody = 17 // the fields above
)

// e2eDelays is what the delay scenario measured: the delays to Poll handing a message out
// from its send call and from when it was due, how punctual the sends were, and how long
// goroutines waited to run meanwhile.
type e2eDelays struct {
	sent, due *hdrhistogram.Histogram
	pacer     *pacer
	runtime   runtimeDelta
}

// e2eRun is the delay scenario under way: a producer sending to a new topic and the
// receiving end of a lite-pull consumer long polling it.
type e2eRun struct {
	c      benchConfig
	size   int
	topic  string
	p      *producer.Producer
	origin time.Time // the zero of the times the bodies carry
	// sent and due are written by receive alone, and read once done said it ended.
	sent, due *hdrhistogram.Histogram
	warm      chan struct{} // closed once a warm-up message arrived from every queue
	done      chan error    // receive's end: nil once every measured message arrived
}

// e2eDelay offers c.samples messages at c.rate msg/s (async sends, paced by the clock, late
// sends catching up at once) to a topic a lite-pull consumer is long polling, and returns the
// delays it measured. One process holds both ends, so the clocks are one.
func e2eDelay(ctx context.Context, c benchConfig, size int, log *slog.Logger) (e2eDelays, error) {
	e := &e2eRun{c: c, size: size, topic: fmt.Sprintf("flowd-bench-e2e-%d", time.Now().UnixNano()),
		warm: make(chan struct{}), done: make(chan error, 1)}
	p, err := startBenchProducer(ctx, c, c.namesrv, "flowd-bench-e2e", log)
	if err != nil {
		return e2eDelays{}, err
	}
	defer p.Close(context.Background())
	e.p = p
	if _, err := p.Send(ctx, &producer.Message{Topic: e.topic, Body: e.body(false)}); err != nil {
		return e2eDelays{}, fmt.Errorf("bench: e2e topic: %w", err)
	}
	lp, err := newBenchLitePull(c, fmt.Sprintf("flowd-bench-e2e-%d", time.Now().UnixNano()), e.topic, log,
		consumer.WithConsumeFrom(consumer.ConsumeFromLast))
	if err != nil {
		return e2eDelays{}, err
	}
	if err := lp.Start(ctx); err != nil {
		return e2eDelays{}, fmt.Errorf("bench: %w", err)
	}
	defer lp.Close(context.Background())

	e.origin = time.Now()
	e.sent, e.due = hdrhistogram.New(1, int64(time.Minute), 3), hdrhistogram.New(1, int64(time.Minute), 3)
	pollCtx, stopPoll := context.WithCancel(ctx)
	defer stopPoll()
	go e.receive(pollCtx, lp)
	if err := e.warmUp(ctx); err != nil {
		return e2eDelays{}, err
	}
	return e.measure(ctx)
}

// body is a delay-scenario message body of the run's size (at least its fields), its times
// not set yet.
func (e *e2eRun) body(measured bool) []byte {
	b := make([]byte, max(e.size, e2eMinBody))
	if measured {
		b[e2eKindAt] = 1
	}
	return b
}

// receive is the consumer's side: it records each measured message's delays as Poll hands it
// out, until c.samples arrived, closing warm once a warm-up message came from every queue.
// It ends by sending to done.
func (e *e2eRun) receive(ctx context.Context, lp *consumer.LitePull) {
	seen := map[int]bool{}
	got := 0
	for got < e.c.samples {
		msgs, err := lp.Poll(ctx)
		if err != nil {
			e.done <- fmt.Errorf("bench: e2e poll: %w", err)
			return
		}
		now := time.Since(e.origin)
		for _, m := range msgs {
			if m.Body[e2eKindAt] == 0 {
				if !seen[m.Queue.QueueID] {
					if seen[m.Queue.QueueID] = true; len(seen) == e.c.queues {
						close(e.warm)
					}
				}
				continue
			}
			_ = e.sent.RecordValue(int64(now - time.Duration(binary.BigEndian.Uint64(m.Body[e2eStampAt:]))))
			_ = e.due.RecordValue(int64(now - time.Duration(binary.BigEndian.Uint64(m.Body[e2eDueAt:]))))
			got++
		}
	}
	e.done <- nil
}

// warmUp sends warm-up messages until one arrived from each queue: until the consumer holds
// every queue and polls it, a message sent "from last" could be skipped.
func (e *e2eRun) warmUp(ctx context.Context) error {
	warmBy := time.After(30 * time.Second)
	for {
		if _, err := e.p.Send(ctx, &producer.Message{Topic: e.topic, Body: e.body(false)}); err != nil {
			return fmt.Errorf("bench: e2e warm-up: %w", err)
		}
		select {
		case <-e.warm:
			return nil
		case err := <-e.done:
			return cmpOr(err, errors.New("bench: e2e poller ended during warm-up"))
		case <-warmBy:
			return errors.New("bench: e2e: the consumer did not receive from every queue within 30 s")
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// measure is the producer's side: c.samples sends on the pacer's schedule, each body stamped
// with when it was sent and when it was due, then the wait for the consumer to have them all.
func (e *e2eRun) measure(ctx context.Context) (e2eDelays, error) {
	sends := newAsyncSends(e.c.inflight)
	before := readRuntime()
	pc := &pacer{start: time.Now(), interval: time.Second / time.Duration(e.c.rate)}
	for i := range e.c.samples {
		if d := time.Until(pc.due(i)); d > 0 {
			time.Sleep(d)
		}
		if err := sends.acquire(ctx); err != nil {
			return e2eDelays{}, err
		}
		body := e.body(true)
		now := time.Now()
		pc.sent(i, now)
		binary.BigEndian.PutUint64(body[e2eStampAt:], uint64(now.Sub(e.origin)))
		binary.BigEndian.PutUint64(body[e2eDueAt:], uint64(pc.due(i).Sub(e.origin)))
		e.p.SendAsync(ctx, &producer.Message{Topic: e.topic, Body: body}, sends.answered)
	}
	select {
	case err := <-e.done:
		if err != nil {
			return e2eDelays{}, err
		}
	case <-time.After(30 * time.Second):
		return e2eDelays{}, cmpOr(sends.firstErr(), errors.New("bench: e2e: the consumer did not receive every message within 30 s"))
	case <-ctx.Done():
		return e2eDelays{}, ctx.Err()
	}
	return e2eDelays{sent: e.sent, due: e.due, pacer: pc, runtime: before.until(readRuntime())}, nil
}
