package clientcore

import (
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// wait bounds every wait for something asynchronous: generous, since a loaded machine running
// the race detector can be slow, and free when things go well (the waits end as soon as the
// condition holds). Tests never assert how fast something happens.
const wait = 15 * time.Second

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
	lost     [][]string
}

func (f *fakeConsumer) ConnectionLost(brokers []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lost = append(f.lost, brokers)
}

func (f *fakeConsumer) lostCalls() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.lost)
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

	// Neither address is dialed (nothing is until a request), and both are loopback anyway.
	c, err := New(Options{NameServers: []string{"127.0.0.1:1;127.0.0.1:2 ", " 127.0.0.1:3"}, ClientIP: "10.1.2.3", InstanceName: "inst"})
	require.NoError(t, err)
	defer c.Close(context.Background())
	assert.Equal(t, "10.1.2.3@inst", c.ID(), "the client IP only labels the client id")
	assert.Equal(t, []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}, c.ns)
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
	}, wait, 20*time.Millisecond)

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
	require.Eventually(t, func() bool { return f1.notified.Load() > 0 }, wait, 10*time.Millisecond,
		"c2 joining notifies c1 at once")

	before := f2.notified.Load()
	require.NoError(t, c1.UnregisterConsumer(ctx, "hb-group"))
	assert.Equal(t, []string{c2.ID()}, consumerList(t, c2, b.Addr(), "hb-group"))
	require.Eventually(t, func() bool { return f2.notified.Load() > before }, wait, 10*time.Millisecond,
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
	}, wait, 20*time.Millisecond)
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

// TestRouteFetchesCoalesce: concurrent UpdateRoute calls for one topic share one name-server
// request (a burst of sends to a topic without a route must not flood the name server, whose
// connection serves a bounded number of requests at once), and a caller's context bounds only
// its own wait.
func TestRouteFetchesCoalesce(t *testing.T) {
	var asked atomic.Int32
	release := make(chan struct{})
	route := &protocol.TopicRouteData{
		QueueDatas:  []protocol.QueueData{{BrokerName: "broker-a", ReadQueueNums: 2, WriteQueueNums: 2, Perm: protocol.PermRead | protocol.PermWrite}},
		BrokerDatas: []protocol.BrokerData{{Cluster: "c", BrokerName: "broker-a", BrokerAddrs: map[int64]string{protocol.MasterID: "127.0.0.1:1"}}},
	}
	body, err := route.Encode()
	require.NoError(t, err)
	srv := remoting.NewServer(remoting.HandlerFunc(func(ctx context.Context, _ *remoting.Conn, req *protocol.Command) *protocol.Command {
		asked.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		resp := protocol.NewResponse(req, protocol.Success, "")
		resp.Body = body
		return resp
	}), remoting.ServerOptions{Logger: quietLogger()})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	c := newClientAt(t, ln.Addr().String())
	const callers = 50
	errs := make(chan error, callers)
	for range callers {
		go func() {
			_, err := c.UpdateRoute(context.Background(), "herd")
			errs <- err
		}()
	}
	// Every caller has joined the one fetch in flight (a goroutine that started only after it
	// finished would rightly ask again).
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		call := c.fetching["herd"]
		return call != nil && call.callers == callers
	}, wait, time.Millisecond)
	require.Eventually(t, func() bool { return asked.Load() == 1 }, wait, time.Millisecond)
	// A caller that gives up does not end the fetch for the others.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = c.UpdateRoute(ctx, "herd")
	require.ErrorIs(t, err, context.Canceled)
	close(release)
	for range callers {
		require.NoError(t, <-errs)
	}
	assert.EqualValues(t, 1, asked.Load(), "one request for %d concurrent callers", callers)
	r, ok := c.CachedRoute("herd")
	require.True(t, ok)
	assert.Len(t, r.SubscribeQueues, 2)
	// Later calls ask again.
	_, err = c.UpdateRoute(context.Background(), "herd")
	require.NoError(t, err)
	assert.EqualValues(t, 2, asked.Load())
}

func newClientAt(t *testing.T, nameServer string) *Client {
	t.Helper()
	c, err := New(Options{NameServers: []string{nameServer}, Logger: quietLogger()})
	require.NoError(t, err)
	require.NoError(t, c.Start())
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	return c
}

// TestConnectionLostTellsConsumers: when the connection to a broker closes (the broker has
// then dropped the client's membership and queue locks), the registered consumers are told
// which brokers it led to; a name-server connection closing tells nobody.
func TestConnectionLostTellsConsumers(t *testing.T) {
	b := startBroker(t)
	c := newClient(t, b, nil)
	ctx := context.Background()
	createTopic(t, c, b.Addr(), "lost", 1)
	_, err := c.Route(ctx, "lost")
	require.NoError(t, err)
	f := &fakeConsumer{group: "lost-group"}
	require.NoError(t, c.RegisterConsumer("lost-group", f))
	require.NoError(t, c.SendHeartbeat(ctx))

	ns, err := c.rc.Conn(ctx, b.NamesrvAddr())
	require.NoError(t, err)
	require.NoError(t, ns.Close())
	conn, err := c.rc.Conn(ctx, b.Addr())
	require.NoError(t, err)
	require.NoError(t, conn.Close())
	require.Eventually(t, func() bool { return len(f.lostCalls()) > 0 }, wait, 5*time.Millisecond)
	assert.Equal(t, [][]string{{"broker-a"}}, f.lostCalls(), "the broker's connection only")
	require.Eventually(t, func() bool { return len(consumerList(t, c, b.Addr(), "lost-group")) == 0 }, wait, 5*time.Millisecond,
		"the broker dropped the member with its connection")
	require.NoError(t, c.SendHeartbeat(ctx), "the next request redials")
	assert.Equal(t, []string{c.ID()}, consumerList(t, c, b.Addr(), "lost-group"))

	// Closing the client does not report its own connections.
	require.NoError(t, c.Close(ctx))
	assert.Len(t, f.lostCalls(), 1)
}

func TestSameEndpoint(t *testing.T) {
	for _, tc := range []struct {
		route, remote string
		want          bool
	}{
		{"127.0.0.1:10911", "127.0.0.1:10911", true},
		{"127.0.0.1:10911", "127.0.0.1:9876", false},
		{"127.0.0.1:10911", "127.0.0.2:10911", false},
		{"[::ffff:127.0.0.1]:10911", "127.0.0.1:10911", true},
		{"broker.internal:10911", "10.0.0.7:10911", true}, // a host name may resolve there
		{"broker.internal:10911", "10.0.0.7:9876", false},
		{"garbage", "127.0.0.1:1", false},
	} {
		assert.Equal(t, tc.want, sameEndpoint(tc.route, tc.remote), "%s ~ %s", tc.route, tc.remote)
	}
}

// TestHeaderEncoding: requests carry binary ROCKETMQ headers unless JSONHeaders is set, and
// the answers, which come back in the request's encoding, are read either way.
func TestHeaderEncoding(t *testing.T) {
	route := &protocol.TopicRouteData{
		QueueDatas:  []protocol.QueueData{{BrokerName: "broker-a", ReadQueueNums: 2, WriteQueueNums: 2, Perm: protocol.PermRead | protocol.PermWrite}},
		BrokerDatas: []protocol.BrokerData{{Cluster: "c", BrokerName: "broker-a", BrokerAddrs: map[int64]string{protocol.MasterID: "127.0.0.1:1"}}},
	}
	body, err := route.Encode()
	require.NoError(t, err)
	seen := make(chan protocol.SerializeType, 16)
	srv := remoting.NewServer(remoting.HandlerFunc(func(ctx context.Context, _ *remoting.Conn, req *protocol.Command) *protocol.Command {
		seen <- req.Serialize
		resp := protocol.NewResponse(req, protocol.Success, "")
		resp.Body = body
		return resp
	}), remoting.ServerOptions{Logger: quietLogger()})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	for _, tc := range []struct {
		json bool
		want protocol.SerializeType
	}{{false, protocol.RocketMQ}, {true, protocol.JSON}} {
		c, err := New(Options{NameServers: []string{ln.Addr().String()}, Logger: quietLogger(), JSONHeaders: tc.json})
		require.NoError(t, err)
		r, err := c.UpdateRoute(context.Background(), "enc")
		require.NoError(t, err)
		assert.Len(t, r.PublishQueues, 2)
		assert.Equal(t, tc.want, <-seen, "JSONHeaders=%v", tc.json)
		require.NoError(t, c.Close(context.Background()))
	}
}
