package grpcserver_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/internal/grpcserver"
	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
	"github.com/flowd-io/flowd/protocol"
)

// env is a broker with its remoting listener and a gRPC endpoint on free loopback ports,
// and a generated client of the endpoint.
type env struct {
	b      *broker.Broker
	srv    *grpcserver.Server
	client pb.MessagingServiceClient
	addr   string
}

func start(t testing.TB, mod func(*broker.Config)) *env {
	t.Helper()
	return startGRPC(t, mod, nil)
}

// startGRPC is start with gmod applied to the gRPC server's configuration.
func startGRPC(t testing.TB, mod func(*broker.Config), gmod func(*grpcserver.Config)) *env {
	t.Helper()
	cfg := broker.Config{
		DataDir:                  t.TempDir(),
		Listen:                   "127.0.0.1:0",
		NamesrvListen:            "off",
		Logger:                   slog.New(slog.NewTextHandler(io.Discard, nil)),
		DelayLevels:              "1s 2s 3s",
		TransactionTimeout:       time.Second,
		TransactionCheckInterval: 200 * time.Millisecond,
	}
	cfg.Store.SegmentSize = 8 << 20
	if mod != nil {
		mod(&cfg)
	}
	b, err := broker.New(cfg)
	require.NoError(t, err)
	require.NoError(t, b.Start())
	gcfg := grpcserver.Config{Broker: b, Logger: cfg.Logger}
	if gmod != nil {
		gmod(&gcfg)
	}
	srv, err := grpcserver.New(gcfg)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv.Serve(ln)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = conn.Close()
		require.NoError(t, srv.Shutdown(ctx))
		require.NoError(t, b.Shutdown(ctx))
	})
	return &env{b: b, srv: srv, client: pb.NewMessagingServiceClient(conn), addr: ln.Addr().String()}
}

// ctx is a call context with the client id header a RocketMQ 5 client sends.
func callCtx(t testing.TB, clientID string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return metadata.AppendToOutgoingContext(ctx, "x-mq-client-id", clientID, "x-mq-protocol", "v2")
}

func (e *env) topic(t testing.TB, name string, queues int) {
	t.Helper()
	require.NoError(t, e.b.CreateTopic(broker.TopicConfig{Name: name, ReadQueueNums: queues, WriteQueueNums: queues, Perm: protocol.PermRead | protocol.PermWrite}))
}

func res(name string) *pb.Resource { return &pb.Resource{Name: name} }

func strp(s string) *string { return &s }

// message is a 5.x message as a client makes it.
func message(topic, id, body string) *pb.Message {
	return &pb.Message{
		Topic: res(topic),
		SystemProperties: &pb.SystemProperties{
			MessageId:    id,
			MessageType:  pb.MessageType_NORMAL,
			BodyEncoding: pb.Encoding_IDENTITY,
		},
		Body: []byte(body),
	}
}

// stored waits until topic's queues hold n messages (dispatch to the consume queues is
// asynchronous) and returns them.
func (e *env) stored(t testing.TB, topic string, n int) []*protocol.MessageExt {
	t.Helper()
	tc, found := e.b.Topic(topic)
	require.True(t, found)
	var all []*protocol.MessageExt
	require.Eventually(t, func() bool {
		all = all[:0]
		for q := range tc.ReadQueueNums {
			r, err := e.b.ReadQueue(context.Background(), topic, int32(q), 0, 1000)
			require.NoError(t, err)
			all = append(all, r.Messages...)
		}
		return len(all) >= n
	}, 10*time.Second, 20*time.Millisecond)
	require.Len(t, all, n)
	return all
}

func withNamesrv(c *broker.Config) { c.NamesrvListen = "127.0.0.1:0" }

// sendTagged sends n messages over gRPC, as a 5.x producer does, with a tag, a key, a user
// property and the client's own message id.
func sendTagged(t *testing.T, e *env, topic string, n int) map[string]*pb.Message {
	t.Helper()
	sent := map[string]*pb.Message{}
	ctx := callCtx(t, "p-interop")
	for i := range n {
		id := "01" + strconv.Itoa(100000+i)
		m := message(topic, id, "body-"+strconv.Itoa(i))
		m.SystemProperties.Tag = strp("tag" + strconv.Itoa(i%2))
		m.SystemProperties.Keys = []string{"key-" + strconv.Itoa(i)}
		m.UserProperties = map[string]string{"n": strconv.Itoa(i)}
		resp, err := e.client.SendMessage(ctx, &pb.SendMessageRequest{Messages: []*pb.Message{m}})
		require.NoError(t, err)
		require.Equal(t, pb.Code_OK, resp.Status.Code, resp.Status.Message)
		sent[id] = m
	}
	return sent
}
