package pipeline_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/rlog"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/pipeline"
	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/protocol"
	"github.com/flowd-io/flowd/runtime"
)

func init() { rlog.SetLogLevel("fatal") }

// wait bounds every wait for something asynchronous; waits end as soon as their condition
// holds.
const wait = 20 * time.Second

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func startBroker(t testing.TB, mod func(*broker.Config)) *broker.Broker {
	t.Helper()
	cfg := broker.Config{
		DataDir:       t.TempDir(),
		Listen:        "127.0.0.1:0",
		NamesrvListen: "127.0.0.1:0",
		Logger:        quiet(),
		ClientExpiry:  10 * time.Second,
	}
	cfg.Store.SegmentSize = 16 << 20
	if mod != nil {
		mod(&cfg)
	}
	b, err := broker.New(cfg)
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, b.Shutdown(ctx))
	})
	return b
}

func createTopic(t testing.TB, b *broker.Broker, topic string, queues int) {
	t.Helper()
	c, err := clientcore.New(clientcore.Options{NameServers: []string{b.NamesrvAddr()}, Logger: quiet()})
	require.NoError(t, err)
	defer c.Close(context.Background())
	h := protocol.CreateTopicRequestHeader{Topic: topic, ReadQueueNums: int32(queues), WriteQueueNums: int32(queues), Perm: protocol.PermRead | protocol.PermWrite}
	_, err = c.InvokeOK(context.Background(), b.Addr(), protocol.NewRequestWith(protocol.UpdateAndCreateTopic, &h, nil))
	require.NoError(t, err)
}

func newProducer(t testing.TB, b *broker.Broker) *producer.Producer {
	t.Helper()
	p, err := producer.New("test-producers", producer.WithClientOptions(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet())))
	require.NoError(t, err)
	require.NoError(t, p.Start(context.Background()))
	t.Cleanup(func() { p.Close(context.Background()) })
	return p
}

func send(t testing.TB, p *producer.Producer, m *producer.Message) {
	t.Helper()
	_, err := p.Send(context.Background(), m)
	require.NoError(t, err)
}

// consumerOpts make pipelines react fast in tests.
func consumerOpts() []consumer.Option {
	return []consumer.Option{
		consumer.WithPollTimeout(200 * time.Millisecond),
		consumer.WithLockRetryInterval(50 * time.Millisecond),
		consumer.WithClientOptions(client.WithHeartbeatInterval(time.Second)),
		consumer.WithPullDelays(20*time.Millisecond, 20*time.Millisecond, 200*time.Millisecond),
	}
}

func newManager(t testing.TB, b *broker.Broker, mod func(*pipeline.Options)) *pipeline.Manager {
	t.Helper()
	opts := pipeline.Options{NameServers: []string{b.NamesrvAddr()}, Logger: quiet(), ConsumerOptions: consumerOpts(),
		QueueEnd: func(mq consumer.MessageQueue) (int64, bool) {
			qs, err := b.TopicQueues(mq.Topic)
			if err != nil || mq.QueueID >= len(qs) {
				return 0, false
			}
			return qs[mq.QueueID].MaxOffset, true
		}}
	if mod != nil {
		mod(&opts)
	}
	m, err := pipeline.NewManager(opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		require.NoError(t, m.Close(ctx))
	})
	return m
}

// lines collects JSON lines written by stdout sinks.
type lines struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	recs []pipeline.Record
	// gate, when set, holds every write until it is closed; holding is signalled on held.
	gate atomic.Pointer[chan struct{}]
	held chan struct{}
}

// hold makes writes wait until the returned function is called.
func (l *lines) hold() (release func()) {
	ch := make(chan struct{})
	l.held = make(chan struct{}, 64)
	l.gate.Store(&ch)
	return func() { l.gate.Store(nil); close(ch) }
}

func (l *lines) Write(b []byte) (int, error) {
	if g := l.gate.Load(); g != nil {
		select {
		case l.held <- struct{}{}:
		default:
		}
		<-*g
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(b)
	for {
		line, err := l.buf.ReadBytes('\n')
		if err != nil {
			l.buf.Write(line) // partial: keep it for the next write
			break
		}
		var r pipeline.Record
		if err := json.Unmarshal(line, &r); err != nil {
			return 0, err
		}
		l.recs = append(l.recs, r)
	}
	return len(b), nil
}

func (l *lines) records() []pipeline.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]pipeline.Record(nil), l.recs...)
}

func (l *lines) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.recs)
}

// startNATS starts an embedded nats-server with JetStream on a free loopback port.
func startNATS(t testing.TB) *nats.Conn {
	t.Helper()
	s, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	require.NoError(t, err)
	s.Start()
	t.Cleanup(s.Shutdown)
	require.True(t, s.ReadyForConnections(wait))
	nc, err := nats.Connect(s.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// redactTransform builds examples/wasm/go-redact and loads it as a transform redacting field.
func redactTransform(t testing.TB, field string) *plugins.Transform {
	t.Helper()
	dir := t.TempDir()
	out := filepath.Join(dir, "redact.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, "github.com/flowd-io/flowd/examples/wasm/go-redact")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	o, err := cmd.CombinedOutput()
	require.NoError(t, err, string(o))
	wasm, err := os.ReadFile(out)
	require.NoError(t, err)
	sum := sha256.Sum256(wasm)
	m := &plugins.Manifest{
		Name: "redact", Kind: plugins.KindTransform, Version: "1.0.0", ABI: plugins.ABIVersion,
		Limits:     plugins.Limits{MemoryPages: 512, MaxInstances: 2},
		Parameters: map[string]string{"field": field},
		SHA256:     hex.EncodeToString(sum[:]),
	}
	require.NoError(t, m.Validate())
	rt, err := runtime.New(context.Background(), runtime.Options{CacheDir: filepath.Join(dir, "cache")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	mod, err := rt.Load(context.Background(), m.Spec(wasm))
	require.NoError(t, err)
	slot := &runtime.Slot{}
	require.NoError(t, slot.Swap(context.Background(), mod))
	t.Cleanup(func() { _ = slot.Close(context.Background()) })
	return plugins.NewTransform(slot)
}

// readTopic reads n messages of topic from its first offset with a fresh group.
func readTopic(t testing.TB, b *broker.Broker, topic, group string, n int) []*consumer.Message {
	t.Helper()
	c, err := consumer.NewLitePull(group, append(consumerOpts(), consumer.WithClientOptions(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet())), consumer.WithConsumeFrom(consumer.ConsumeFromFirst))...)
	require.NoError(t, err)
	defer c.Close(context.Background())
	require.NoError(t, c.Subscribe(topic, "*"))
	require.NoError(t, c.Start(context.Background()))
	var out []*consumer.Message
	deadline := time.Now().Add(wait)
	for len(out) < n && time.Now().Before(deadline) {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		msgs, err := c.Poll(ctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			require.NoError(t, err)
		}
		for _, m := range msgs {
			if m.Topic == topic {
				out = append(out, m)
			}
		}
	}
	require.Len(t, out, n)
	return out
}
