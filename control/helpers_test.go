package control

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// freeAddr returns a loopback address whose port was free a moment ago.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// newBroker builds a broker on a fresh directory with its listener on a free loopback port;
// the caller starts it (after attaching a publisher, as the daemon does).
func newBroker(t testing.TB, mod func(*broker.Config)) *broker.Broker {
	t.Helper()
	cfg := broker.Config{
		DataDir: t.TempDir(), Listen: "127.0.0.1:0", NamesrvListen: "off",
		Logger: discardLogger(),
	}
	cfg.Store.SegmentSize = 8 << 20
	if mod != nil {
		mod(&cfg)
	}
	b, err := broker.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, b.Shutdown(ctx))
	})
	return b
}

// openEmbedded runs an embedded NATS server listening on a free loopback port.
func openEmbedded(t testing.TB, mod func(*NATSConfig)) *NATS {
	t.Helper()
	cfg := NATSConfig{Listen: freeAddr(t), StoreDir: t.TempDir(), Logger: discardLogger()}
	if mod != nil {
		mod(&cfg)
	}
	n, err := Open(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, n.Close(ctx))
	})
	return n
}

// startPublisher attaches a publisher to b, starts b and publishes broker.started.
func startPublisher(t testing.TB, n *NATS, b *broker.Broker, mod func(*EventsConfig)) *Publisher {
	t.Helper()
	cfg := EventsConfig{Logger: discardLogger(), OffsetInterval: 20 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	p, err := NewPublisher(context.Background(), n, b, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, p.Close(ctx))
	})
	require.NoError(t, b.Start())
	p.Started()
	return p
}

// externalServer is a nats-server of the test's own, standing for an operator's cluster.
type externalServer struct {
	t    testing.TB
	opts server.Options
	srv  *server.Server
}

func startExternal(t testing.TB, token string) *externalServer {
	t.Helper()
	host, port, err := net.SplitHostPort(freeAddr(t))
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	e := &externalServer{t: t, opts: server.Options{
		ServerName: "external", Host: host, Port: p, Authorization: token,
		JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true,
	}}
	e.start()
	t.Cleanup(e.stop)
	return e
}

func (e *externalServer) start() {
	e.t.Helper()
	opts := e.opts // NewServer keeps and changes its options
	s, err := server.NewServer(&opts)
	require.NoError(e.t, err)
	s.Start()
	require.True(e.t, s.ReadyForConnections(10*time.Second), "external NATS server did not start")
	e.srv = s
}

func (e *externalServer) stop() {
	if e.srv != nil {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
		e.srv = nil
	}
}

func (e *externalServer) url() string {
	return "nats://" + net.JoinHostPort(e.opts.Host, strconv.Itoa(e.opts.Port))
}

// eventLog collects every message on flowd.evt.> seen by its own client connection.
type eventLog struct {
	mu   sync.Mutex
	msgs []*nats.Msg
}

func subscribeEvents(t testing.TB, url string, opts ...nats.Option) *eventLog {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	l := &eventLog{}
	_, err = nc.Subscribe(EventSubjectPrefix+".>", func(m *nats.Msg) {
		l.mu.Lock()
		l.msgs = append(l.msgs, m)
		l.mu.Unlock()
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	return l
}

func (l *eventLog) all() []*nats.Msg {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*nats.Msg(nil), l.msgs...)
}

// wait returns the first message on subject for which match holds, waiting for it.
func (l *eventLog) wait(t testing.TB, subject string, match func(EventData) bool) (*nats.Msg, EventData) {
	t.Helper()
	var got *nats.Msg
	var data EventData
	require.Eventually(t, func() bool {
		for _, m := range l.all() {
			if m.Subject != subject {
				continue
			}
			var d EventData
			require.NoError(t, jsonUnmarshal(m.Data, &d))
			if match == nil || match(d) {
				got, data = m, d
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond, "no event on %s", subject)
	return got, data
}

// rocketmq is a raw RocketMQ client of the broker.
type rocketmq struct {
	t    testing.TB
	cl   *remoting.Client
	addr string
}

func newRocketMQ(t testing.TB, b *broker.Broker) *rocketmq {
	cl := remoting.NewClient(remoting.ClientOptions{})
	t.Cleanup(func() { cl.Close() })
	return &rocketmq{t: t, cl: cl, addr: b.Addr()}
}

func (r *rocketmq) invoke(code protocol.RequestCode, h protocol.Header, body []byte) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := r.cl.Invoke(ctx, r.addr, protocol.NewRequestWith(code, h, body))
	require.NoError(r.t, err)
	require.Equal(r.t, protocol.Success, resp.ResponseCode(), resp.Remark)
}

func (r *rocketmq) createTopic(topic string, queues int32) {
	r.t.Helper()
	r.invoke(protocol.UpdateAndCreateTopic, &protocol.CreateTopicRequestHeader{
		Topic: topic, ReadQueueNums: queues, WriteQueueNums: queues, Perm: protocol.PermRead | protocol.PermWrite,
	}, nil)
}

func (r *rocketmq) deleteTopic(topic string) {
	r.t.Helper()
	r.invoke(protocol.DeleteTopicInBroker, &protocol.DeleteTopicRequestHeader{Topic: topic}, nil)
}

func (r *rocketmq) heartbeat(group, clientID, topic string) {
	r.t.Helper()
	hb := protocol.HeartbeatData{ClientID: clientID, ConsumerDataSet: []protocol.ConsumerData{{
		GroupName: group, ConsumeType: protocol.ConsumeActively, MessageModel: protocol.Clustering,
		ConsumeFromWhere:    protocol.ConsumeFromFirstOffset,
		SubscriptionDataSet: []protocol.SubscriptionData{{Topic: topic, SubString: "*", ExpressionType: "TAG"}},
	}}}
	body, err := hb.Encode()
	require.NoError(r.t, err)
	r.invoke(protocol.HeartBeat, nil, body)
}

func (r *rocketmq) commit(group, topic string, queueID int32, offset int64) {
	r.t.Helper()
	r.invoke(protocol.UpdateConsumerOffset, &protocol.UpdateConsumerOffsetRequestHeader{
		ConsumerGroup: group, Topic: topic, QueueID: queueID, CommitOffset: offset,
	}, nil)
}

func (r *rocketmq) lock(group, clientID string, mqs ...protocol.MessageQueue) {
	r.t.Helper()
	body, err := protocol.MarshalBody(protocol.LockBatchRequestBody{ConsumerGroup: group, ClientID: clientID, MQSet: mqs})
	require.NoError(r.t, err)
	r.invoke(protocol.LockBatchMQ, nil, body)
}
