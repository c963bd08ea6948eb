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
	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/internal/grpcserver"
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
	m       atomic.Pointer[cluster.Member]
	plugins *cluster.PluginStore // the cluster's plugin store, for the per-node reports
	rs      *replicaSet          // nil: replication is off
}

var _ broker.Peers = (*peers)(nil)

func (p *peers) TopicRoute(topic string) ([]protocol.QueueData, []protocol.BrokerData) {
	if m := p.m.Load(); m != nil {
		return m.TopicRoute(topic)
	}
	return nil, nil
}

var _ grpcserver.Peers = (*peers)(nil)

// TopicPeers is the topic's share on the cluster's other live brokers, for gRPC routes.
func (p *peers) TopicPeers(topic string) []grpcserver.Peer {
	m := p.m.Load()
	if m == nil {
		return nil
	}
	tps := m.TopicPeers(topic)
	out := make([]grpcserver.Peer, 0, len(tps))
	for _, tp := range tps {
		out = append(out, grpcserver.Peer{Broker: tp.Broker.Name, Addr: tp.Broker.GRPCAddr, Topic: tp.Topic})
	}
	return out
}

// joined reports whether the member exists and has joined the cluster; false for a node
// with no member (p nil) and while the member serves alone.
func (p *peers) joined() bool {
	if p == nil {
		return false
	}
	m := p.m.Load()
	return m != nil && m.Joined()
}

func (p *peers) Brokers() []protocol.BrokerData {
	if m := p.m.Load(); m != nil {
		return m.Brokers()
	}
	return nil
}

func (p *peers) Topics() []string {
	if m := p.m.Load(); m != nil {
		return m.Topics()
	}
	return nil
}

var _ control.ClusterInfo = (*peers)(nil)

// ClusterMembership is what cluster.status reports of the member: its registry copy, or
// nothing while the member does not exist yet.
func (p *peers) ClusterMembership() control.ClusterMembership {
	var out control.ClusterMembership
	if p.rs != nil {
		out.ReplicaSets = p.rs.replicaSetsView()
	}
	m := p.m.Load()
	if m == nil {
		return out
	}
	out.Joined = m.Joined()
	for _, bi := range m.Registry() {
		hb := bi.Heartbeat.UTC()
		out.Brokers = append(out.Brokers, control.ClusterBroker{
			Name: bi.Name, Cluster: bi.Cluster, Node: bi.Node, Addr: bi.Addr, Namesrv: bi.NamesrvAddr, GRPC: bi.GRPCAddr,
			Version: bi.Version, Started: bi.Started.UTC(), Heartbeat: &hb, Master: bi.Master, Epoch: bi.Epoch,
			Load: control.ClusterLoad{Topics: bi.Load.Topics, Clients: bi.Load.Clients, Members: bi.Load.Members, WaitingPulls: bi.Load.WaitingPulls},
		})
	}
	return out
}

var _ control.PluginReports = (*peers)(nil)

// PluginReports is every node's report on a plugin, for the plugin commands' per-node view.
func (p *peers) PluginReports(name string) []control.PluginReport {
	if p.plugins == nil {
		return nil
	}
	var out []control.PluginReport
	for _, r := range p.plugins.Reports(name) {
		out = append(out, control.PluginReport{Node: r.Node, Active: r.Active, Failed: r.Failed, Error: r.Error, Time: r.Time})
	}
	return out
}

// clusterEvent maps a member's event onto the publisher's.
func clusterEvent(e cluster.Event) control.ClusterEvent {
	return control.ClusterEvent{
		Type: e.Type.String(), Time: e.Time, Broker: e.Broker.Name, Node: e.Broker.Node, Addr: e.Broker.Addr, Reason: e.Reason,
	}
}

// joinCluster makes the started broker b a member of the cluster through the control
// plane's NATS connection and pushes its Close, which leaves the registry at once, so that
// it stops before the broker does. The member's registry changes become cluster events, and
// cluster.status reads its registry through p.
// A replica set's member (rs) registers the broker while it is the set's master only.
func (d *built) joinCluster(ctx context.Context, c config.Config, p *peers, cl *closers, rs *replicaSet, log *slog.Logger) error {
	pub := d.cp.pub
	var role cluster.ReplicaSetRole // nil: a plain broker (not a nil *replicaSet in the interface)
	serverName := ""
	if rs != nil {
		role = setRole{rs}
		if c.NATS.Cluster.Listen != "" {
			serverName, _ = natsCluster(c) // embedded: a master keeps the registry's leader off it
		}
	}
	m, err := cluster.New(cluster.Options{
		ReplicaSet: role,
		ServerName: serverName,
		Conn:       d.cp.n.Conn(),
		Node:       c.BrokerName,
		Version:    version,
		GRPCAddr:   d.grpcAdvertise(),
		Replicas:   routedReplicas(c),
		Logger:     log, // the member logs every registry change
		// The publisher never blocks on NATS, so the member's registry goroutine is not held.
		OnEvent: func(e cluster.Event) { pub.Cluster(clusterEvent(e)) },
	})
	if err != nil {
		return err
	}
	if err := m.Join(ctx, d.b); err != nil {
		return err
	}
	p.m.Store(m)
	if rs != nil {
		rs.member.Store(m) // lease changes reach the registry at once
	}
	d.cp.cfg.Membership = p
	cl.push("cluster member", func(ctx context.Context) error {
		// A deregistration JetStream cannot take (the last node of a cluster stopping, its
		// quorum gone with the others) is not a failed stop: the entry expires within the TTL.
		if err := m.Close(ctx); err != nil {
			log.Warn("cluster member stopped without deregistering: the other brokers drop it when its entry expires", "err", err)
		}
		return nil
	})
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
