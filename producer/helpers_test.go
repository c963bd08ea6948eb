package producer_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
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
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/protocol"
)

func init() { rlog.SetLogLevel("fatal") }

// wait bounds every wait for something asynchronous: generous, since a loaded machine running
// the race detector can be slow, and free when things go well (the waits end as soon as the
// condition holds). Tests never assert how fast something happens.
const wait = 15 * time.Second

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

func admin(t testing.TB, b *broker.Broker) *clientcore.Client {
	t.Helper()
	c, err := clientcore.New(clientcore.Options{NameServers: []string{b.NamesrvAddr()}, Logger: quiet()})
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
	p, err := producer.New("producer-tests", append([]producer.Option{producer.WithClientOptions(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet()))}, opts...)...)
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
	c, err := consumer.NewLitePull(fmt.Sprint("reader-", seq.Add(1)), consumer.WithClientOptions(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet())), consumer.WithConsumeFrom(consumer.ConsumeFromFirst), consumer.WithPollTimeout(100*time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close(ctx)
	qs, err := c.FetchMessageQueues(ctx, topic)
	require.NoError(t, err)
	require.NoError(t, c.Assign(qs))
	var out []*consumer.Message
	deadline := time.Now().Add(wait)
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

// fakeBroker is a name server and a broker in one loopback remoting server, whose answers to
// sends a test scripts. Every topic's route has queues writable queues on it, "broker-f".
type fakeBroker struct {
	addr    string
	queues  int
	entered chan int32 // the queue id of every send, as it arrives

	mu    sync.Mutex
	gate  chan struct{} // when not nil, sends wait for it to close
	busy  int           // answer SYSTEM_BUSY to this many sends first
	sends []int32
	codes []protocol.RequestCode // the request code of every send
	// counts is the number of messages of every send (a batch's entries), and held whether
	// it arrived while sends were held.
	counts []int
	held   []bool
	// refuseBatches answers every SEND_BATCH_MESSAGE MESSAGE_ILLEGAL; a single message whose
	// body is "refuse" is always refused so.
	refuseBatches bool
}

func startFakeBroker(t testing.TB, queues int) *fakeBroker {
	t.Helper()
	fb := &fakeBroker{queues: queues, entered: make(chan int32, 1024)}
	srv := remoting.NewServer(remoting.HandlerFunc(fb.serve), remoting.ServerOptions{Logger: quiet()})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	fb.addr = ln.Addr().String()
	go srv.Serve(ln)
	t.Cleanup(func() {
		fb.open()
		srv.Close()
	})
	return fb
}

// hold makes sends wait until open.
func (fb *fakeBroker) hold() {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	fb.gate = make(chan struct{})
}

func (fb *fakeBroker) open() {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if fb.gate != nil {
		close(fb.gate)
		fb.gate = nil
	}
}

func (fb *fakeBroker) failNext(n int) {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	fb.busy = n
}

func (fb *fakeBroker) sentCodes() []protocol.RequestCode {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	return append([]protocol.RequestCode(nil), fb.codes...)
}

// sentCounts is the number of messages of every send so far, and whether each arrived while
// sends were held.
func (fb *fakeBroker) sentCounts() ([]int, []bool) {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	return append([]int(nil), fb.counts...), append([]bool(nil), fb.held...)
}

func (fb *fakeBroker) sent() []int32 {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	return append([]int32(nil), fb.sends...)
}

func (fb *fakeBroker) serve(ctx context.Context, _ *remoting.Conn, req *protocol.Command) *protocol.Command {
	switch req.RequestCode() {
	case protocol.GetRouteInfoByTopic:
		var h protocol.GetRouteInfoRequestHeader
		if err := req.DecodeHeader(&h); err != nil {
			return protocol.NewResponse(req, protocol.InvalidParameter, err.Error())
		}
		route := &protocol.TopicRouteData{
			QueueDatas:  []protocol.QueueData{{BrokerName: "broker-f", ReadQueueNums: int32(fb.queues), WriteQueueNums: int32(fb.queues), Perm: protocol.PermRead | protocol.PermWrite}},
			BrokerDatas: []protocol.BrokerData{{Cluster: "fake", BrokerName: "broker-f", BrokerAddrs: map[int64]string{protocol.MasterID: fb.addr}}},
		}
		body, err := route.Encode()
		if err != nil {
			return protocol.NewResponse(req, protocol.SystemError, err.Error())
		}
		resp := protocol.NewResponse(req, protocol.Success, "")
		resp.Body = body
		return resp
	case protocol.SendMessage, protocol.SendMessageV2, protocol.SendBatchMessage:
		h, err := protocol.DecodeSendHeader(req)
		if err != nil {
			return protocol.NewResponse(req, protocol.InvalidParameter, err.Error())
		}
		count := 1
		if req.RequestCode() == protocol.SendBatchMessage {
			entries, err := protocol.DecodeBatchEntries(req.Body)
			if err != nil {
				return protocol.NewResponse(req, protocol.MessageIllegal, err.Error())
			}
			count = len(entries)
		}
		fb.mu.Lock()
		fb.sends = append(fb.sends, h.QueueID)
		fb.codes = append(fb.codes, req.RequestCode())
		fb.counts = append(fb.counts, count)
		fb.held = append(fb.held, fb.gate != nil)
		refuse := (fb.refuseBatches && req.RequestCode() == protocol.SendBatchMessage) || string(req.Body) == "refuse"
		gate := fb.gate
		busy := fb.busy > 0
		if busy {
			fb.busy--
		}
		fb.mu.Unlock()
		fb.entered <- h.QueueID
		if gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				return nil
			}
		}
		if busy {
			return protocol.NewResponse(req, protocol.SystemBusy, "scripted: busy")
		}
		if refuse {
			return protocol.NewResponse(req, protocol.MessageIllegal, "scripted: refused")
		}
		resp := protocol.NewResponse(req, protocol.Success, "")
		(&protocol.SendMessageResponseHeader{MsgID: "00", QueueID: h.QueueID, QueueOffset: 0}).EncodeTo(resp.ExtFields)
		return resp
	}
	return protocol.NewResponse(req, protocol.Success, "")
}

func newFakeProducer(t testing.TB, fb *fakeBroker, opts ...producer.Option) *producer.Producer {
	t.Helper()
	p, err := producer.New("fake-tests", append([]producer.Option{producer.WithClientOptions(client.WithNameServers(fb.addr), client.WithLogger(quiet()))}, opts...)...)
	require.NoError(t, err)
	require.NoError(t, p.Start(context.Background()))
	t.Cleanup(func() {
		fb.open()
		p.Close(context.Background())
	})
	return p
}
