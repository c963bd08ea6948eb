package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// jetStreamPeer is the baseline flowd bench compares with: an embedded NATS server with
// JetStream, a file-backed stream of one replica under the bench's data directory (the file
// store's default sync interval: acknowledged in the page cache, as flowd's async flush),
// measured with the same message sizes, counts, producers and sends in flight on the same
// machine in the same run.
type jetStreamPeer struct {
	url    string // the server's client URL
	stop   func() // stops the server
	pid    int    // the server's process in a separate run; 0: this one
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream
	seq    int // numbers the subjects of successive runs
}

const (
	jsStreamName = "FLOWD_BENCH"
	jsSubjects   = "flowdbench.>"
)

// startJetStreamServer starts the baseline's NATS server with JetStream, its file store
// under storeDir, on a free loopback port.
func startJetStreamServer(storeDir string) (*server.Server, error) {
	opts := &server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: storeDir, NoSigs: true, NoLog: true,
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
	return srv, nil
}

// startJetStream starts the baseline: in this process, or in a run with --deploy separate
// in a child process of its own, as flowd's broker is.
func startJetStream(ctx context.Context, c benchConfig) (*jetStreamPeer, error) {
	peer := &jetStreamPeer{}
	storeDir := filepath.Join(c.dataDir, "jetstream")
	if c.deploy == deploySeparate {
		nd, url, err := startJetStreamChild(ctx, c.flowdBin, storeDir)
		if err != nil {
			return nil, err
		}
		peer.url, peer.pid, peer.stop = url, nd.cmd.Process.Pid, nd.kill
	} else {
		srv, err := startJetStreamServer(storeDir)
		if err != nil {
			return nil, err
		}
		peer.url = srv.ClientURL()
		peer.stop = func() {
			srv.Shutdown()
			srv.WaitForShutdown()
		}
	}
	return peer, peer.connect(ctx)
}

// connect connects the peer's control connection and creates the bench's stream.
func (peer *jetStreamPeer) connect(ctx context.Context) error {
	var err error
	if peer.nc, err = nats.Connect(peer.url); err != nil {
		peer.close()
		return fmt.Errorf("bench: connect to JetStream: %w", err)
	}
	if peer.js, err = jetstream.New(peer.nc); err != nil {
		peer.close()
		return fmt.Errorf("bench: JetStream context: %w", err)
	}
	peer.stream, err = peer.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: jsStreamName, Subjects: []string{jsSubjects}, Storage: jetstream.FileStorage, Replicas: 1,
	})
	if err != nil {
		peer.close()
		return fmt.Errorf("bench: create JetStream stream: %w", err)
	}
	return nil
}

func (p *jetStreamPeer) close() {
	if p.nc != nil {
		p.nc.Close()
	}
	p.stop()
}

// jsPublisher is one producer of a JetStream run: its own connection, as each flowd
// producer has its own.
type jsPublisher struct {
	nc *nats.Conn
	js jetstream.JetStream
}

// produce publishes messages bodies of size bytes to a new subject, shared out among
// producers: with Publish, one at a time each ("sync"), or with PublishAsync, at most
// inflight awaiting their acknowledgement each ("async"). It returns the subject and
// messages per second once every one is acknowledged.
// A non-nil w measures the processes over the timed section.
func (p *jetStreamPeer) produce(ctx context.Context, size int, mode string, producers, inflight, messages int, w *window) (string, float64, error) {
	p.seq++
	subject := fmt.Sprintf("flowdbench.%d.%d", size, p.seq)
	body := make([]byte, size)
	var failed atomic.Int64
	var firstErr atomic.Value
	onErr := func(_ jetstream.JetStream, _ *nats.Msg, err error) {
		failed.Add(1)
		firstErr.CompareAndSwap(nil, err)
	}
	pubs := make([]jsPublisher, 0, producers)
	defer func() {
		for _, pub := range pubs {
			pub.nc.Close()
		}
	}()
	for range producers {
		nc, err := nats.Connect(p.url)
		if err != nil {
			return "", 0, fmt.Errorf("bench: connect to JetStream: %w", err)
		}
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(inflight), jetstream.WithPublishAsyncErrHandler(onErr))
		if err != nil {
			nc.Close()
			return "", 0, fmt.Errorf("bench: JetStream context: %w", err)
		}
		pubs = append(pubs, jsPublisher{nc, js})
		if _, err := js.Publish(ctx, subject, body); err != nil { // as flowd's first sends, outside the clock
			return "", 0, fmt.Errorf("bench: JetStream first publish: %w", err)
		}
	}
	errs := make([]error, len(pubs))
	var wg sync.WaitGroup
	w.begin()
	start := time.Now()
	for i, pub := range pubs {
		n := shareOf(messages, producers, i)
		wg.Go(func() { errs[i] = jsPublishN(ctx, pub.js, subject, body, n, mode) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	w.end()
	if err := errors.Join(errs...); err != nil {
		return "", 0, err
	}
	if n := failed.Load(); n > 0 {
		return "", 0, fmt.Errorf("bench: JetStream: %d publishes failed, first: %v", n, firstErr.Load())
	}
	return subject, float64(messages) / elapsed.Seconds(), nil
}

func jsPublishN(ctx context.Context, js jetstream.JetStream, subject string, body []byte, n int, mode string) error {
	if mode == "sync" {
		for range n {
			if _, err := js.Publish(ctx, subject, body); err != nil {
				return fmt.Errorf("bench: JetStream publish: %w", err)
			}
		}
		return nil
	}
	for range n {
		// Blocks while inflight acknowledgements are pending; failures go to onErr. The stall
		// wait is long: on a loaded machine an acknowledgement may take longer than the
		// client's default of 200 ms, and the bench measures throughput, not that bound.
		if _, err := js.PublishAsync(subject, body, jetstream.WithStallWait(30*time.Second)); err != nil {
			return fmt.Errorf("bench: JetStream publish: %w", err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Minute):
		return errors.New("bench: JetStream publishes not acknowledged within a minute")
	}
}

// purge drops a run's messages, so that the data directory holds only what later runs read.
func (p *jetStreamPeer) purge(ctx context.Context, subject string) error {
	if err := p.stream.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
		return fmt.Errorf("bench: JetStream purge: %w", err)
	}
	return nil
}

// consume reads a subject from its start with a durable pull consumer, fetching up to 32
// messages a request (flowd's pull batch in the consume run) and acknowledging each, and
// returns messages per second; a non-nil w measures the processes meanwhile. fetchers
// loops fetch from the one consumer at once (one for every scenario but the pop ones with
// several receivers); the clock stops at the last message's ack.
func (p *jetStreamPeer) consume(ctx context.Context, subject string, messages, fetchers int, w *window) (float64, error) {
	w.begin()
	start := time.Now()
	name := fmt.Sprintf("flowd-bench-%d", p.seq)
	cons, err := p.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: name, AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
		FilterSubject: subject,
	})
	if err != nil {
		return 0, fmt.Errorf("bench: JetStream consumer: %w", err)
	}
	var (
		got     atomic.Int64
		done    = make(chan struct{})
		once    sync.Once
		elapsed time.Duration
		wg      sync.WaitGroup
		errs    = make([]error, max(fetchers, 1))
	)
	finish := func() {
		once.Do(func() {
			elapsed = time.Since(start)
			w.end()
			close(done)
		})
	}
	for f := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fetchAcking(cons, int64(messages), &got, done, finish); err != nil {
				errs[f] = err
				finish()
			}
		}()
	}
	<-done
	// Deleting the consumer ends the fetches still waiting for messages that will not come.
	_ = p.stream.DeleteConsumer(context.Background(), name)
	wg.Wait()
	if err := errors.Join(errs...); err != nil && got.Load() < int64(messages) {
		return 0, err
	}
	return float64(got.Load()) / elapsed.Seconds(), nil
}

// fetchAcking fetches batches of up to 32 from cons and acknowledges each message until got
// reaches messages (then it calls finish) or done is closed.
func fetchAcking(cons jetstream.Consumer, messages int64, got *atomic.Int64, done <-chan struct{}, finish func()) error {
	for {
		select {
		case <-done:
			return nil
		default:
		}
		left := messages - got.Load()
		if left <= 0 {
			return nil
		}
		batch, err := cons.Fetch(int(min(32, left)), jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			return fmt.Errorf("bench: JetStream fetch after %d messages: %w", got.Load(), err)
		}
		n := 0
		for m := range batch.Messages() {
			if err := m.Ack(); err != nil {
				return fmt.Errorf("bench: JetStream ack: %w", err)
			}
			n++
			if got.Add(1) == messages {
				finish()
			}
		}
		if err := batch.Error(); err != nil {
			return fmt.Errorf("bench: JetStream fetch after %d messages: %w", got.Load(), err)
		}
		if n == 0 {
			return fmt.Errorf("bench: JetStream fetch after %d messages: no message within 10 s", got.Load())
		}
	}
}
