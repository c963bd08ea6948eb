package consumer_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/protocol"
)

func init() {
	// The RocketMQ client logs every connection at info level through a global logger.
	rlog.SetLogLevel("fatal")
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// wait bounds every wait for something asynchronous (a message, a rebalance, a commit):
// generous, since a loaded machine running the race detector can be slow, and free when
// things go well, as the waits end as soon as their condition holds. Tests never assert how
// fast something happens; where a test must tell a reaction from a timer, the timer is set
// far beyond wait.
const wait = 15 * time.Second

func startBroker(t testing.TB, mod func(*broker.Config)) *broker.Broker {
	t.Helper()
	b, err := newBroker(t, mod)
	require.NoError(t, err)
	return b
}

func newBroker(t testing.TB, mod func(*broker.Config)) (*broker.Broker, error) {
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
	if err != nil {
		return nil, err
	}
	if err := b.Start(); err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, b.Shutdown(ctx))
	})
	return b, nil
}

// startBrokerBehindProxy starts a broker whose routes send clients through a proxy (the name
// service is reached directly), so that a test can cut the clients' broker connections.
func startBrokerBehindProxy(t testing.TB) (*broker.Broker, *tcpProxy) {
	t.Helper()
	return startBrokerBehindProxyWith(t, nil)
}

// startBrokerBehindProxyWith is startBrokerBehindProxy with mod applied to the broker's
// configuration first.
func startBrokerBehindProxyWith(t testing.TB, mod func(*broker.Config)) (*broker.Broker, *tcpProxy) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		// A free port for the broker, so that the proxy knows where to forward: another
		// process may take it before the broker binds it, hence the attempts.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		listen := ln.Addr().String()
		require.NoError(t, ln.Close())
		px := startProxy(t, listen)
		b, err := newBroker(t, func(c *broker.Config) {
			if mod != nil {
				mod(c)
			}
			c.Listen, c.AdvertisedAddr = listen, px.addr()
		})
		if err == nil {
			return b, px
		}
		if attempt == 4 {
			require.NoError(t, err)
		}
	}
}

// tcpProxy forwards loopback connections to a target, and can cut them on either side, as
// a network failure would.
type tcpProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu         sync.Mutex
	clientSide []net.Conn
	targetSide []net.Conn
	refusing   bool // new connections are closed at once, as by a host that cannot be reached
}

// refuse makes the proxy close new connections at once (on) or forward them again (off).
func (px *tcpProxy) refuse(on bool) {
	px.mu.Lock()
	defer px.mu.Unlock()
	px.refusing = on
}

func startProxy(t testing.TB, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	px := &tcpProxy{ln: ln, target: target}
	px.wg.Add(1)
	go px.accept()
	t.Cleanup(func() {
		ln.Close()
		px.cutClientSide()
		px.cutTargetSide()
		px.wg.Wait()
	})
	return px
}

func (px *tcpProxy) addr() string { return px.ln.Addr().String() }

func (px *tcpProxy) accept() {
	defer px.wg.Done()
	for {
		c, err := px.ln.Accept()
		if err != nil {
			return
		}
		px.mu.Lock()
		refusing := px.refusing
		px.mu.Unlock()
		if refusing {
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", px.target)
		if err != nil {
			c.Close()
			continue
		}
		px.mu.Lock()
		px.clientSide, px.targetSide = append(px.clientSide, c), append(px.targetSide, up)
		px.mu.Unlock()
		px.wg.Add(2)
		// A side stays open when the other closes: cutting one side is the caller's to do.
		go func() { defer px.wg.Done(); _, _ = io.Copy(up, c) }()
		go func() { defer px.wg.Done(); _, _ = io.Copy(c, up) }()
	}
}

// cutTargetSide closes the connections to the target: the target sees them close, the
// clients do not yet.
func (px *tcpProxy) cutTargetSide() {
	px.mu.Lock()
	defer px.mu.Unlock()
	for _, c := range px.targetSide {
		c.Close()
	}
	px.targetSide = nil
}

// cutClientSide closes the connections to the clients.
func (px *tcpProxy) cutClientSide() {
	px.mu.Lock()
	defer px.mu.Unlock()
	for _, c := range px.clientSide {
		c.Close()
	}
	px.clientSide = nil
}

// admin is a bare client core for topic creation and offset queries.
func admin(t testing.TB, b *broker.Broker) *clientcore.Client {
	t.Helper()
	c, err := clientcore.New(clientcore.Options{NameServers: []string{b.NamesrvAddr()}, Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func createTopic(t testing.TB, b *broker.Broker, topic string, queues int) []consumer.MessageQueue {
	t.Helper()
	c := admin(t, b)
	h := protocol.CreateTopicRequestHeader{Topic: topic, ReadQueueNums: int32(queues), WriteQueueNums: int32(queues), Perm: protocol.PermRead | protocol.PermWrite}
	_, err := c.InvokeOK(context.Background(), b.Addr(), protocol.NewRequestWith(protocol.UpdateAndCreateTopic, &h, nil))
	require.NoError(t, err)
	out := make([]consumer.MessageQueue, queues)
	for i := range out {
		out[i] = consumer.MessageQueue{Topic: topic, BrokerName: "broker-a", QueueID: i}
	}
	return out
}

// brokerOffset reads a group's committed offset straight from the broker; -1 when none.
func brokerOffset(t testing.TB, b *broker.Broker, group string, mq consumer.MessageQueue) int64 {
	t.Helper()
	c := admin(t, b)
	no := false
	h := protocol.QueryConsumerOffsetRequestHeader{ConsumerGroup: group, Topic: mq.Topic, QueueID: int32(mq.QueueID), SetZeroIfNotFound: &no}
	resp, err := c.Invoke(context.Background(), b.Addr(), protocol.NewRequestWith(protocol.QueryConsumerOffset, &h, nil))
	require.NoError(t, err)
	if resp.ResponseCode() == protocol.QueryNotFound {
		return -1
	}
	var out protocol.OffsetResponseHeader
	require.NoError(t, resp.DecodeHeader(&out))
	return out.Offset
}

func newProducer(t testing.TB, b *broker.Broker, opts ...producer.Option) *producer.Producer {
	t.Helper()
	all := append([]producer.Option{
		producer.WithClientOptions(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet())),
		producer.WithQueueSelector(pinSelector{rr: producer.RoundRobin()}),
	}, opts...)
	p, err := producer.New("test-producers", all...)
	require.NoError(t, err)
	require.NoError(t, p.Start(context.Background()))
	t.Cleanup(func() { p.Close(context.Background()) })
	return p
}

// produceTo sends n messages to one queue (bodies prefix-0…), returning the bodies.
func produceTo(t testing.TB, p *producer.Producer, mq consumer.MessageQueue, prefix string, n int, mod func(i int, m *producer.Message)) []string {
	t.Helper()
	var bodies []string
	for i := range n {
		body := fmt.Sprintf("%s-%d", prefix, i)
		m := &producer.Message{Topic: mq.Topic, Body: []byte(body), ShardingKey: fmt.Sprint(mq.QueueID)}
		if mod != nil {
			mod(i, m)
		}
		_, err := p.Send(context.Background(), m)
		require.NoError(t, err)
		bodies = append(bodies, body)
	}
	return bodies
}

// produce sends n messages round robin over the topic's queues.
func produce(t testing.TB, p *producer.Producer, topic, prefix string, n int, mod func(i int, m *producer.Message)) []string {
	t.Helper()
	var bodies []string
	for i := range n {
		body := fmt.Sprintf("%s-%d", prefix, i)
		m := &producer.Message{Topic: topic, Body: []byte(body)}
		if mod != nil {
			mod(i, m)
		}
		_, err := p.Send(context.Background(), m)
		require.NoError(t, err)
		bodies = append(bodies, body)
	}
	return bodies
}

// pinSelector sends a message whose ShardingKey is a number to the queue of that id, and
// the others round robin.
type pinSelector struct{ rr producer.QueueSelector }

func (s pinSelector) Select(m *producer.Message, qs []producer.MessageQueue) producer.MessageQueue {
	if id, err := strconv.Atoi(m.ShardingKey); err == nil {
		for _, q := range qs {
			if q.QueueID == id {
				return q
			}
		}
	}
	return s.rr.Select(m, qs)
}

var instSeq atomic.Int64

func uniqueName(t testing.TB) string { return fmt.Sprintf("%s-%d", t.Name(), instSeq.Add(1)) }

// fastOpts are options that keep tests quick.
func fastOpts(b *broker.Broker) []consumer.Option {
	return []consumer.Option{
		consumer.WithClientOptions(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet())),
		consumer.WithPollTimeout(200 * time.Millisecond),
		consumer.WithLockRetryInterval(50 * time.Millisecond),
		consumer.WithClientOptions(client.WithHeartbeatInterval(time.Second)),
		consumer.WithPullDelays(20*time.Millisecond, 20*time.Millisecond, 200*time.Millisecond),
	}
}

func newConsumer(t testing.TB, b *broker.Broker, group string, opts ...consumer.Option) *consumer.LitePull {
	t.Helper()
	c, err := consumer.NewLitePull(group, append(fastOpts(b), opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Close(ctx)
	})
	return c
}

// pollN polls until n messages arrived or the timeout passed, and returns them.
func pollN(t testing.TB, c *consumer.LitePull, n int, timeout time.Duration) []*consumer.Message {
	t.Helper()
	var out []*consumer.Message
	deadline := time.Now().Add(timeout)
	for len(out) < n && time.Now().Before(deadline) {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		msgs, err := c.Poll(ctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			require.NoError(t, err)
		}
		out = append(out, msgs...)
	}
	return out
}

// pollFor polls for d and returns everything received.
func pollFor(t testing.TB, c *consumer.LitePull, d time.Duration) []*consumer.Message {
	t.Helper()
	return pollN(t, c, 1<<30, d)
}

func bodies(msgs []*consumer.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = string(m.Body)
	}
	return out
}

func sortedBodies(msgs []*consumer.Message) []string {
	out := bodies(msgs)
	slices.Sort(out)
	return out
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}
