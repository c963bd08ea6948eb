package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// jetStreamPeer is the baseline flowd bench compares with: an embedded NATS server with
// JetStream, a file-backed stream of one replica under the bench's data directory, measured
// with the same message size, count and sends in flight on the same machine in the same run.
type jetStreamPeer struct {
	srv    *server.Server
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream
	// failed counts asynchronous publishes that failed; firstErr keeps the first error.
	failed   atomic.Int64
	firstErr atomic.Value
}

const (
	jsStreamName = "FLOWD_BENCH"
	jsSubject    = "flowdbench.produce"
)

func startJetStream(ctx context.Context, c benchConfig) (*jetStreamPeer, error) {
	opts := &server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: filepath.Join(c.dataDir, "jetstream"), NoSigs: true, NoLog: true,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("bench: start JetStream: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("bench: start JetStream: not ready within 10 s")
	}
	peer := &jetStreamPeer{srv: srv}
	if peer.nc, err = nats.Connect(srv.ClientURL()); err != nil {
		peer.close()
		return nil, fmt.Errorf("bench: connect to JetStream: %w", err)
	}
	onErr := func(_ jetstream.JetStream, _ *nats.Msg, err error) {
		peer.failed.Add(1)
		peer.firstErr.CompareAndSwap(nil, err)
	}
	if peer.js, err = jetstream.New(peer.nc, jetstream.WithPublishAsyncMaxPending(c.inflight), jetstream.WithPublishAsyncErrHandler(onErr)); err != nil {
		peer.close()
		return nil, fmt.Errorf("bench: JetStream context: %w", err)
	}
	peer.stream, err = peer.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: jsStreamName, Subjects: []string{jsSubject}, Storage: jetstream.FileStorage, Replicas: 1,
	})
	if err != nil {
		peer.close()
		return nil, fmt.Errorf("bench: create JetStream stream: %w", err)
	}
	return peer, nil
}

func (p *jetStreamPeer) close() {
	if p.nc != nil {
		p.nc.Close()
	}
	p.srv.Shutdown()
	p.srv.WaitForShutdown()
}

// produce publishes c.messages bodies with PublishAsync, at most c.inflight awaiting their
// acknowledgement, and returns messages per second once every one is acknowledged.
func (p *jetStreamPeer) produce(ctx context.Context, c benchConfig) (float64, error) {
	body := make([]byte, c.size)
	if _, err := p.js.Publish(ctx, jsSubject, body); err != nil { // as flowd's first send, outside the clock
		return 0, fmt.Errorf("bench: JetStream first publish: %w", err)
	}
	start := time.Now()
	for i := 1; i < c.messages; i++ {
		// Blocks while c.inflight acknowledgements are pending; failures go to onErr.
		// The stall wait is long: on a loaded machine an acknowledgement may take longer than
		// the client's default of 200 ms, and the bench measures throughput, not that bound.
		if _, err := p.js.PublishAsync(jsSubject, body, jetstream.WithStallWait(30*time.Second)); err != nil {
			return 0, fmt.Errorf("bench: JetStream publish: %w", err)
		}
	}
	select {
	case <-p.js.PublishAsyncComplete():
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(time.Minute):
		return 0, errors.New("bench: JetStream publishes not acknowledged within a minute")
	}
	elapsed := time.Since(start)
	if n := p.failed.Load(); n > 0 {
		return 0, fmt.Errorf("bench: JetStream: %d publishes failed, first: %v", n, p.firstErr.Load())
	}
	return float64(c.messages-1) / elapsed.Seconds(), nil
}

// consume reads the stream from its start with a pull consumer, fetching up to 32 messages a
// request (flowd's pull batch in the consume run) and acknowledging each, and returns messages
// per second.
func (p *jetStreamPeer) consume(ctx context.Context, c benchConfig) (float64, error) {
	start := time.Now()
	cons, err := p.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "flowd-bench", AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return 0, fmt.Errorf("bench: JetStream consumer: %w", err)
	}
	got := 0
	for got < c.messages {
		batch, err := cons.Fetch(min(32, c.messages-got), jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			return 0, fmt.Errorf("bench: JetStream fetch after %d messages: %w", got, err)
		}
		n := 0
		for m := range batch.Messages() {
			if err := m.Ack(); err != nil {
				return 0, fmt.Errorf("bench: JetStream ack: %w", err)
			}
			n++
		}
		if err := batch.Error(); err != nil {
			return 0, fmt.Errorf("bench: JetStream fetch after %d messages: %w", got, err)
		}
		if n == 0 {
			return 0, fmt.Errorf("bench: JetStream fetch after %d messages: no message within 10 s", got)
		}
		got += n
	}
	return float64(got) / time.Since(start).Seconds(), nil
}
