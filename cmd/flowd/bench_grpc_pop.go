package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

// grpcPop stores c.messages bodies of sc.size bytes (unmeasured), then receives them all over
// gRPC with one consumer of a new group, batches of 32 each acknowledged with one
// AckMessage, next to JetStream's pull consumer with explicit acks on as many stored
// messages, and returns the receive + ack rate.
func (r *benchRun) grpcPop(ctx context.Context, sc benchScenario) ([]benchResult, error) {
	c := r.c
	if c.grpcAddr == "" {
		return nil, errors.New("bench: the gRPC scenarios need the bench's own broker (no --namesrv)")
	}
	topic, _, err := flowdProduce(ctx, c, c.namesrv, "async", sc.size, 1, r.log, nil)
	if err != nil {
		return nil, err
	}
	jsRate, jw, err := r.jsFetchAck(ctx, sc)
	if err != nil {
		return nil, err
	}
	g, err := dialBenchGRPC(c.grpcAddr, fmt.Sprintf("flowd-bench-pop-%d", time.Now().UnixNano()))
	if err != nil {
		return nil, err
	}
	defer g.conn.Close()
	fw := newWindow(c.brokerPID)
	rate, err := g.popAll(ctx, "flowd-bench-pop-"+topic, topic, c.messages, fw)
	if err != nil {
		return nil, err
	}
	return consumeResult(sc, rate, jsRate, fw, jw, c.messages)
}

// jsFetchAck is the pop scenarios' baseline: JetStream's pull consumer with explicit acks
// (Fetch of up to 32, Ack each) on c.messages stored messages of sc.size bytes; 0 and a nil
// window with --baseline none.
func (r *benchRun) jsFetchAck(ctx context.Context, sc benchScenario) (float64, *window, error) {
	if r.js == nil {
		return 0, nil, nil
	}
	c := r.c
	subject, _, err := r.js.produce(ctx, sc.size, "async", 1, c.inflight, c.messages, nil)
	if err != nil {
		return 0, nil, err
	}
	jw := newWindow(r.js.pid)
	rate, err := r.js.consume(ctx, subject, c.messages, max(sc.receivers, 1), jw)
	if err != nil {
		return 0, nil, err
	}
	if err := r.js.purge(ctx, subject); err != nil {
		return 0, nil, err
	}
	return rate, jw, nil
}

// popAll receives messages of topic for group until n came and returns messages per second;
// w measures the processes meanwhile. Each batch is acknowledged with one AckMessage sent
// while the next receive is under way, as a client acknowledging asynchronously does (and
// as JetStream's Ack, a publish that waits for no answer); the clock stops once every
// acknowledgement is answered.
func (g *grpcClient) popAll(ctx context.Context, group, topic string, n int, w *window) (float64, error) {
	acks := make(chan *pb.AckMessageRequest, 2)
	ackErr := make(chan error, 1)
	go func() { ackErr <- g.ackAll(ctx, acks) }()
	w.begin()
	start := time.Now()
	got := 0
	err := func() error {
		defer close(acks)
		for got < n {
			ack, err := g.receive(ctx, group, topic)
			if err != nil {
				return fmt.Errorf("bench: receive after %d messages: %w", got, err)
			}
			if len(ack.Entries) == 0 {
				return fmt.Errorf("bench: receive after %d messages: none within the long poll", got)
			}
			select {
			case acks <- ack:
			case <-ctx.Done():
				return ctx.Err()
			}
			got += len(ack.Entries)
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

// ackAll sends each request of acks until it is closed; after a failure it drains acks and
// returns the failure.
func (g *grpcClient) ackAll(ctx context.Context, acks <-chan *pb.AckMessageRequest) error {
	var first error
	for ack := range acks {
		if first != nil {
			continue
		}
		cctx, cancel := g.call(ctx)
		resp, err := g.api.AckMessage(cctx, ack)
		cancel()
		switch {
		case err != nil:
			first = fmt.Errorf("bench: ack: %w", err)
		case resp.GetStatus().GetCode() != pb.Code_OK:
			first = fmt.Errorf("bench: ack: %v %s", resp.GetStatus().GetCode(), resp.GetStatus().GetMessage())
		}
	}
	return first
}

// receive makes one ReceiveMessage call of up to 32 messages and returns the AckMessage
// request of what came.
func (g *grpcClient) receive(ctx context.Context, group, topic string) (*pb.AckMessageRequest, error) {
	cctx, cancel := g.call(ctx)
	defer cancel()
	stream, err := g.api.ReceiveMessage(cctx, &pb.ReceiveMessageRequest{
		Group: &pb.Resource{Name: group}, MessageQueue: &pb.MessageQueue{Topic: &pb.Resource{Name: topic}},
		FilterExpression: &pb.FilterExpression{Type: pb.FilterType_TAG, Expression: "*"}, BatchSize: grpcPopBatch,
		InvisibleDuration: durationpb.New(time.Minute), LongPollingTimeout: durationpb.New(10 * time.Second),
	})
	if err != nil {
		return nil, err
	}
	ack := &pb.AckMessageRequest{Group: &pb.Resource{Name: group}, Topic: &pb.Resource{Name: topic}}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return ack, nil
		}
		if err != nil {
			return nil, err
		}
		if st := resp.GetStatus(); st != nil && st.GetCode() != pb.Code_OK && st.GetCode() != pb.Code_MESSAGE_NOT_FOUND {
			return nil, fmt.Errorf("%v %s", st.GetCode(), st.GetMessage())
		}
		if m := resp.GetMessage(); m != nil {
			sp := m.GetSystemProperties()
			ack.Entries = append(ack.Entries, &pb.AckMessageEntry{MessageId: sp.GetMessageId(), ReceiptHandle: sp.GetReceiptHandle()})
		}
	}
}
