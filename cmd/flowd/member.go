package main

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/cluster"
	"github.com/flowd-io/flowd/config"
	"github.com/flowd-io/flowd/protocol"
)

// clustered reports whether the node takes part in a cluster: its embedded NATS server has
// a route listener (nats.cluster.listen), or it connects to an existing NATS cluster
// (nats.urls). A node with neither serves alone, exactly as a single flowd always has.
func clustered(c config.Config) bool {
	return c.NATS.Enabled && (c.NATS.Cluster.Listen != "" || len(c.NATS.URLs) > 0)
}

// peers is the broker's Config.Peers before the member exists: the broker is built before
// the control plane's NATS connection, which the member needs, so the name service asks
// through this and finds nobody else until the member is set.
type peers struct {
	m atomic.Pointer[cluster.Member]
}

var _ broker.Peers = (*peers)(nil)

func (p *peers) TopicRoute(topic string) ([]protocol.QueueData, []protocol.BrokerData) {
	if m := p.m.Load(); m != nil {
		return m.TopicRoute(topic)
	}
	return nil, nil
}

func (p *peers) Brokers() []protocol.BrokerData {
	if m := p.m.Load(); m != nil {
		return m.Brokers()
	}
	return nil
}

// joinCluster makes the started broker b a member of the cluster through the control
// plane's NATS connection and pushes its Close, which leaves the registry at once, so that
// it stops before the broker does.
func (d *built) joinCluster(ctx context.Context, c config.Config, p *peers, cl *closers, log *slog.Logger) error {
	m, err := cluster.New(cluster.Options{
		Conn:     d.cp.n.Conn(),
		Node:     c.BrokerName,
		Replicas: routedReplicas(c),
		Logger:   log, // the member logs every registry change
	})
	if err != nil {
		return err
	}
	if err := m.Join(ctx, d.b); err != nil {
		return err
	}
	p.m.Store(m)
	cl.push("cluster member", m.Close)
	return nil
}

// routedReplicas is the replica count of the cluster's buckets for a node whose embedded
// server joins by routes: min(3, the servers the routes name, this one included), which the
// configuration knows before JetStream does. 0 (the member's default, from the connection's
// server list) for a node on an existing NATS cluster (nats.urls).
func routedReplicas(c config.Config) int {
	nc := c.NATS.Cluster
	if nc.Listen == "" {
		return 0
	}
	servers := map[string]bool{routeHostPort(nc.Listen): true}
	for _, r := range nc.Routes {
		servers[routeHostPort(r)] = true
	}
	return min(3, len(servers))
}

// routeHostPort is a route URL's (or a listen address's) host:port, with localhost spelled
// as the loopback address, so that one server named two ways counts once.
func routeHostPort(s string) string {
	s = strings.TrimPrefix(s, "nats-route://")
	if i := strings.LastIndex(s, "@"); i >= 0 {
		s = s[i+1:] // user:password@
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return s
	}
	if host == "localhost" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}
