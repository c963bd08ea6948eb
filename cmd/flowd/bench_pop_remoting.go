package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer/pop"
)

// remotingPopSize is the body size of pop-remoting-<size>; remotingPopReceivers the
// receive loops of pop-remoting-<size>-r<n>.
const (
	remotingPopSize      = 1024
	remotingPopReceivers = 4
)

// remotingPop stores c.messages bodies of sc.size bytes (unmeasured), then receives them all
// with one pop consumer over the remoting protocol (POP_MESSAGE of up to 32, one answer per
// batch), each batch acknowledged with one BATCH_ACK_MESSAGE sent while the next receive is
// under way, next to the same JetStream baseline as pop-1024 (Fetch(32), Ack each). With
// sc.receivers, that many loops receive from the one consumer at once, as an application's
// workers do, and as many loops fetch from JetStream's one durable consumer.
func (r *benchRun) remotingPop(ctx context.Context, sc benchScenario) ([]benchResult, error) {
	c := r.c
	topic, _, err := flowdProduce(ctx, c, c.namesrv, "async", sc.size, 1, r.log, nil)
	if err != nil {
		return nil, err
	}
	jsRate, jw, err := r.jsFetchAck(ctx, sc)
	if err != nil {
		return nil, err
	}
	cons, err := pop.New("flowd-bench-rpop-"+topic, topic, pop.WithClientOptions(client.WithNameServers(c.namesrv), client.WithLogger(r.log)),
		pop.WithInvisibleDuration(time.Minute), pop.WithPollTime(10*time.Second))
	if err != nil {
		return nil, err
	}
	defer cons.Close(context.Background())
	fw := newWindow(c.brokerPID)
	rate, err := remotingPopAll(ctx, cons, c.messages, max(sc.receivers, 1), fw)
	if err != nil {
		return nil, err
	}
	return consumeResult(sc, rate, jsRate, fw, jw, c.messages)
}

// remotingPopAll receives with the given number of loops until n messages came and returns
// messages per second; w measures the processes meanwhile. Each batch is acknowledged on
// another goroutine while its loop's next receive runs, as pop-1024's are; the clock stops
// once every acknowledgement is answered.
func remotingPopAll(ctx context.Context, cons *pop.Consumer, n, receivers int, w *window) (float64, error) {
	acks := make(chan []pop.Message, 2*receivers)
	ackErrs := make(chan error, receivers)
	for range receivers {
		go func() {
			var first error
			for batch := range acks {
				if first == nil {
					first = cons.Ack(ctx, batch...)
				}
			}
			ackErrs <- first
		}()
	}
	// The receives end once n came: the loops still waiting at the broker are let go.
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	var got atomic.Int64
	recvErrs := make([]error, receivers)
	var wg sync.WaitGroup
	w.begin()
	start := time.Now()
	for i := range receivers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if recvErrs[i] = receiveLoop(rctx, cons, int64(n), &got, acks); recvErrs[i] != nil || got.Load() >= int64(n) {
				stop()
			}
		}()
	}
	wg.Wait()
	close(acks)
	errs := recvErrs
	for range receivers {
		errs = append(errs, <-ackErrs)
	}
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	elapsed := time.Since(start)
	w.end()
	return float64(got.Load()) / elapsed.Seconds(), nil
}

// receiveLoop receives batches and hands them to acks until got reaches n or ctx ends.
func receiveLoop(ctx context.Context, cons *pop.Consumer, n int64, got *atomic.Int64, acks chan<- []pop.Message) error {
	for got.Load() < n {
		msgs, err := cons.Receive(ctx, pop.MaxBatch)
		if ctx.Err() != nil && got.Load() >= n {
			return nil // another loop received the last of them
		}
		if err != nil {
			return fmt.Errorf("bench: receive after %d messages: %w", got.Load(), err)
		}
		if len(msgs) == 0 {
			return fmt.Errorf("bench: receive after %d messages: none within the poll time", got.Load())
		}
		acks <- msgs // the ack loops drain acks until it is closed
		got.Add(int64(len(msgs)))
	}
	return nil
}
