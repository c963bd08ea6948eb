package cluster_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/rlog"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/cluster"
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

func init() {
	// The RocketMQ client logs every connection at info level through a global logger.
	rlog.SetLogLevel("fatal")
}

// wait is how long a test waits for something that should happen within a second or a
// TTL: generous, since the machine may be loaded.
const wait = 30 * time.Second

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// startNATS runs an embedded NATS server on a free loopback port, JetStream on unless
// noJetStream.
func startNATS(t testing.TB, noJetStream bool) *natsserver.Server {
	t.Helper()
	s, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, JetStream: !noJetStream, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	require.NoError(t, err)
	s.Start()
	require.True(t, s.ReadyForConnections(wait))
	t.Cleanup(s.Shutdown)
	return s
}

func connect(t testing.TB, s *natsserver.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// node is one broker with its member, as one flowd serve would run them.
type node struct {
	b  *broker.Broker
	m  *cluster.Member
	nc *nats.Conn
	ev chan cluster.Event
}

// startNode starts a broker named name on free loopback ports, with a member of its own
// NATS connection, and joins it.
func startNode(t *testing.T, s *natsserver.Server, name string, mod func(*cluster.Options)) *node {
	t.Helper()
	n, err := newNode(t, s, name, mod)
	require.NoError(t, err)
	return n
}

func newNode(t *testing.T, s *natsserver.Server, name string, mod func(*cluster.Options)) (*node, error) {
	t.Helper()
	n := &node{nc: connect(t, s), ev: make(chan cluster.Event, 256)}
	opts := cluster.Options{Conn: n.nc, Logger: quiet, TTL: 2 * time.Second, HeartbeatInterval: 300 * time.Millisecond, RetryInterval: 200 * time.Millisecond,
		OnEvent: func(e cluster.Event) {
			select {
			case n.ev <- e:
			default:
			}
		}}
	if mod != nil {
		mod(&opts)
	}
	m, err := cluster.New(opts)
	require.NoError(t, err)
	n.m = m
	cfg := broker.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", NamesrvListen: "127.0.0.1:0", BrokerName: name, Logger: quiet, Peers: m}
	cfg.Store.SegmentSize = 8 << 20
	n.b, err = broker.New(cfg)
	require.NoError(t, err)
	require.NoError(t, n.b.Start())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		_ = m.Close(ctx) // a test may have closed it, or its connection, already
		require.NoError(t, n.b.Shutdown(ctx))
	})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	return n, m.Join(ctx, n.b)
}

// route asks the node's name service for a topic's route; nil when it has none.
func (n *node) route(t *testing.T, topic string) *protocol.TopicRouteData {
	t.Helper()
	resp := n.call(t, protocol.GetRouteInfoByTopic, &protocol.GetRouteInfoRequestHeader{Topic: topic})
	if resp.ResponseCode() == protocol.TopicNotExist {
		return nil
	}
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	r, err := protocol.DecodeTopicRouteData(resp.Body)
	require.NoError(t, err)
	return r
}

func (n *node) call(t *testing.T, code protocol.RequestCode, h protocol.Header) *protocol.Command {
	t.Helper()
	cl := remoting.NewClient(remoting.ClientOptions{})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	resp, err := cl.Invoke(ctx, n.b.NamesrvAddr(), protocol.NewRequestWith(code, h, nil))
	require.NoError(t, err)
	return resp
}

// brokersOf lists the broker names of a route's queue data, in its order.
func brokersOf(r *protocol.TopicRouteData) []string {
	if r == nil {
		return nil
	}
	var out []string
	for _, q := range r.QueueDatas {
		out = append(out, q.BrokerName)
	}
	return out
}

// waitEvent waits for an event of type typ about broker name.
func (n *node) waitEvent(t *testing.T, typ cluster.EventType, name string) cluster.Event {
	t.Helper()
	timeout := time.After(wait)
	for {
		select {
		case e := <-n.ev:
			if e.Type == typ && e.Broker.Name == name {
				return e
			}
		case <-timeout:
			t.Fatalf("no %s event for %s", typ, name)
		}
	}
}

// sendRaw sends one message to topic on the broker at addr, auto-creating the topic.
func sendRaw(t *testing.T, addr, topic, body string) {
	t.Helper()
	cl := remoting.NewClient(remoting.ClientOptions{})
	defer cl.Close()
	h := &protocol.SendMessageRequestHeader{
		ProducerGroup: "raw", Topic: topic, DefaultTopic: protocol.AutoCreateTopicKey, DefaultTopicQueueNums: 4,
		BornTimestamp: time.Now().UnixMilli(), Properties: protocol.EncodeProperties(map[string]string{}),
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	resp, err := cl.Invoke(ctx, addr, protocol.NewRequestWith(protocol.SendMessage, h, []byte(body)))
	require.NoError(t, err)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
}
