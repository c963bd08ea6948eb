package client

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func startBroker(t *testing.T) *broker.Broker {
	t.Helper()
	cfg := broker.Config{
		DataDir:       t.TempDir(),
		Listen:        "127.0.0.1:0",
		NamesrvListen: "127.0.0.1:0",
		Logger:        quietLogger(),
	}
	cfg.Store.SegmentSize = 8 << 20
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

func newClient(t *testing.T, b *broker.Broker, mod func(*Options)) *Client {
	t.Helper()
	opts := Options{NameServers: []string{b.NamesrvAddr()}, Logger: quietLogger()}
	if mod != nil {
		mod(&opts)
	}
	c, err := New(opts)
	require.NoError(t, err)
	require.NoError(t, c.Start())
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	return c
}

func createTopic(t *testing.T, c *Client, addr, topic string, queues int) {
	t.Helper()
	h := protocol.CreateTopicRequestHeader{Topic: topic, ReadQueueNums: int32(queues), WriteQueueNums: int32(queues), Perm: protocol.PermRead | protocol.PermWrite}
	_, err := c.InvokeOK(context.Background(), addr, protocol.NewRequestWith(protocol.UpdateAndCreateTopic, &h, nil))
	require.NoError(t, err)
}

// fakeConsumer records what the client passes it.
type fakeConsumer struct {
	group    string
	notified atomic.Int32
	mu       sync.Mutex
	changed  map[string][]protocol.MessageQueue
	reset    map[protocol.MessageQueue]int64
}

func (f *fakeConsumer) ConsumerData() protocol.ConsumerData {
	return protocol.ConsumerData{GroupName: f.group, ConsumeType: protocol.ConsumeActively, MessageModel: protocol.Clustering, ConsumeFromWhere: protocol.ConsumeFromLastOffset}
}
func (f *fakeConsumer) NotifyConsumerIDsChanged() { f.notified.Add(1) }
func (f *fakeConsumer) RouteChanged(topic string, qs []protocol.MessageQueue) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.changed == nil {
		f.changed = map[string][]protocol.MessageQueue{}
	}
	f.changed[topic] = qs
}
func (f *fakeConsumer) RunningInfo() *protocol.ConsumerRunningInfo {
	return &protocol.ConsumerRunningInfo{Properties: map[string]string{"group": f.group}}
}
func (f *fakeConsumer) ResetOffset(topic string, offsets map[protocol.MessageQueue]int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reset = offsets
}
func (f *fakeConsumer) routeChange(topic string) []protocol.MessageQueue {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed[topic]
}

func consumerList(t *testing.T, c *Client, addr, group string) []string {
	t.Helper()
	h := protocol.GetConsumerListByGroupRequestHeader{ConsumerGroup: group}
	resp, err := c.InvokeOK(context.Background(), addr, protocol.NewRequestWith(protocol.GetConsumerListByGroup, &h, nil))
	require.NoError(t, err)
	var body protocol.ConsumerListBody
	require.NoError(t, protocol.UnmarshalBody(resp.Body, &body))
	return body.ConsumerIDList
}

func TestNewNeedsNameServers(t *testing.T) {
	_, err := New(Options{})
	require.ErrorIs(t, err, ErrNoNameServers)
	_, err = New(Options{NameServers: []string{" ; "}})
	require.ErrorIs(t, err, ErrNoNameServers)
}

func TestClientIDs(t *testing.T) {
	a, err := New(Options{NameServers: []string{"127.0.0.1:1"}})
	require.NoError(t, err)
	b, err := New(Options{NameServers: []string{"127.0.0.1:1"}})
	require.NoError(t, err)
	defer a.Close(context.Background())
	defer b.Close(context.Background())
	assert.NotEqual(t, a.ID(), b.ID(), "two default clients in one process must differ")
	ip, inst, ok := strings.Cut(a.ID(), "@")
	require.True(t, ok)
	assert.NotNil(t, net.ParseIP(ip))
	assert.Contains(t, inst, "#")

	c, err := New(Options{NameServers: []string{"x:1;y:2"}, ClientIP: "10.1.2.3", InstanceName: "inst"})
	require.NoError(t, err)
	defer c.Close(context.Background())
	assert.Equal(t, "10.1.2.3@inst", c.ID())
	assert.Equal(t, []string{"x:1", "y:2"}, c.ns)
}

func TestRouteFetchCacheRefresh(t *testing.T) {
	b := startBroker(t)
	c := newClient(t, b, func(o *Options) { o.RouteRefreshInterval = 100 * time.Millisecond })
	ctx := context.Background()

	_, err := c.Route(ctx, "nope")
	require.ErrorIs(t, err, ErrTopicNotExist)
	assert.True(t, IsCode(err, protocol.TopicNotExist))
	_, cached := c.CachedRoute("nope")
	assert.False(t, cached, "a missing topic is not cached")

	createTopic(t, c, b.Addr(), "routes", 4)
	r, err := c.Route(ctx, "routes")
	require.NoError(t, err)
	require.Len(t, r.SubscribeQueues, 4)
	require.Len(t, r.PublishQueues, 4)
	for i, q := range r.SubscribeQueues {
		assert.Equal(t, protocol.MessageQueue{Topic: "routes", BrokerName: "broker-a", QueueID: i}, q)
	}
	addr, ok := r.BrokerAddr("broker-a")
	require.True(t, ok)
	assert.Equal(t, b.Addr(), addr)
	assert.Equal(t, []string{b.Addr()}, c.BrokerAddrs())
	got, err := c.FindBrokerAddr(ctx, "broker-a", "routes")
	require.NoError(t, err)
	assert.Equal(t, b.Addr(), got)
	_, err = c.FindBrokerAddr(ctx, "broker-z", "routes")
	require.ErrorIs(t, err, ErrBrokerNotFound)

	again, err := c.Route(ctx, "routes")
	require.NoError(t, err)
	assert.Same(t, r, again, "served from the cache")

	// The topic grows; the refresh timer notices and tells registered consumers.
	fc := &fakeConsumer{group: "g"}
	require.NoError(t, c.RegisterConsumer("g", fc))
	createTopic(t, c, b.Addr(), "routes", 8)
	require.Eventually(t, func() bool {
		r, _ := c.CachedRoute("routes")
		return len(r.SubscribeQueues) == 8 && len(fc.routeChange("routes")) == 8
	}, 5*time.Second, 20*time.Millisecond)

	// UpdateRoute refreshes on demand.
	createTopic(t, c, b.Addr(), "routes", 6)
	r, err = c.UpdateRoute(ctx, "routes")
	require.NoError(t, err)
	assert.Len(t, r.SubscribeQueues, 6)
}

func TestNameServerFailover(t *testing.T) {
	b := startBroker(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	ln.Close()
	c := newClient(t, b, func(o *Options) { o.NameServers = []string{dead, b.NamesrvAddr()} })
	createTopic(t, c, b.Addr(), "failover", 2)
	r, err := c.UpdateRoute(context.Background(), "failover")
	require.NoError(t, err)
	assert.Len(t, r.SubscribeQueues, 2)
	c.mu.Lock()
	assert.Equal(t, 1, c.nsCursor, "the name server that answered is tried first next time")
	c.mu.Unlock()

	onlyDead := newClient(t, b, func(o *Options) { o.NameServers = []string{dead} })
	_, err = onlyDead.Route(context.Background(), "failover")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no name server answered")
}

func TestHeartbeatRegistersAndNotifyTriggers(t *testing.T) {
	b := startBroker(t)
	c1 := newClient(t, b, nil)
	c2 := newClient(t, b, nil)
	ctx := context.Background()
	createTopic(t, c1, b.Addr(), "hb", 2)
	for _, c := range []*Client{c1, c2} {
		_, err := c.Route(ctx, "hb")
		require.NoError(t, err)
	}
	f1, f2 := &fakeConsumer{group: "hb-group"}, &fakeConsumer{group: "hb-group"}
	require.NoError(t, c1.RegisterConsumer("hb-group", f1))
	require.ErrorIs(t, c1.RegisterConsumer("hb-group", f1), ErrGroupRegistered)
	require.NoError(t, c1.RegisterProducer("hb-producers"))
	require.NoError(t, c1.SendHeartbeat(ctx))
	assert.Equal(t, []string{c1.ID()}, consumerList(t, c1, b.Addr(), "hb-group"))

	require.NoError(t, c2.RegisterConsumer("hb-group", f2))
	require.NoError(t, c2.SendHeartbeat(ctx))
	ids := consumerList(t, c1, b.Addr(), "hb-group")
	assert.ElementsMatch(t, []string{c1.ID(), c2.ID()}, ids)
	require.Eventually(t, func() bool { return f1.notified.Load() > 0 }, 3*time.Second, 10*time.Millisecond,
		"c2 joining notifies c1 at once")

	before := f2.notified.Load()
	require.NoError(t, c1.UnregisterConsumer(ctx, "hb-group"))
	assert.Equal(t, []string{c2.ID()}, consumerList(t, c2, b.Addr(), "hb-group"))
	require.Eventually(t, func() bool { return f2.notified.Load() > before }, 3*time.Second, 10*time.Millisecond,
		"c1 leaving notifies c2")
	require.NoError(t, c1.UnregisterProducer(ctx, "hb-producers"))
}

func TestHeartbeatTimer(t *testing.T) {
	b := startBroker(t)
	c := newClient(t, b, func(o *Options) { o.HeartbeatInterval = 50 * time.Millisecond })
	createTopic(t, c, b.Addr(), "hbt", 1)
	_, err := c.Route(context.Background(), "hbt")
	require.NoError(t, err)
	require.NoError(t, c.RegisterConsumer("timer-group", &fakeConsumer{group: "timer-group"}))
	require.Eventually(t, func() bool {
		return len(consumerList(t, c, b.Addr(), "timer-group")) == 1
	}, 3*time.Second, 20*time.Millisecond)
}

func TestServeBrokerRequests(t *testing.T) {
	c, err := New(Options{NameServers: []string{"127.0.0.1:1"}, Logger: quietLogger()})
	require.NoError(t, err)
	defer c.Close(context.Background())
	f := &fakeConsumer{group: "g"}
	require.NoError(t, c.RegisterConsumer("g", f))

	req := protocol.NewRequestWith(protocol.NotifyConsumerIDsChanged, &protocol.NotifyConsumerIDsChangedRequestHeader{ConsumerGroup: "g"}, nil)
	assert.Nil(t, c.serve(context.Background(), nil, req))
	assert.EqualValues(t, 1, f.notified.Load())

	req = protocol.NewRequestWith(protocol.GetConsumerRunningInfo, &protocol.GetConsumerRunningInfoRequestHeader{ConsumerGroup: "g", ClientID: c.ID()}, nil)
	resp := c.serve(context.Background(), nil, req)
	require.Equal(t, protocol.Success, resp.ResponseCode())
	info, err := protocol.DecodeConsumerRunningInfo(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, "g", info.Properties["group"])

	req = protocol.NewRequestWith(protocol.GetConsumerRunningInfo, &protocol.GetConsumerRunningInfoRequestHeader{ConsumerGroup: "other", ClientID: c.ID()}, nil)
	assert.Equal(t, protocol.SystemError, c.serve(context.Background(), nil, req).ResponseCode())

	mq := protocol.MessageQueue{Topic: "t", BrokerName: "b", QueueID: 1}
	body, err := (&protocol.ResetOffsetBody{OffsetTable: map[protocol.MessageQueue]int64{mq: 42}}).Encode()
	require.NoError(t, err)
	req = protocol.NewRequestWith(protocol.ResetConsumerOffset, &protocol.ResetOffsetRequestHeader{Topic: "t", Group: "g", Timestamp: 1}, body)
	assert.Equal(t, protocol.Success, c.serve(context.Background(), nil, req).ResponseCode())
	f.mu.Lock()
	assert.Equal(t, int64(42), f.reset[mq])
	f.mu.Unlock()

	req = protocol.NewRequest(protocol.PullMessage, nil, nil)
	assert.Equal(t, protocol.RequestCodeNotSupported, c.serve(context.Background(), nil, req).ResponseCode())
}

func TestClosed(t *testing.T) {
	c, err := New(Options{NameServers: []string{"127.0.0.1:1"}})
	require.NoError(t, err)
	require.NoError(t, c.Close(context.Background()))
	require.NoError(t, c.Close(context.Background()))
	require.ErrorIs(t, c.Start(), ErrClosed)
	require.ErrorIs(t, c.RegisterConsumer("g", &fakeConsumer{}), ErrClosed)
	require.ErrorIs(t, c.RegisterProducer("g"), ErrClosed)
}
