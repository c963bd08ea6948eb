package grpcserver_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

// benchBatch is the receive / pull / fetch batch of the consume benchmarks.
const benchBatch = 32

// BenchmarkConsume1KiB compares consuming b.N stored 1 KiB messages, one consumer each:
// pop receives with one AckMessage per received batch (a 5.x SimpleConsumer over gRPC),
// flowd's lite-pull consumer over remoting (offsets committed, nothing acknowledged per
// message), and JetStream's pull consumer with explicit acks (Fetch, then Ack of each
// message), the closest peer of pop consumption, on an embedded nats-server with a file
// stream in the same run.
func BenchmarkConsume1KiB(b *testing.B) {
	body := make([]byte, 1024)
	b.Run("pop-ack", func(b *testing.B) { benchPopAck(b, body) })
	b.Run("lite-pull", func(b *testing.B) {
		e := start(b, withNamesrv)
		e.topic(b, "bench", 4)
		preload(b, e, "bench", body, b.N)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cl, err := client.New(client.WithNameServers(e.b.NamesrvAddr()), client.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		require.NoError(b, err)
		defer cl.Close(context.Background())
		c, err := consumer.NewLitePull("bench-lite", consumer.WithClient(cl), consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
		require.NoError(b, err)
		require.NoError(b, c.Subscribe("bench", "*"))
		b.ResetTimer()
		start := time.Now()
		require.NoError(b, c.Start(ctx))
		got := 0
		for got < b.N {
			msgs, err := c.Poll(ctx)
			require.NoError(b, err)
			got += len(msgs)
		}
		b.StopTimer()
		b.ReportMetric(float64(got)/time.Since(start).Seconds(), "msgs/s")
		_ = c.Close(context.Background())
	})
	b.Run("jetstream-fetch-ack", func(b *testing.B) {
		srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
			StoreDir: filepath.Join(b.TempDir(), "js"), NoSigs: true, NoLog: true})
		require.NoError(b, err)
		srv.Start()
		defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
		require.True(b, srv.ReadyForConnections(10*time.Second))
		nc, err := nats.Connect(srv.ClientURL())
		require.NoError(b, err)
		defer nc.Close()
		js, err := jetstream.New(nc)
		require.NoError(b, err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench.>"}, Storage: jetstream.FileStorage})
		require.NoError(b, err)
		for i := range b.N {
			_, err := js.PublishAsync("bench."+strconv.Itoa(i%4), body)
			require.NoError(b, err)
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			b.Fatal("JetStream publish did not complete")
		}
		cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy})
		require.NoError(b, err)
		b.ResetTimer()
		start := time.Now()
		got := 0
		for got < b.N {
			batch, err := cons.Fetch(min(benchBatch, b.N-got), jetstream.FetchMaxWait(10*time.Second))
			require.NoError(b, err)
			for m := range batch.Messages() {
				require.NoError(b, m.Ack())
				got++
			}
			require.NoError(b, batch.Error())
		}
		b.StopTimer()
		b.ReportMetric(float64(got)/time.Since(start).Seconds(), "msgs/s")
	})
}

// preload stores n messages of body in topic over gRPC, in batches.
func preload(b *testing.B, e *env, topic string, body []byte, n int) {
	b.Helper()
	ctx := callCtx(b, "bench-preload")
	for i := 0; i < n; i += 64 {
		req := &pb.SendMessageRequest{}
		for j := i; j < min(i+64, n); j++ {
			m := message(topic, "01PRE"+strconv.Itoa(j), "")
			m.Body = body
			req.Messages = append(req.Messages, m)
		}
		resp, err := e.client.SendMessage(ctx, req)
		require.NoError(b, err)
		require.Equal(b, pb.Code_OK, resp.Status.Code, resp.Status.Message)
	}
}
