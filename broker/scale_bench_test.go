package broker_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// Scaling benchmarks: throughput, latency and memory of a broker on 127.0.0.1 as one
// dimension grows, the others fixed. The first case of each benchmark is the baseline its
// other cases are read against (docs/PERFORMANCE.md, "Scaling"). The clients are raw
// remoting connections, one in-flight request each, so that what grows is the broker's
// share. Run them all with
//
//	go test -run '^$' -bench 'Scale' -benchtime 20000x -timeout 30m ./broker/

// sendLoad sends total messages of body to topic from conns connections (each its own
// remoting client), one request in flight each, the queues taken in turn. It reports
// msgs/s and the p50 and p99 send round trips.
func sendLoad(b *testing.B, br *testBroker, conns, total int, topic string, queues int, body []byte) (msgsPerSec float64) {
	b.Helper()
	clients := make([]*remoting.Client, conns)
	for i := range clients {
		clients[i] = newTransport(b)
		sendOne(b, clients[i], br, topic, int32(i%queues), queues, body) // connect outside the clock
	}
	lat := make([][]time.Duration, conns)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for i, cl := range clients {
		n := total / conns
		if i < total%conns {
			n++
		}
		lat[i] = make([]time.Duration, 0, n)
		wg.Go(func() {
			for j := range n {
				q := int32((i + j*conns) % queues)
				t0 := time.Now()
				sendOne(b, cl, br, topic, q, queues, body)
				lat[i] = append(lat[i], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	q := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))]) / 1e3 }
	rate := float64(total) / elapsed.Seconds()
	b.ReportMetric(rate, "msgs/s")
	b.ReportMetric(q(0.5), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
	return rate
}

func sendOne(b *testing.B, cl *remoting.Client, br *testBroker, topic string, queue int32, queues int, body []byte) {
	h := &protocol.SendMessageRequestHeader{
		ProducerGroup: "scale", Topic: topic, DefaultTopic: protocol.AutoCreateTopicKey, DefaultTopicQueueNums: int32(queues),
		QueueID: queue, BornTimestamp: time.Now().UnixMilli(),
	}
	resp, err := cl.Invoke(context.Background(), br.Addr(), protocol.NewRequestWith(protocol.SendMessage, h, body))
	if err != nil || resp.ResponseCode() != protocol.Success {
		b.Errorf("send to %s/%d: %v %v", topic, queue, err, resp)
	}
}

func createTopic(b testing.TB, br *testBroker, name string, queues int) {
	require.NoError(b, br.CreateTopic(broker.TopicConfig{Name: name, ReadQueueNums: queues, WriteQueueNums: queues, Perm: protocol.PermRead | protocol.PermWrite}))
}

// BenchmarkScaleQueues: produce throughput and latency, and the memory a queue holds once it
// has a message, as the queues per topic grow (a topic has at most 1024; 10 000 queues are
// ten topics of 1000). 16 connections, 1 KiB messages.
func BenchmarkScaleQueues(b *testing.B) {
	body := make([]byte, 1024)
	for _, tc := range []struct{ topics, queues int }{{1, 1}, {1, 100}, {1, 1024}, {10, 1000}} {
		b.Run(fmt.Sprintf("topics=%d/queues=%d", tc.topics, tc.queues), func(b *testing.B) {
			br := startBroker(b, nil)
			cl := newTransport(b)
			sendOne(b, cl, br, "warm", 0, 1, body)
			before := readMem()
			for t := range tc.topics {
				name := fmt.Sprintf("scale-%d", t)
				createTopic(b, br, name, tc.queues)
				for q := range tc.queues { // every queue holds a message: its files and index exist
					sendOne(b, cl, br, name, int32(q), tc.queues, body)
				}
			}
			after := readMem()
			queues := tc.topics * tc.queues
			// The load goes to the first topic's queues in turn (all 10 000 in the last case
			// would measure the client's spread, not the broker).
			sendLoad(b, br, 16, b.N, "scale-0", tc.queues, body)
			// After sendLoad: its ResetTimer drops metrics reported before it.
			b.ReportMetric(float64(int64(after.heap-before.heap))/float64(queues), "heap-B/queue")
		})
	}
}

// BenchmarkScaleMessageSize: produce throughput (msgs/s and MB/s) and latency as the body
// grows from 128 B to 1 MiB. 8 connections, 8 queues. A case sends b.N messages or 256 MiB,
// whichever is less, so that the large sizes do not write gigabytes.
func BenchmarkScaleMessageSize(b *testing.B) {
	for _, size := range []int{128, 1 << 10, 16 << 10, 256 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			br := startBroker(b, nil)
			createTopic(b, br, "size", 8)
			n := max(min(b.N, (256<<20)/size), 8)
			rate := sendLoad(b, br, 8, n, "size", 8, make([]byte, size))
			b.ReportMetric(rate*float64(size)/1e6, "MB/s")
		})
	}
}

// BenchmarkScaleProducerConns: produce throughput and latency from 1 to 1000 connections, each
// with one send in flight. 1 KiB messages, 64 queues.
func BenchmarkScaleProducerConns(b *testing.B) {
	for _, conns := range []int{1, 10, 100, 1000} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			br := startBroker(b, nil)
			createTopic(b, br, "conns", 64)
			sendLoad(b, br, conns, max(b.N, conns), "conns", 64, make([]byte, 1024))
		})
	}
}

// BenchmarkScaleConsumerConns: consume throughput from 1 to 1000 connections pulling (32
// messages a pull) a topic of 1000 queues filled beforehand, the queues shared out among
// the connections. 1 KiB messages.
func BenchmarkScaleConsumerConns(b *testing.B) {
	const queues = 1000
	for _, conns := range []int{1, 10, 100, 1000} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			br := startBroker(b, nil)
			createTopic(b, br, "pull", queues)
			total := max(b.N, queues)
			perQueue := total / queues
			body := make([]byte, 1024)
			{ // fill from 16 connections, outside the measurement
				var wg sync.WaitGroup
				for c := range 16 {
					cl := newTransport(b)
					wg.Go(func() {
						for q := c; q < queues; q += 16 {
							for range perQueue {
								sendOne(b, cl, br, "pull", int32(q), queues, body)
							}
						}
					})
				}
				wg.Wait()
				for q := range queues { // dispatched: the consume queues hold them
					waitMax(b, br, "pull", int32(q), int64(perQueue))
				}
			}
			clients := make([]*remoting.Client, conns)
			for i := range clients {
				clients[i] = newTransport(b)
				_, err := clients[i].Invoke(context.Background(), br.Addr(), // connect outside the clock
					protocol.NewRequestWith(protocol.GetRouteInfoByTopic, &protocol.GetRouteInfoRequestHeader{Topic: "pull"}, nil))
				require.NoError(b, err)
			}
			var wg sync.WaitGroup
			got := make([]int, conns)
			b.ResetTimer()
			start := time.Now()
			for i, cl := range clients {
				wg.Go(func() {
					for q := i; q < queues; q += conns {
						for off := int64(0); off < int64(perQueue); {
							h := pullHeader("pull", off, 0, "*")
							h.QueueID, h.ConsumerGroup = int32(q), "scale"
							resp, err := cl.Invoke(context.Background(), br.Addr(), protocol.NewRequestWith(protocol.PullMessage, h, nil))
							if err != nil || resp.ResponseCode() != protocol.Success {
								b.Errorf("pull %d@%d: %v %v", q, off, err, resp)
								return
							}
							msgs, err := protocol.DecodeStoredAll(resp.Body)
							if err != nil || len(msgs) == 0 {
								b.Errorf("pull %d@%d: %d messages, %v", q, off, len(msgs), err)
								return
							}
							off += int64(len(msgs))
							got[i] += len(msgs)
						}
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			n := 0
			for _, g := range got {
				n += g
			}
			b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
		})
	}
}

// BenchmarkScaleParkedPulls: the delay from a send to a pull parked on its queue receiving
// the message, with no other pull parked and with 10 000 others parked on other queues (10
// connections of 1000 pulls each); and the memory the 10 000 hold, heap and goroutine stacks
// (as BenchmarkParkedPullMemory, here next to the delay).
func BenchmarkScaleParkedPulls(b *testing.B) {
	for _, others := range []int{0, 10000} {
		b.Run(fmt.Sprintf("parked=%d", others), func(b *testing.B) {
			// The idle pulls must stay parked for the whole run: no suspend cap below an hour.
			br := startBroker(b, func(c *broker.Config) { c.MaxLongPoll = time.Hour })
			const queues = 1000
			createTopic(b, br, "idle", queues)
			createTopic(b, br, "lat", 1)
			before := readMem()
			var conns []*rawConn
			for c := 0; c < others/queues; c++ {
				rc := dialRaw(b, br.Addr())
				conns = append(conns, rc)
				for q0 := 0; q0 < queues; q0 += 128 {
					for q := q0; q < min(q0+128, queues); q++ {
						h := pullHeader("idle", 0, time.Hour, "*")
						h.QueueID, h.ConsumerGroup = int32(q), "idle"
						rc.write(b, protocol.PullMessage, h, nil)
					}
					waitParked(b, br, c*queues+min(q0+128, queues))
				}
			}
			heapPerPull, perPull := 0.0, 0.0
			if others > 0 {
				after := readMem()
				heapPerPull = float64(int64(after.heap-before.heap)) / float64(others)
				perPull = heapPerPull + float64(int64(after.stack-before.stack))/float64(others)
			}
			c := newRawClientB(b, br)
			delays := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				got := make(chan time.Time, 1)
				go func() {
					h := pullHeader("lat", int64(i), 20*time.Second, "*")
					resp, err := c.cl.Invoke(context.Background(), br.Addr(), protocol.NewRequestWith(protocol.PullMessage, h, nil))
					if err != nil || resp.ResponseCode() != protocol.Success {
						b.Errorf("pull: %v %v", err, resp)
					}
					got <- time.Now()
				}()
				for br.WaitingPulls() != int64(others+1) { // the pull is parked, not reading
					runtime.Gosched()
				}
				start := time.Now()
				c.sendTo("lat", 0, make([]byte, 128))
				delays = append(delays, (<-got).Sub(start))
			}
			b.StopTimer()
			slices.Sort(delays)
			q := func(p float64) float64 { return float64(delays[int(p*float64(len(delays)-1))]) / 1e3 }
			b.ReportMetric(q(0.5), "p50-delay-µs")
			b.ReportMetric(q(0.99), "p99-delay-µs")
			if others > 0 {
				b.ReportMetric(heapPerPull, "heap-B/parked-pull")
				b.ReportMetric(perPull, "B/parked-pull")
			}
			for _, rc := range conns {
				rc.nc.Close()
			}
		})
	}
}
