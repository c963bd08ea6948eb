package control

import (
	"cmp"
	"context"
	"slices"
	"time"
)

// ClusterInfo is what cluster.status reads of the node's membership in a cluster of
// brokers. The daemon implements it over its cluster.Member, so that control does not
// depend on the cluster package.
type ClusterInfo interface {
	// ClusterMembership returns the registry as this node sees it, and whether it joined.
	ClusterMembership() ClusterMembership
}

// ClusterMembership is one node's view of the cluster's registry of live brokers.
type ClusterMembership struct {
	// Joined is true once this node's broker is registered; false while it serves alone
	// (JetStream unreachable, or its name taken).
	Joined bool
	// Brokers are the live brokers, this one included once joined.
	Brokers []ClusterBroker
	// ReplicaSets are the cluster's replica sets, when this node is a member of one (a
	// gathered cluster.status adds those the other nodes list).
	ReplicaSets []ClusterReplicaSet
}

// ClusterReplicaSet is one replica set in cluster.status: its master and epoch (from its
// lease), the in-sync set the master published, and every member that ever started.
type ClusterReplicaSet struct {
	BrokerName string `json:"broker_name"`
	// Master is the lease holder's node; empty before any master was elected.
	Master string `json:"master,omitempty"`
	Epoch  int64  `json:"epoch"`
	// InSync are the replicas the master counts in sync.
	InSync []string `json:"in_sync,omitempty"`
	// Renewed is when the master last renewed its lease, by its clock: members' lag is as
	// of then.
	Renewed *time.Time             `json:"renewed,omitempty"`
	Members []ClusterReplicaMember `json:"members"`
	// LeaseStream is the JetStream stream the set's lease lives in, as one member's NATS
	// server reports it; absent from a node outside the set.
	LeaseStream *ClusterLeaseStream `json:"lease_stream,omitempty"`
}

// ClusterLeaseStream is the Raft group of the stream holding the replica sets' leases, as
// JetStream answered a member.
// Renewals and elections are writes to it: while it is not whole the set survives the loss
// of no further member of that group (docs/cluster.md, "A member that rejoins").
type ClusterLeaseStream struct {
	// ReadBy is the member that read it, at Read. The stream's leader answers (a member
	// of the group when it has none): every member that reaches it reads the same view,
	// and one that cannot reads an Error.
	ReadBy string    `json:"read_by"`
	Read   time.Time `json:"read"`
	// Whole: the stream has a leader and every follower is current, online and heard
	// from within 3 s (or the stream has one server only).
	Whole  bool   `json:"whole"`
	Leader string `json:"leader,omitempty"`
	// Replicas are the followers.
	Replicas []ClusterStreamPeer `json:"replicas,omitempty"`
	// Error is why the stream's state could not be read (then it is not whole).
	Error string `json:"error,omitempty"`
}

// ClusterStreamPeer is a follower of a stream's Raft group.
type ClusterStreamPeer struct {
	Name    string `json:"name"`
	Current bool   `json:"current"`
	Offline bool   `json:"offline,omitempty"`
	// ActiveMillis is how long ago the leader last heard from it; Lag how many entries it
	// is behind.
	ActiveMillis int64  `json:"active_ms"`
	Lag          uint64 `json:"lag,omitempty"`
}

// ClusterReplicaMember is one member of a replica set.
type ClusterReplicaMember struct {
	Node     string `json:"node"`
	BrokerID int64  `json:"broker_id"`
	// Role is "master" or "replica".
	Role   string `json:"role"`
	Addr   string `json:"addr"`
	HAAddr string `json:"ha_addr,omitempty"`
	// InSync is true for the master and for a replica in the master's in-sync set.
	InSync bool `json:"in_sync"`
	// Connected: the replica was connected to the master when it last renewed; LagBytes
	// and LagMillis (how long since it was last within max_lag) are then the master's view.
	Connected bool  `json:"connected,omitempty"`
	LagBytes  int64 `json:"lag_bytes,omitempty"`
	LagMillis int64 `json:"lag_ms,omitempty"`
}

// ClusterBroker is one live broker of the registry.
type ClusterBroker struct {
	Name    string `json:"name"`
	Cluster string `json:"cluster,omitempty"`
	Node    string `json:"node"`
	// Addr is the broker's remoting address; Namesrv its name service's (absent when off).
	Addr    string `json:"addr"`
	Namesrv string `json:"namesrv,omitempty"`
	// GRPC is the broker's RocketMQ 5 gRPC address as routes name it (absent when off).
	GRPC    string    `json:"grpc,omitempty"`
	Version string    `json:"version,omitempty"`
	Started time.Time `json:"started"`
	// Heartbeat is when the broker last wrote its entry; absent for a broker outside any
	// registry (a single node, or one not joined yet).
	Heartbeat *time.Time  `json:"heartbeat,omitempty"`
	Load      ClusterLoad `json:"load"`
	// Master is, for a replica set, its master's member name, and Epoch the master's lease
	// epoch; both absent for a plain broker.
	Master string `json:"master,omitempty"`
	Epoch  int64  `json:"epoch,omitempty"`
	// Self marks the broker of the node that answered.
	Self bool `json:"self"`
}

// ClusterLoad is what a broker reports of its work with each heartbeat.
type ClusterLoad struct {
	Topics       int   `json:"topics"`
	Clients      int   `json:"clients"`
	Members      int   `json:"members"`
	WaitingPulls int64 `json:"waiting_pulls"`
}

// NATSClusterView is ClusterState in a reply.
type NATSClusterView struct {
	Clustered  bool              `json:"clustered"`
	Name       string            `json:"name,omitempty"`
	ServerName string            `json:"server_name,omitempty"`
	RouteURL   string            `json:"route_url,omitempty"`
	Routes     []string          `json:"routes,omitempty"`
	MetaLeader string            `json:"meta_leader,omitempty"`
	Peers      []NATSClusterPeer `json:"peers,omitempty"`
	// Error is why the state is incomplete (the server could not report its routes or
	// JetStream); absent when it is complete.
	Error string `json:"error,omitempty"`
}

// NATSClusterPeer is a server of the JetStream meta group.
type NATSClusterPeer struct {
	Name    string `json:"name"`
	Current bool   `json:"current"`
	Offline bool   `json:"offline"`
}

// ClusterStatusReply is the reply of cluster.status: this node's view of the cluster.
type ClusterStatusReply struct {
	Origin
	// Clustered is true when the node runs a cluster member (nats.cluster.listen or
	// nats.urls); a single node answers false, with itself as the one broker.
	Clustered bool `json:"clustered"`
	// Joined is true once the node's broker is registered in the cluster.
	Joined  bool            `json:"joined"`
	Brokers []ClusterBroker `json:"brokers"`
	// ReplicaSets are the cluster's replica sets: those the answering node reads, and, when
	// gathered, those the other nodes list (absent when no node runs replication).
	ReplicaSets []ClusterReplicaSet `json:"replica_sets,omitempty"`
	// NATS is the embedded NATS server's view of its cluster; absent when the node
	// connects to an existing NATS (nats.urls) or the service has no ServiceConfig.NATS.
	NATS *NATSClusterView `json:"nats,omitempty"`
	// Nodes is, in a cluster, each answering node's own view (this one's included), by
	// node name, so that nodes whose registry copies or NATS routes disagree show; absent
	// otherwise.
	Nodes []ClusterNodeView `json:"nodes,omitempty"`
	Coverage
}

// ClusterNodeView is one node's view of the cluster in a gathered cluster.status.
type ClusterNodeView struct {
	Node string `json:"node"`
	// Joined is whether its broker is registered.
	Joined bool `json:"joined"`
	// Brokers are the live brokers of its copy of the registry, by name.
	Brokers []string `json:"brokers"`
	// NATS is its embedded server's view of the NATS cluster and JetStream's meta group.
	NATS *NATSClusterView `json:"nats,omitempty"`
}

func nodeView(r ClusterStatusReply) ClusterNodeView {
	v := ClusterNodeView{Node: r.Node, Joined: r.Joined, Brokers: []string{}, NATS: r.NATS}
	for _, b := range r.Brokers {
		v.Brokers = append(v.Brokers, b.Name)
	}
	return v
}

func (s *Service) clusterStatus(ctx context.Context, data []byte) (any, error) {
	var req StatusRequest
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	gather, bound, err := s.gathers(ctx, Scope(req))
	if err != nil {
		return nil, err
	}
	out := s.localClusterStatus()
	if !gather {
		return out, nil
	}
	answers, cov := gatherFrom[ClusterStatusReply](s, "cluster.status", data, bound)
	out.Nodes = []ClusterNodeView{nodeView(out)}
	for _, a := range answers {
		out.Nodes = append(out.Nodes, nodeView(a.reply))
		out.ReplicaSets = mergeReplicaSets(out.ReplicaSets, a.reply.ReplicaSets)
	}
	slices.SortFunc(out.Nodes, func(x, y ClusterNodeView) int { return cmp.Compare(x.Node, y.Node) })
	out.Coverage = cov
	return out, nil
}

// mergeReplicaSets adds to sets the replica sets of another node's answer: a plain node
// reads no replica set of its own, and one answer lists every set and plain broker. Of two
// views of one set, the newer epoch's wins (the answering node's on a tie).
func mergeReplicaSets(sets, more []ClusterReplicaSet) []ClusterReplicaSet {
	for _, m := range more {
		i := slices.IndexFunc(sets, func(s ClusterReplicaSet) bool { return s.BrokerName == m.BrokerName })
		switch {
		case i < 0:
			sets = append(sets, m)
		case m.Epoch > sets[i].Epoch:
			sets[i] = m
		}
	}
	slices.SortFunc(sets, func(x, y ClusterReplicaSet) int { return cmp.Compare(x.BrokerName, y.BrokerName) })
	return sets
}

// localClusterStatus is this node's view of the cluster.
func (s *Service) localClusterStatus() ClusterStatusReply {
	st := s.b.Status()
	out := ClusterStatusReply{Origin: s.origin()}
	if s.cfg.Membership != nil {
		m := s.cfg.Membership.ClusterMembership()
		out.Clustered, out.Joined = true, m.Joined
		out.Brokers = slices.Clone(m.Brokers)
		out.ReplicaSets = m.ReplicaSets
	}
	self := slices.IndexFunc(out.Brokers, func(b ClusterBroker) bool { return b.Name == st.BrokerName })
	if self < 0 {
		// Alone, or not joined yet: the node still answers for its own broker.
		out.Brokers = append(out.Brokers, ClusterBroker{
			Name: st.BrokerName, Cluster: st.Cluster, Node: s.cfg.Node, Addr: st.Addr, Namesrv: st.NamesrvAddr,
			Started: st.Started.UTC(),
			Load:    ClusterLoad{Topics: st.Topics, Clients: st.Clients, Members: st.Members, WaitingPulls: st.WaitingPulls},
		})
		self = len(out.Brokers) - 1
	}
	out.Brokers[self].Self = true
	slices.SortFunc(out.Brokers, func(x, y ClusterBroker) int { return cmp.Compare(x.Name, y.Name) })
	if s.cfg.NATS != nil && s.cfg.NATS.srv != nil {
		out.NATS = natsClusterView(s.cfg.NATS.ClusterState())
	}
	return out
}

func natsClusterView(st ClusterState, err error) *NATSClusterView {
	v := &NATSClusterView{
		Clustered: st.Clustered, Name: st.Name, ServerName: st.ServerName, RouteURL: st.RouteURL,
		Routes: st.Routes, MetaLeader: st.MetaLeader,
	}
	for _, p := range st.Peers {
		v.Peers = append(v.Peers, NATSClusterPeer(p))
	}
	if err != nil {
		v.Error = err.Error()
	}
	return v
}
