package broker_test

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	rmqproducer "github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

// BenchmarkRocketMQClient measures produce and consume throughput through the official Go
// client: 1 KiB messages, async sends with up to 64 in flight, and a push consumer reading
// them back.
func BenchmarkRocketMQClient(b *testing.B) {
	body := make([]byte, 1024)
	b.Run("produce-async-1KiB", func(b *testing.B) {
		br := startBroker(b, nil)
		p, err := rocketmq.NewProducer(
			rmqproducer.WithNsResolver(primitive.NewPassthroughResolver([]string{br.NamesrvAddr()})),
			rmqproducer.WithInstanceName(instance(b)),
		)
		require.NoError(b, err)
		require.NoError(b, p.Start())
		defer p.Shutdown()
		_, err = p.SendSync(context.Background(), primitive.NewMessage("bench", body))
		require.NoError(b, err)
		inflight := make(chan struct{}, 64)
		var wg sync.WaitGroup
		b.SetBytes(int64(len(body)))
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			inflight <- struct{}{}
			wg.Add(1)
			err := p.SendAsync(context.Background(), func(ctx context.Context, r *primitive.SendResult, err error) {
				if err != nil {
					b.Error(err)
				}
				<-inflight
				wg.Done()
			}, primitive.NewMessage("bench", body))
			if err != nil {
				b.Fatal(err)
			}
		}
		wg.Wait()
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	})
	b.Run("produce-flowd-transport-64-inflight-1KiB", func(b *testing.B) {
		// The same load through flowd's own transport: the baseline that tells the broker's
		// cost from the client's.
		br := startBroker(b, nil)
		c := newRawClientB(b, br)
		c.sendTo("bench", 0, body)
		b.SetBytes(int64(len(body)))
		b.SetParallelism(32) // 64 senders on 2 cores
		b.ResetTimer()
		start := time.Now()
		var q atomic.Int32
		b.RunParallel(func(pb *testing.PB) {
			qid := q.Add(1) % 4
			for pb.Next() {
				c.sendTo("bench", qid, body)
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	})
	b.Run("consume-push-1KiB", func(b *testing.B) {
		br := startBroker(b, nil)
		c := newRawClientB(b, br)
		for i := range b.N {
			c.sendTo("bench", int32(i%4), body)
		}
		var n int
		var mu sync.Mutex
		done := make(chan struct{})
		b.SetBytes(int64(len(body)))
		b.ResetTimer()
		start := time.Now()
		pc, err := rocketmq.NewPushConsumer(
			rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver([]string{br.NamesrvAddr()})),
			rmqconsumer.WithGroupName("bench-readers"),
			rmqconsumer.WithInstance(instance(b)),
			rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset),
			rmqconsumer.WithConsumeMessageBatchMaxSize(32),
		)
		require.NoError(b, err)
		require.NoError(b, pc.Subscribe("bench", rmqconsumer.MessageSelector{}, func(ctx context.Context, ms ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
			mu.Lock()
			n += len(ms)
			if n == b.N {
				close(done)
			}
			mu.Unlock()
			return rmqconsumer.ConsumeSuccess, nil
		}))
		require.NoError(b, pc.Start())
		defer pc.Shutdown()
		<-done
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	})
}

// BenchmarkLongPollDelay measures the time from a send starting to a pull that was parked on
// the queue receiving the message, against the send's own round trip measured in the same
// run. Both start at the same instant: the parked pull is often answered before the sender
// reads its acknowledgement, so measuring from the acknowledgement would report nothing.
func BenchmarkLongPollDelay(b *testing.B) {
	br := startBroker(b, nil)
	c := newRawClientB(b, br)
	c.sendTo("lat", 0, []byte("warm"))
	waitMax(b, br, "lat", 0, 1)
	body := make([]byte, 128)

	delays := make([]time.Duration, 0, b.N)
	rtts := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		offset := int64(i + 1)
		got := make(chan time.Time, 1)
		go func() {
			h := pullHeader("lat", offset, 20*time.Second, "*")
			resp, err := c.cl.Invoke(context.Background(), br.Addr(), protocol.NewRequestWith(protocol.PullMessage, h, nil))
			if err != nil || resp.ResponseCode() != protocol.Success {
				b.Errorf("pull: %v %v", err, resp)
			}
			got <- time.Now()
		}()
		for br.WaitingPulls() == 0 { // measure the wake-up of a parked pull, not a read
			runtime.Gosched()
		}
		start := time.Now()
		c.sendTo("lat", 0, body)
		sent := time.Now()
		rtts = append(rtts, sent.Sub(start))
		delays = append(delays, (<-got).Sub(start))
	}
	b.StopTimer()
	slices.Sort(delays)
	slices.Sort(rtts)
	q := func(d []time.Duration, p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Microseconds()) }
	b.ReportMetric(q(delays, 0.5), "p50-delay-µs")
	b.ReportMetric(q(delays, 0.99), "p99-delay-µs")
	b.ReportMetric(q(rtts, 0.5), "p50-send-rtt-µs")
}

type rawClientB struct {
	*rawClient
	tb testing.TB
}

func newRawClientB(tb testing.TB, br *testBroker) *rawClientB {
	t, _ := tb.(*testing.T)
	rc := &rawClient{t: t, b: br}
	rc.cl = newTransport(tb)
	return &rawClientB{rawClient: rc, tb: tb}
}

func (c *rawClientB) sendTo(topic string, queue int32, body []byte) {
	h := &protocol.SendMessageRequestHeader{
		ProducerGroup: "raw", Topic: topic, DefaultTopic: protocol.AutoCreateTopicKey, DefaultTopicQueueNums: 4,
		QueueID: queue, BornTimestamp: time.Now().UnixMilli(),
	}
	resp, err := c.cl.Invoke(context.Background(), c.b.Addr(), protocol.NewRequestWith(protocol.SendMessage, h, body))
	if err != nil || resp.ResponseCode() != protocol.Success {
		c.tb.Fatalf("send: %v %v", err, resp)
	}
}

func waitMax(tb testing.TB, br *testBroker, topic string, q int32, n int64) {
	deadline := time.Now().Add(5 * time.Second)
	for br.StoreMax(topic, q) < n {
		if time.Now().After(deadline) {
			tb.Fatalf("%s/%d never reached %d", topic, q, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkPull measures pull throughput (pulls of 32 from 8 queues in parallel, 1 KiB
// messages) through flowd's transport, answered from the commit-log files (zero-copy: small
// regions copied into the write buffer, large ones sent with sendfile) and with
// Config.DisableZeroCopy (messages copied into each response), on the same stored data in
// the same run. "interleaved" stores the queues' messages alternately, as concurrent
// producers do, so that each message of a pull is its own region; "contiguous" stores each
// queue's messages in batches of 64, so that a pull is one or two regions. cpu-ns/msg is the
// process's CPU time (broker and client) per message pulled: the figure to compare on a
// machine busy with other work.
func BenchmarkPull(b *testing.B) {
	const queues, msgs = 8, 16384
	body := make([]byte, 1024)
	for _, layout := range []string{"interleaved", "contiguous"} {
		dir := b.TempDir()
		b.Run(layout, func(b *testing.B) {
			fill := startBroker(b, func(c *broker.Config) { c.DataDir = dir })
			require.NoError(b, fill.CreateTopic(broker.TopicConfig{Name: "pull", ReadQueueNums: queues, WriteQueueNums: queues, Perm: 6}))
			c := newRawClientB(b, fill)
			var wg sync.WaitGroup
			for g := range 4 {
				wg.Go(func() {
					if layout == "interleaved" {
						for i := g; i < msgs; i += 4 {
							c.sendTo("pull", int32(i%queues), body)
						}
						return
					}
					// Batches of 64 to one queue: each is stored in one piece.
					var batch []*protocol.Message
					for range 64 {
						batch = append(batch, &protocol.Message{Topic: "pull", Body: body})
					}
					enc, err := protocol.EncodeBatch(batch)
					require.NoError(b, err)
					for r := g; r < msgs/64; r += 4 {
						h := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: "pull", QueueID: int32(r % queues), BornTimestamp: time.Now().UnixMilli(), Batch: true}
						resp, err := c.cl.Invoke(context.Background(), fill.Addr(), protocol.NewRequest(protocol.SendBatchMessage, h.EncodeV2(), enc))
						require.NoError(b, err)
						require.Equal(b, protocol.Success, resp.ResponseCode(), resp.Remark)
					}
				})
			}
			wg.Wait()
			for q := range int32(queues) {
				waitMax(b, fill, "pull", q, msgs/queues)
			}
			fill.stop(b)
			for _, mode := range []string{"zero-copy", "zero-copy-sendfile-all", "copy"} {
				b.Run(mode, func(b *testing.B) {
					br := startBroker(b, func(c *broker.Config) {
						c.DataDir = dir
						c.DisableZeroCopy = mode == "copy"
						if mode == "zero-copy-sendfile-all" {
							c.Transport.SendfileThreshold = 1
						}
					})
					cl := newTransport(b)
					var next atomic.Int32
					var pulled atomic.Int64
					b.SetParallelism(4)
					b.ResetTimer()
					start, cpu := time.Now(), processCPU()
					b.RunParallel(func(pb *testing.PB) {
						q := next.Add(1) % queues
						off := int64(0)
						for pb.Next() {
							h := pullHeader("pull", off, 0, "*")
							h.QueueID = q
							resp, err := cl.Invoke(context.Background(), br.Addr(), protocol.NewRequestWith(protocol.PullMessage, h, nil))
							if err != nil || resp.ResponseCode() != protocol.Success {
								b.Errorf("pull %d@%d: %v %v", q, off, err, resp)
								return
							}
							var rh protocol.PullMessageResponseHeader
							if err := resp.DecodeHeader(&rh); err != nil {
								b.Error(err)
								return
							}
							pulled.Add(rh.NextBeginOffset - off)
							if off = rh.NextBeginOffset; off >= msgs/queues {
								off = 0
							}
						}
					})
					b.StopTimer()
					el, cpu := time.Since(start).Seconds(), processCPU()-cpu
					b.ReportMetric(float64(pulled.Load())/el, "msgs/s")
					b.ReportMetric(float64(cpu.Nanoseconds())/float64(pulled.Load()), "cpu-ns/msg")
					b.ReportMetric(float64(pulled.Load())*float64(len(body))/el/1e6, "MB/s")
				})
			}
		})
	}
}
