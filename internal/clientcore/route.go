package clientcore

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/flowd-io/flowd/protocol"
)

// Route is one topic's route and what is derived from it. A Route is immutable once built;
// a refresh replaces it.
type Route struct {
	// Topic is the topic the route is for.
	Topic string
	// Data is the route as the name server sent it.
	Data *protocol.TopicRouteData
	// PublishQueues are the writable queues on brokers with a master, sorted by
	// protocol.MessageQueue.Compare.
	PublishQueues []protocol.MessageQueue
	// SubscribeQueues are the readable queues, sorted by protocol.MessageQueue.Compare.
	SubscribeQueues []protocol.MessageQueue

	masters map[string]string   // broker name → master address
	members map[string][]Member // broker name → every member the route lists, by id
}

// Member is one member of a broker's replica set as a route lists it: the master as
// protocol.MasterID (0), replicas by their broker ids.
type Member struct {
	ID   int64
	Addr string
}

// NewRoute derives a Route from route data.
func NewRoute(topic string, data *protocol.TopicRouteData) *Route {
	r := &Route{Topic: topic, Data: data, masters: map[string]string{}, members: map[string][]Member{}}
	for _, bd := range data.BrokerDatas {
		if addr, ok := bd.BrokerAddrs[protocol.MasterID]; ok && addr != "" {
			r.masters[bd.BrokerName] = addr
		}
		for id, addr := range bd.BrokerAddrs {
			if addr != "" && id >= 0 && !slices.ContainsFunc(r.members[bd.BrokerName], func(m Member) bool { return m.ID == id }) {
				r.members[bd.BrokerName] = append(r.members[bd.BrokerName], Member{ID: id, Addr: addr})
			}
		}
	}
	for _, ms := range r.members {
		slices.SortFunc(ms, func(a, b Member) int { return cmp.Compare(a.ID, b.ID) })
	}
	for _, qd := range data.QueueDatas {
		if qd.Perm&protocol.PermRead != 0 {
			for i := range int(qd.ReadQueueNums) {
				r.SubscribeQueues = append(r.SubscribeQueues, protocol.MessageQueue{Topic: topic, BrokerName: qd.BrokerName, QueueID: i})
			}
		}
		if _, ok := r.masters[qd.BrokerName]; ok && qd.Perm&protocol.PermWrite != 0 {
			for i := range int(qd.WriteQueueNums) {
				r.PublishQueues = append(r.PublishQueues, protocol.MessageQueue{Topic: topic, BrokerName: qd.BrokerName, QueueID: i})
			}
		}
	}
	slices.SortFunc(r.SubscribeQueues, protocol.MessageQueue.Compare)
	slices.SortFunc(r.PublishQueues, protocol.MessageQueue.Compare)
	r.SubscribeQueues = slices.Compact(r.SubscribeQueues)
	r.PublishQueues = slices.Compact(r.PublishQueues)
	return r
}

// BrokerAddr returns the master address of the named broker, as this route gives it.
func (r *Route) BrokerAddr(brokerName string) (string, bool) {
	addr, ok := r.masters[brokerName]
	return addr, ok
}

// SubscribeAddr returns the address of member brokerID (0: the master) of the named
// broker, as this route gives it.
func (r *Route) SubscribeAddr(brokerName string, brokerID int64) (string, bool) {
	for _, m := range r.members[brokerName] {
		if m.ID == brokerID {
			return m.Addr, true
		}
	}
	return "", false
}

// Members returns every member of the named broker this route lists, sorted by broker id.
// The slice is the route's: it must not be modified.
func (r *Route) Members(brokerName string) []Member { return r.members[brokerName] }

// BrokerAddrs returns the master address of every broker in the route, sorted.
func (r *Route) BrokerAddrs() []string {
	out := slices.Collect(maps.Values(r.masters))
	slices.Sort(out)
	return slices.Compact(out)
}

// sameAs reports whether r and o give the same queues and brokers.
func (r *Route) sameAs(o *Route) bool {
	return slices.Equal(r.SubscribeQueues, o.SubscribeQueues) &&
		slices.Equal(r.PublishQueues, o.PublishQueues) && maps.Equal(r.masters, o.masters) &&
		maps.EqualFunc(r.members, o.members, slices.Equal)
}

// Route returns topic's cached route, fetching it from the name servers when it is not
// cached. A topic the name servers do not know is an error wrapping ErrTopicNotExist.
func (c *Client) Route(ctx context.Context, topic string) (*Route, error) {
	if r, ok := c.CachedRoute(topic); ok {
		return r, nil
	}
	return c.UpdateRoute(ctx, topic)
}

// CachedRoute returns topic's route if it is cached.
func (c *Client) CachedRoute(topic string) (*Route, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.routes[topic]
	return r, ok
}

// routeCall is one route fetch that concurrent UpdateRoute calls for a topic share.
type routeCall struct {
	done    chan struct{} // closed when r and err are set
	r       *Route
	err     error
	callers int // how many UpdateRoute calls share this fetch; guarded by Client.mu
}

// UpdateRoute fetches topic's route from the name servers now and caches it. When the readable
// queues changed, every registered consumer is told (Consumer.RouteChanged), after the cache
// has been updated.
//
// Concurrent calls for one topic share one request, bounded by RequestTimeout and Close, and
// each waits for it as long as its own ctx allows: a thousand sends to a topic that has no
// route yet ask the name servers once, not a thousand times (which would also overflow the
// broker's limit of requests in flight on one connection).
func (c *Client) UpdateRoute(ctx context.Context, topic string) (*Route, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, fmt.Errorf("route of topic %q: %w", topic, ErrClosed)
	}
	call := c.fetching[topic]
	if call == nil {
		call = &routeCall{done: make(chan struct{})}
		c.fetching[topic] = call
		c.wg.Add(1)
		go c.fetchRoute(topic, call)
	}
	call.callers++
	c.mu.Unlock()
	select {
	case <-call.done:
		return call.r, call.err
	case <-ctx.Done():
		return nil, fmt.Errorf("route of topic %q: %w", topic, ctx.Err())
	}
}

// fetchRoute runs one shared route fetch. The consumers are told of a change after the
// waiters are released, so that a hook may call UpdateRoute itself, and with the route cached
// at that moment, so that two fetches that finish close together cannot report their answers
// out of order.
func (c *Client) fetchRoute(topic string, call *routeCall) {
	defer c.wg.Done()
	ctx, cancel := context.WithTimeout(c.ctx, c.opts.RequestTimeout)
	defer cancel()
	r, changed, err := c.fetchAndCache(ctx, topic)
	c.mu.Lock()
	delete(c.fetching, topic)
	c.mu.Unlock()
	call.r, call.err = r, err
	close(call.done)
	if !changed {
		return
	}
	c.mu.Lock()
	cur := c.routes[topic]
	conss := slices.Collect(maps.Values(c.consumers))
	c.mu.Unlock()
	if cur == nil {
		return
	}
	for _, cons := range conss {
		cons.RouteChanged(topic, slices.Clone(cur.SubscribeQueues))
	}
}

// fetchAndCache asks the name servers for topic's route and caches it. changed reports that
// the readable queues differ from those of the route cached before.
func (c *Client) fetchAndCache(ctx context.Context, topic string) (r *Route, changed bool, err error) {
	h := protocol.GetRouteInfoRequestHeader{Topic: topic}
	resp, err := c.invokeNameServer(ctx, protocol.NewRequestWith(protocol.GetRouteInfoByTopic, &h, nil))
	if err != nil {
		return nil, false, fmt.Errorf("route of topic %q: %w", topic, err)
	}
	switch resp.ResponseCode() {
	case protocol.Success:
	case protocol.TopicNotExist:
		return nil, false, fmt.Errorf("route of topic %q: %w: %w", topic, ErrTopicNotExist, NewBrokerError(resp))
	default:
		return nil, false, fmt.Errorf("route of topic %q: %w", topic, NewBrokerError(resp))
	}
	data, err := protocol.DecodeTopicRouteData(resp.Body)
	if err != nil {
		return nil, false, fmt.Errorf("route of topic %q: %w", topic, err)
	}
	r = NewRoute(topic, data)
	c.mu.Lock()
	old := c.routes[topic]
	if old != nil && old.sameAs(r) {
		c.mu.Unlock()
		return old, false, nil // unchanged: keep the value callers may already hold
	}
	c.routes[topic] = r
	c.mu.Unlock()
	if old == nil {
		return r, false, nil
	}
	c.log.Info("route changed", "topic", topic, "readQueues", len(r.SubscribeQueues), "writeQueues", len(r.PublishQueues))
	return r, !slices.Equal(old.SubscribeQueues, r.SubscribeQueues), nil
}

// refreshRoutes fetches every cached route again.
func (c *Client) refreshRoutes(ctx context.Context) {
	c.mu.Lock()
	topics := slices.Collect(maps.Keys(c.routes))
	c.mu.Unlock()
	for _, t := range topics {
		if ctx.Err() != nil {
			return
		}
		if _, err := c.UpdateRoute(ctx, t); err != nil {
			c.log.Debug("route refresh failed", "topic", t, "err", err)
		}
	}
}

// BrokerAddr returns the master address of the named broker from any cached route.
func (c *Client) BrokerAddr(brokerName string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.routes {
		if addr, ok := r.masters[brokerName]; ok {
			return addr, true
		}
	}
	return "", false
}

// FindBrokerAddr returns the master address of the named broker, refreshing topic's route when
// no cached route names it.
func (c *Client) FindBrokerAddr(ctx context.Context, brokerName, topic string) (string, error) {
	if addr, ok := c.BrokerAddr(brokerName); ok {
		return addr, nil
	}
	r, err := c.UpdateRoute(ctx, topic)
	if err != nil {
		return "", fmt.Errorf("find broker %q: %w", brokerName, err)
	}
	if addr, ok := r.BrokerAddr(brokerName); ok {
		return addr, nil
	}
	return "", fmt.Errorf("%w: %q (topic %q)", ErrBrokerNotFound, brokerName, topic)
}

// Members returns every member of the named broker that a cached route lists, sorted by
// broker id (the master, 0, first); nil when no cached route names the broker. The slice
// is a route's: it must not be modified.
func (c *Client) Members(brokerName string) []Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	var best []Member
	for _, r := range c.routes {
		if ms := r.members[brokerName]; len(ms) > len(best) {
			best = ms // the routes of one broker's topics list the same members; take the fullest
		}
	}
	return best
}

// SubscribeAddr returns the address of member brokerID (0: the master) of the named broker
// from any cached route, as RocketMQ's findBrokerAddressInSubscribe with onlyThisBroker.
func (c *Client) SubscribeAddr(brokerName string, brokerID int64) (string, bool) {
	for _, m := range c.Members(brokerName) {
		if m.ID == brokerID {
			return m.Addr, true
		}
	}
	return "", false
}

// FindSubscribeAddr returns the address of a member of the named broker to pull from:
// member brokerID when a route lists it, else the master, else the member with the lowest
// id (a route without a master: one served by a replica while its set has none), as
// RocketMQ's findBrokerAddressInSubscribe; id is the member's. topic's route is refreshed
// when no cached route names the broker.
func (c *Client) FindSubscribeAddr(ctx context.Context, brokerName, topic string, brokerID int64) (addr string, id int64, err error) {
	ms := c.Members(brokerName)
	if len(ms) == 0 {
		r, err := c.UpdateRoute(ctx, topic)
		if err != nil {
			return "", 0, fmt.Errorf("find broker %q: %w", brokerName, err)
		}
		ms = r.Members(brokerName)
	}
	if len(ms) == 0 {
		return "", 0, fmt.Errorf("%w: %q (topic %q)", ErrBrokerNotFound, brokerName, topic)
	}
	pick := ms[0]
	for _, m := range ms {
		if m.ID == brokerID {
			return m.Addr, m.ID, nil
		}
		if m.ID == protocol.MasterID {
			pick = m
		}
	}
	return pick.Addr, pick.ID, nil
}

// BrokerAddrs returns the master address of every broker named in a cached route, sorted.
func (c *Client) BrokerAddrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, r := range c.routes {
		for _, addr := range r.masters {
			out = append(out, addr)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
