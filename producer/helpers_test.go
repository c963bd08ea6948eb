package producer_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/internal/client"
	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/protocol"
)

func init() { rlog.SetLogLevel("fatal") }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func startBroker(t testing.TB, mod func(*broker.Config)) *broker.Broker {
	t.Helper()
	cfg := broker.Config{
		DataDir:       t.TempDir(),
		Listen:        "127.0.0.1:0",
		NamesrvListen: "127.0.0.1:0",
		Logger:        quiet(),
		DelayLevels:   "100ms 200ms",
	}
	cfg.Store.SegmentSize = 64 << 20
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

func admin(t testing.TB, b *broker.Broker) *client.Client {
	t.Helper()
	c, err := client.New(client.Options{NameServers: []string{b.NamesrvAddr()}, Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func createTopic(t testing.TB, b *broker.Broker, topic string, queues int) []producer.MessageQueue {
	t.Helper()
	h := protocol.CreateTopicRequestHeader{Topic: topic, ReadQueueNums: int32(queues), WriteQueueNums: int32(queues), Perm: protocol.PermRead | protocol.PermWrite}
	_, err := admin(t, b).InvokeOK(context.Background(), b.Addr(), protocol.NewRequestWith(protocol.UpdateAndCreateTopic, &h, nil))
	require.NoError(t, err)
	out := make([]producer.MessageQueue, queues)
	for i := range out {
		out[i] = producer.MessageQueue{Topic: topic, BrokerName: "broker-a", QueueID: i}
	}
	return out
}

func newProducer(t testing.TB, b *broker.Broker, opts ...producer.Option) *producer.Producer {
	t.Helper()
	p, err := producer.New("producer-tests", append([]producer.Option{producer.WithNameServers(b.NamesrvAddr()), producer.WithLogger(quiet())}, opts...)...)
	require.NoError(t, err)
	require.NoError(t, p.Start(context.Background()))
	t.Cleanup(func() { p.Close(context.Background()) })
	return p
}

var seq atomic.Int64

// readAll reads every message of topic's queues from the start with a lite-pull consumer.
func readAll(t testing.TB, b *broker.Broker, topic string, n int) []*consumer.Message {
	t.Helper()
	ctx := context.Background()
	c, err := consumer.NewLitePull(fmt.Sprint("reader-", seq.Add(1)), consumer.WithNameServers(b.NamesrvAddr()),
		consumer.WithLogger(quiet()), consumer.WithConsumeFrom(consumer.ConsumeFromFirst), consumer.WithPollTimeout(100*time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Shutdown(ctx)
	qs, err := c.FetchMessageQueues(ctx, topic)
	require.NoError(t, err)
	require.NoError(t, c.Assign(qs))
	var out []*consumer.Message
	deadline := time.Now().Add(10 * time.Second)
	for len(out) < n && time.Now().Before(deadline) {
		msgs, err := c.Poll(ctx)
		require.NoError(t, err)
		out = append(out, msgs...)
	}
	// Anything beyond n?
	msgs, err := c.Poll(ctx)
	require.NoError(t, err)
	return append(out, msgs...)
}

// rawPull reads want stored messages of mq from offset, as stored.
func rawPull(t testing.TB, b *broker.Broker, mq producer.MessageQueue, offset int64, want int) []*protocol.MessageExt {
	t.Helper()
	var out []*protocol.MessageExt
	for len(out) < want {
		// Suspended: the broker answers once messages are dispatched to the consume queue.
		h := protocol.PullMessageRequestHeader{ConsumerGroup: "raw", Topic: mq.Topic, QueueID: int32(mq.QueueID), QueueOffset: offset + int64(len(out)),
			MaxMsgNums: 32, SysFlag: protocol.PullFlagSuspend, SuspendTimeoutMillis: 5000}
		resp, err := admin(t, b).InvokeOK(context.Background(), b.Addr(), protocol.NewRequestWith(protocol.PullMessage, &h, nil))
		require.NoError(t, err)
		msgs, err := protocol.DecodeStoredAll(resp.Body)
		require.NoError(t, err)
		out = append(out, msgs...)
	}
	return out
}
