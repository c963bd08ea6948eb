package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/producer"
)

// BenchmarkPoll measures Poll throughput of one consumer reading 8 queues of pre-produced
// 1 KiB messages.
func BenchmarkPoll(b *testing.B) {
	br := startBroker(b, nil)
	queues := createTopic(b, br, "bench-poll", len8)
	p := newProducer(b, br)
	body := make([]byte, 1024)
	n := b.N
	ctx := context.Background()
	for sent := 0; sent < n; {
		for _, q := range queues {
			var batch []*producer.Message
			for range min(64, n-sent) {
				batch = append(batch, &producer.Message{Topic: q.Topic, Body: body, ShardingKey: fmt.Sprint(q.QueueID)})
			}
			if len(batch) == 0 {
				break
			}
			_, err := p.SendBatch(ctx, batch...)
			require.NoError(b, err)
			sent += len(batch)
		}
	}
	c := newConsumer(b, br, "bench-poll-group", consumer.WithConsumeFrom(consumer.ConsumeFromFirst),
		consumer.WithPullBatchSize(32), consumer.WithPollTimeout(5*time.Second))
	require.NoError(b, c.Subscribe("bench-poll", "*"))
	b.SetBytes(1024)
	b.ReportAllocs()
	b.ResetTimer()
	cpu := processCPU()
	require.NoError(b, c.Start(ctx))
	for got := 0; got < n; {
		msgs, err := c.Poll(ctx)
		require.NoError(b, err)
		require.NotEmpty(b, msgs)
		got += len(msgs)
	}
	b.StopTimer()
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msgs/s")
	// CPU time of the process (broker and consumer) per message: steadier than msgs/s on a
	// machine busy with other work.
	b.ReportMetric(float64((processCPU()-cpu).Nanoseconds())/float64(n), "cpu-ns/msg")
}

const len8 = 8

// BenchmarkRebalanceJoin measures the time from a member starting until every member of the
// group (two before it joined) reads exactly its new share: notification, rebalance, commit
// and unlock by the previous owners, lock and offset read by the new one. The periodic
// rebalance is set to a minute, so only notifications count.
func BenchmarkRebalanceJoin(b *testing.B) {
	br := startBroker(b, nil)
	queues := createTopic(b, br, "bench-join", len8)
	opts := []consumer.Option{
		consumer.WithRebalanceInterval(time.Minute),
		consumer.WithLockRetryInterval(20 * time.Millisecond),
	}
	var base []*member
	l := newLedger()
	for i := range 2 {
		c := newConsumer(b, br, "bench-join-group", opts...)
		require.NoError(b, c.Subscribe("bench-join", "*"))
		require.NoError(b, c.Start(context.Background()))
		base = append(base, runMemberTB(b, c, fmt.Sprint("m", i), l))
	}
	waitConvergedTB(b, queues, base, 10*time.Second)
	var total time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		c, err := consumer.NewLitePull("bench-join-group", append(fastOpts(br), opts...)...)
		require.NoError(b, err)
		require.NoError(b, c.Subscribe("bench-join", "*"))
		joiner := &member{c: c, name: "joiner"}
		b.StartTimer()
		start := time.Now()
		require.NoError(b, c.Start(context.Background()))
		waitConvergedTB(b, queues, append(base[:2:2], joiner), 10*time.Second)
		total += time.Since(start)
		b.StopTimer()
		require.NoError(b, c.Close(context.Background()))
		waitConvergedTB(b, queues, base, 10*time.Second)
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/join")
}

func waitConvergedTB(tb testing.TB, queues []consumer.MessageQueue, members []*member, within time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for !converged(tb, queues, members) {
		if time.Now().After(deadline) {
			for _, m := range members {
				tb.Logf("%s %s: assigned %v active %v", m.name, m.c.ClientID(), ids(m.c.Assignment()), ids(m.c.ActiveQueues()))
			}
			tb.Fatalf("no convergence within %v", within)
		}
		time.Sleep(time.Millisecond)
	}
}
