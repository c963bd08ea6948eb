package clientcore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// Defaults of Options.
const (
	// DefaultHeartbeatInterval is how often a Client heartbeats every broker it knows. RocketMQ
	// clients heartbeat every 30 s; flowd's heartbeat every 10 s so that a broker configured
	// with a short client expiry notices a silent member within seconds.
	DefaultHeartbeatInterval = 10 * time.Second
	// DefaultRouteRefreshInterval is how often cached routes are fetched again (RocketMQ's
	// pollNameServerInterval).
	DefaultRouteRefreshInterval = 30 * time.Second
	// DefaultRequestTimeout bounds a request whose context has no deadline.
	DefaultRequestTimeout = 3 * time.Second
	// DefaultDialTimeout bounds connecting to a broker or name server (RocketMQ's connect
	// timeout).
	DefaultDialTimeout = remoting.DefaultDialTimeout
)

// Options configures a Client. A zero field takes the default its comment gives.
type Options struct {
	// NameServers are the name-server addresses, "host:port". An entry may also hold several
	// addresses separated by ';', RocketMQ's namesrvAddr form. Required.
	NameServers []string

	// InstanceName is the part of the client id after the '@'. Default DefaultInstanceName().
	InstanceName string

	// ClientIP is the part of the client id before the '@'. Default LocalIP().
	ClientIP string

	// Logger receives the client's logs. Default slog.Default().
	Logger *slog.Logger

	// HeartbeatInterval is how often every known broker is sent a heartbeat. Default
	// DefaultHeartbeatInterval.
	HeartbeatInterval time.Duration

	// RouteRefreshInterval is how often cached routes are fetched again. Default
	// DefaultRouteRefreshInterval.
	RouteRefreshInterval time.Duration

	// RequestTimeout bounds each request whose context carries no deadline. Default
	// DefaultRequestTimeout.
	RequestTimeout time.Duration

	// DialTimeout bounds connecting to a broker or name server. Default DefaultDialTimeout.
	DialTimeout time.Duration

	// JSONHeaders makes the client's requests carry JSON headers. By default they carry the
	// binary ROCKETMQ headers, which cost a fraction of JSON to write and to read on both
	// sides.
	//
	// The binary default is safe against any RocketMQ broker or name server: RocketMQ's
	// RemotingCommand decodes a header by the serialize type in its frame's header mark (its
	// headerDecode takes JSON and ROCKETMQ alike), and NettyRemotingAbstract answers each
	// request in the request's own type (processRequestCommand copies the request's
	// serializeTypeCurrentRPC into the response). Requests the broker sends the client
	// (NOTIFY_CONSUMER_IDS_CHANGED, CHECK_TRANSACTION_STATE, …) are read in either type. Set
	// this for a server that only reads JSON headers, such as a proxy that parses them.
	JSONHeaders bool
}

// Consumer is what a consumer registers into a Client: the Client asks it what to put in
// heartbeats and passes it the broker's requests for its group.
//
// Every method must return promptly: they run on the Client's timers, on a connection's
// goroutines or on the goroutine of the caller of a Client method. None is called with
// Client.mu held, so every method may call the Client back, except that none may call Close
// (which waits for them), and ConsumerData has a further restriction (see there).
type Consumer interface {
	// ConsumerData describes the group for heartbeats. It is called with the Client's
	// heartbeat lock held, so that a heartbeat cannot overtake an unregistration: it must not
	// call SendHeartbeat, UnregisterConsumer, UnregisterProducer or Close.
	ConsumerData() protocol.ConsumerData
	// NotifyConsumerIDsChanged is called when a broker reports that the group's membership
	// changed. It must not block: trigger a rebalance and return.
	NotifyConsumerIDsChanged()
	// RouteChanged is called after a route refresh changed the readable queues of topic;
	// queues is the new sorted list.
	RouteChanged(topic string, queues []protocol.MessageQueue)
	// RunningInfo answers GET_CONSUMER_RUNNING_INFO.
	RunningInfo() *protocol.ConsumerRunningInfo
	// ResetOffset applies RESET_CONSUMER_OFFSET: the consumer moves its offsets of topic's
	// queues to those given.
	ResetOffset(topic string, offsets map[protocol.MessageQueue]int64)
	// ConnectionLost is called after the connection to the brokers named (those whose master
	// address, as a cached route gives it, is the connection's remote address) closed, while
	// the Client is open. A flowd broker drops a member whose connection closes, and releases
	// its queue locks at once: the consumer must stop relying on the locks it held there and
	// heartbeat again. The next request redials.
	ConnectionLost(brokerNames []string)
}

// Client is the shared client core. Create it with New, call Start, and Close it when every
// producer and consumer using it is done. It is safe for concurrent use.
type Client struct {
	id   string
	opts Options
	log  *slog.Logger
	rc   *remoting.Client
	ns   []string

	// hbMu serializes heartbeats with unregistrations, so that a heartbeat built before a group
	// was unregistered cannot reach a broker after the unregistration and register it again.
	// Lock order: hbMu before mu.
	hbMu sync.Mutex

	mu        sync.Mutex
	nsCursor  int
	routes    map[string]*Route
	fetching  map[string]*routeCall // route fetches in progress, by topic
	consumers map[string]Consumer
	producers map[string]struct{}
	checkers  map[string]TransactionChecker // by producer group
	started   bool
	closed    bool

	// replies are the request-reply calls waiting (ExpectReply), by correlation id.
	replies map[string]chan *protocol.MessageExt

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New returns a Client. Nothing is dialed and no timer runs until Start.
func New(opts Options) (*Client, error) {
	var ns []string
	for _, a := range opts.NameServers {
		for _, s := range strings.Split(a, ";") {
			if s = strings.TrimSpace(s); s != "" {
				ns = append(ns, s)
			}
		}
	}
	if len(ns) == 0 {
		return nil, ErrNoNameServers
	}
	if opts.InstanceName == "" {
		opts.InstanceName = DefaultInstanceName()
	}
	if opts.ClientIP == "" {
		opts.ClientIP = LocalIP()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.HeartbeatInterval <= 0 {
		opts.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if opts.RouteRefreshInterval <= 0 {
		opts.RouteRefreshInterval = DefaultRouteRefreshInterval
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = DefaultRequestTimeout
	}
	c := &Client{
		id:        opts.ClientIP + "@" + opts.InstanceName,
		opts:      opts,
		ns:        ns,
		routes:    map[string]*Route{},
		fetching:  map[string]*routeCall{},
		consumers: map[string]Consumer{},
		producers: map[string]struct{}{},
		checkers:  map[string]TransactionChecker{},
		replies:   map[string]chan *protocol.MessageExt{},
	}
	c.log = opts.Logger.With("client", c.id)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	serialize := protocol.RocketMQ
	if opts.JSONHeaders {
		serialize = protocol.JSON
	}
	c.rc = remoting.NewClient(remoting.ClientOptions{
		Serialize:   serialize,
		Handler:     remoting.HandlerFunc(c.serve),
		Logger:      c.log,
		DialTimeout: opts.DialTimeout,
		OnConnClose: c.connClosed,
	})
	return c, nil
}

// ID is the client id brokers know this client by: "ip@instance".
func (c *Client) ID() string { return c.id }

// Logger is the client's logger, carrying the client id.
func (c *Client) Logger() *slog.Logger { return c.log }

// RequestTimeout is the bound of a request whose context has no deadline
// (Options.RequestTimeout).
func (c *Client) RequestTimeout() time.Duration { return c.opts.RequestTimeout }

// Start starts the heartbeat and route-refresh timers. Starting a started Client does nothing.
func (c *Client) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if c.started {
		return nil
	}
	c.started = true
	c.wg.Add(2)
	go c.loop(c.opts.HeartbeatInterval, func(ctx context.Context) {
		if err := c.SendHeartbeat(ctx); err != nil {
			c.log.Debug("heartbeat failed", "err", err)
		}
	})
	go c.loop(c.opts.RouteRefreshInterval, c.refreshRoutes)
	return nil
}

func (c *Client) loop(every time.Duration, fn func(ctx context.Context)) {
	defer c.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
			fn(c.ctx)
		}
	}
}

// Close unregisters the groups still registered (producers and consumers normally unregister
// themselves first, after handing their queues over), stops the timers and route fetches,
// and closes every connection, failing the calls still pending. It returns once every
// goroutine of the Client has ended. ctx bounds the unregistrations; their failures are
// returned, but the Client is closed regardless.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	consumers := slices.Collect(maps.Keys(c.consumers))
	producers := slices.Collect(maps.Keys(c.producers))
	c.mu.Unlock()
	var errs []error
	for _, g := range consumers {
		errs = append(errs, c.unregister(ctx, g, true))
	}
	for _, g := range producers {
		errs = append(errs, c.unregister(ctx, g, false))
	}
	c.cancel()
	c.wg.Wait()
	errs = append(errs, c.rc.Close())
	return errors.Join(errs...)
}

// withTimeout bounds ctx by RequestTimeout when it has no deadline of its own.
func (c *Client) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.opts.RequestTimeout)
}

// Invoke sends req to addr and waits for the response, bounded by ctx or, when ctx has no
// deadline, by RequestTimeout. A response with a failure code is returned as a response, not
// an error: callers decide which codes they expect.
func (c *Client) Invoke(ctx context.Context, addr string, req *protocol.Command) (*protocol.Command, error) {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	return c.rc.Invoke(ctx, addr, req)
}

// InvokeAsync sends req to addr and calls done with the response or the error, without a
// goroutine waiting for it: done runs on the connection's read goroutine (or a timer's), so it
// must not block. timeout bounds the wait for the response (RequestTimeout when <= 0), and ctx
// ends it early. Only a first call to addr waits, for the dial. When InvokeAsync returns an
// error, done is not called. See remoting.Conn.InvokeAsync.
func (c *Client) InvokeAsync(ctx context.Context, addr string, req *protocol.Command, timeout time.Duration, done func(*protocol.Command, error)) error {
	if timeout <= 0 {
		timeout = c.opts.RequestTimeout
	}
	return c.rc.InvokeAsync(ctx, addr, req, timeout, done)
}

// InvokeAsyncRaw is InvokeAsync with the outcome handed to r, and the response's binary
// header fields left raw (see remoting.Conn.InvokeAsyncRaw).
func (c *Client) InvokeAsyncRaw(ctx context.Context, addr string, req *protocol.Command, timeout time.Duration, r remoting.AsyncReceiver) error {
	if timeout <= 0 {
		timeout = c.opts.RequestTimeout
	}
	return c.rc.InvokeAsyncRaw(ctx, addr, req, timeout, r)
}

// InvokeOneway sends req to addr without waiting for a response.
func (c *Client) InvokeOneway(ctx context.Context, addr string, req *protocol.Command) error {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	return c.rc.InvokeOneway(ctx, addr, req)
}

// InvokeOK is Invoke for requests that must answer SUCCESS: any other code is returned as a
// *BrokerError.
func (c *Client) InvokeOK(ctx context.Context, addr string, req *protocol.Command) (*protocol.Command, error) {
	code := req.RequestCode()
	resp, err := c.Invoke(ctx, addr, req)
	if err != nil {
		return nil, err
	}
	if resp.ResponseCode() != protocol.Success {
		return resp, fmt.Errorf("%s to %s: %w", code, addr, NewBrokerError(resp))
	}
	return resp, nil
}

// invokeNameServer sends req to the name servers in turn, starting with the last one that
// answered, until one answers. The answer is returned whatever its code: only a transport
// failure moves on to the next name server.
func (c *Client) invokeNameServer(ctx context.Context, req *protocol.Command) (*protocol.Command, error) {
	c.mu.Lock()
	start := c.nsCursor
	c.mu.Unlock()
	var errs []error
	for i := range c.ns {
		idx := (start + i) % len(c.ns)
		addr := c.ns[idx]
		resp, err := c.Invoke(ctx, addr, req)
		if err == nil {
			if idx != start {
				c.mu.Lock()
				c.nsCursor = idx
				c.mu.Unlock()
			}
			return resp, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("no name server answered %s: %w", req.RequestCode(), errors.Join(errs...))
}

// RegisterConsumer registers cons as the consumer of group. A group registers once per Client.
func (c *Client) RegisterConsumer(group string, cons Consumer) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if _, ok := c.consumers[group]; ok {
		return fmt.Errorf("consumer group %q: %w", group, ErrGroupRegistered)
	}
	c.consumers[group] = cons
	return nil
}

// RegisterProducer registers a producer of group.
func (c *Client) RegisterProducer(group string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if _, ok := c.producers[group]; ok {
		return fmt.Errorf("producer group %q: %w", group, ErrGroupRegistered)
	}
	c.producers[group] = struct{}{}
	return nil
}

// TransactionChecker answers a broker's CHECK_TRANSACTION_STATE for a producer group: the
// broker asks for the outcome of a transactional half message whose producer left it
// unresolved. The producer answers with END_TRANSACTION to brokerAddr.
type TransactionChecker interface {
	// CheckTransaction is called on the connection's goroutine and must not block: start the
	// check and return. msg is the half message, with its real topic and queue.
	CheckTransaction(brokerAddr string, h *protocol.CheckTransactionStateRequestHeader, msg *protocol.MessageExt)
}

// SetTransactionChecker makes tc answer the check-backs of group's half messages; a nil tc
// removes it. Check-backs for a group without one are logged and dropped (the broker asks
// again later).
func (c *Client) SetTransactionChecker(group string, tc TransactionChecker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if tc == nil {
		delete(c.checkers, group)
		return
	}
	c.checkers[group] = tc
}

// UnregisterConsumer removes group's consumer and sends UNREGISTER_CLIENT to every known
// broker, so that they drop this client from the group at once and notify the other members.
func (c *Client) UnregisterConsumer(ctx context.Context, group string) error {
	return c.unregister(ctx, group, true)
}

// UnregisterProducer removes group's producer and tells every known broker.
func (c *Client) UnregisterProducer(ctx context.Context, group string) error {
	return c.unregister(ctx, group, false)
}

func (c *Client) unregister(ctx context.Context, group string, consumer bool) error {
	c.hbMu.Lock()
	defer c.hbMu.Unlock()
	c.mu.Lock()
	if consumer {
		delete(c.consumers, group)
	} else {
		delete(c.producers, group)
	}
	c.mu.Unlock()
	h := protocol.UnregisterClientRequestHeader{ClientID: c.id}
	if consumer {
		h.ConsumerGroup = group
	} else {
		h.ProducerGroup = group
	}
	var errs []error
	for _, addr := range c.BrokerAddrs() {
		if _, err := c.InvokeOK(ctx, addr, protocol.NewRequestWith(protocol.UnregisterClient, &h, nil)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("unregister group %q: %w", group, err)
	}
	return nil
}

// consumer returns group's registered consumer, or nil.
func (c *Client) consumer(group string) Consumer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.consumers[group]
}

// SendHeartbeat sends one heartbeat, naming every registered producer and consumer group, to
// every broker of every cached route. It returns the errors of the brokers that failed.
func (c *Client) SendHeartbeat(ctx context.Context) error {
	c.hbMu.Lock()
	defer c.hbMu.Unlock()
	c.mu.Lock()
	hb := protocol.HeartbeatData{ClientID: c.id}
	for g := range c.producers {
		hb.ProducerDataSet = append(hb.ProducerDataSet, protocol.ProducerData{GroupName: g})
	}
	conss := make([]Consumer, 0, len(c.consumers))
	for _, cons := range c.consumers {
		conss = append(conss, cons)
	}
	c.mu.Unlock()
	for _, cons := range conss {
		hb.ConsumerDataSet = append(hb.ConsumerDataSet, cons.ConsumerData())
	}
	if len(hb.ProducerDataSet) == 0 && len(hb.ConsumerDataSet) == 0 {
		return nil
	}
	body, err := hb.Encode()
	if err != nil {
		return fmt.Errorf("encode heartbeat: %w", err)
	}
	var errs []error
	for _, addr := range c.BrokerAddrs() {
		if _, err := c.InvokeOK(ctx, addr, protocol.NewRequest(protocol.HeartBeat, nil, body)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// connClosed tells the registered consumers which brokers a closed connection led to.
func (c *Client) connClosed(conn *remoting.Conn) {
	remote := conn.RemoteAddr().String()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	names := map[string]bool{}
	for _, r := range c.routes {
		for name, addr := range r.masters {
			if sameEndpoint(addr, remote) {
				names[name] = true
			}
		}
	}
	conss := slices.Collect(maps.Values(c.consumers))
	c.mu.Unlock()
	if len(names) == 0 {
		return // a name server, or a broker no route names
	}
	brokers := slices.Sorted(maps.Keys(names))
	c.log.Info("connection to broker lost", "addr", remote, "brokers", brokers)
	for _, cons := range conss {
		cons.ConnectionLost(slices.Clone(brokers))
	}
}

// sameEndpoint reports whether routeAddr, a "host:port" from a route, may be the endpoint
// remote ("ip:port") of a connection dialed to it. A host name is assumed to resolve to
// remote when the ports agree: a false match only costs a lock renewal.
func sameEndpoint(routeAddr, remote string) bool {
	if routeAddr == remote {
		return true
	}
	host, port, err := net.SplitHostPort(routeAddr)
	if err != nil {
		return false
	}
	rhost, rport, err := net.SplitHostPort(remote)
	if err != nil || port != rport {
		return false
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return true // a host name
	}
	b, err := netip.ParseAddr(rhost)
	return err == nil && a.Unmap() == b.Unmap()
}

// serve answers the requests brokers send to the client.
func (c *Client) serve(_ context.Context, conn *remoting.Conn, req *protocol.Command) *protocol.Command {
	switch req.RequestCode() {
	case protocol.CheckTransactionState:
		c.checkTransaction(conn, req)
		return nil
	case protocol.PushReplyMessageToClient:
		return c.pushReply(conn, req)
	case protocol.NotifyConsumerIDsChanged:
		var h protocol.NotifyConsumerIDsChangedRequestHeader
		if err := req.DecodeHeader(&h); err != nil {
			c.log.Warn("bad notification from broker", "err", err)
			return nil
		}
		if cons := c.consumer(h.ConsumerGroup); cons != nil {
			c.log.Debug("consumer ids changed", "group", h.ConsumerGroup)
			cons.NotifyConsumerIDsChanged()
		}
		return nil
	case protocol.GetConsumerRunningInfo:
		var h protocol.GetConsumerRunningInfoRequestHeader
		if err := req.DecodeHeader(&h); err != nil {
			return protocol.NewResponse(req, protocol.InvalidParameter, err.Error())
		}
		cons := c.consumer(h.ConsumerGroup)
		if cons == nil {
			return protocol.NewResponse(req, protocol.SystemError, fmt.Sprintf("the consumer group %q does not exist in client %s", h.ConsumerGroup, c.id))
		}
		body, err := cons.RunningInfo().Encode()
		if err != nil {
			return protocol.NewResponse(req, protocol.SystemError, err.Error())
		}
		resp := protocol.NewResponse(req, protocol.Success, "")
		resp.Body = body
		return resp
	case protocol.ResetConsumerOffset:
		var h protocol.ResetOffsetRequestHeader
		if err := req.DecodeHeader(&h); err != nil {
			return protocol.NewResponse(req, protocol.InvalidParameter, err.Error())
		}
		body, err := protocol.DecodeResetOffsetBody(req.Body)
		if err != nil {
			return protocol.NewResponse(req, protocol.InvalidParameter, err.Error())
		}
		if cons := c.consumer(h.Group); cons != nil {
			c.log.Info("broker resets offsets", "group", h.Group, "topic", h.Topic, "queues", len(body.OffsetTable))
			cons.ResetOffset(h.Topic, body.OffsetTable)
		}
		return protocol.NewResponse(req, protocol.Success, "")
	}
	return protocol.NewResponse(req, protocol.RequestCodeNotSupported, fmt.Sprintf("request code %d (%s) is not supported by client %s", req.Code, req.RequestCode(), c.id))
}

// checkTransaction hands a CHECK_TRANSACTION_STATE (oneway) to the checker of the half
// message's producer group (its PGROUP property).
func (c *Client) checkTransaction(conn *remoting.Conn, req *protocol.Command) {
	var h protocol.CheckTransactionStateRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		c.log.Warn("bad transaction check-back from broker", "err", err)
		return
	}
	msg, _, err := protocol.DecodeStored(req.Body)
	if err != nil {
		c.log.Warn("bad transaction check-back from broker", "err", fmt.Errorf("message: %w", err))
		return
	}
	group := msg.Properties[protocol.PropertyProducerGroup]
	c.mu.Lock()
	tc := c.checkers[group]
	c.mu.Unlock()
	if tc == nil {
		c.log.Warn("transaction check-back for a producer group without a transaction listener", "group", group, "halfOffset", h.TranStateTableOffset)
		return
	}
	addr := ""
	if conn != nil {
		addr = conn.RemoteAddr().String()
	}
	tc.CheckTransaction(addr, &h, msg)
}
