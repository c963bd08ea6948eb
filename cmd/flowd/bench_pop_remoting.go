package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer/pop"
)

// remotingPopSize is the body size of pop-remoting-<size>.
const remotingPopSize = 1024

// remotingPop stores c.messages bodies of sc.size bytes (unmeasured), then receives them all
// with one pop consumer over the remoting protocol (POP_MESSAGE of up to 32, one answer per
// batch), each batch acknowledged with one BATCH_ACK_MESSAGE sent while the next receive is
// under way, next to the same JetStream baseline as pop-1024 (Fetch(32), Ack each).
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
	rate, err := remotingPopAll(ctx, cons, c.messages, fw)
	if err != nil {
		return nil, err
	}
	return consumeResult(sc, rate, jsRate, fw, jw, c.messages)
}

// remotingPopAll receives until n messages came and returns messages per second; w measures
// the processes meanwhile. Each batch is acknowledged on another goroutine while the next
// receive runs, as pop-1024's are; the clock stops once every acknowledgement is answered.
func remotingPopAll(ctx context.Context, cons *pop.Consumer, n int, w *window) (float64, error) {
	acks := make(chan []pop.Message, 2)
	ackErr := make(chan error, 1)
	go func() {
		var first error
		for batch := range acks {
			if first == nil {
				first = cons.Ack(ctx, batch...)
			}
		}
		ackErr <- first
	}()
	w.begin()
	start := time.Now()
	got := 0
	err := func() error {
		defer close(acks)
		for got < n {
			msgs, err := cons.Receive(ctx, pop.MaxBatch)
			if err != nil {
				return fmt.Errorf("bench: receive after %d messages: %w", got, err)
			}
			if len(msgs) == 0 {
				return fmt.Errorf("bench: receive after %d messages: none within the poll time", got)
			}
			select {
			case acks <- msgs:
			case <-ctx.Done():
				return ctx.Err()
			}
			got += len(msgs)
		}
		return nil
	}()
	if err := errors.Join(err, <-ackErr); err != nil {
		return 0, err
	}
	elapsed := time.Since(start)
	w.end()
	return float64(got) / elapsed.Seconds(), nil
}
