package control

import (
	"strings"
	"time"

	"github.com/nats-io/nuid"
)

// Cluster event names, published by Publisher.Cluster on flowd.evt.<cluster>.cluster.<event>
// with the broker concerned as ce-subject. Every node publishes what its own registry copy
// sees, so a broker leaving is reported once by each node that saw it.
const (
	// EventClusterBrokerJoined: a broker appeared in this node's registry (this node's own
	// broker included, when it joins). Payload: clusterBroker, clusterNode, clusterAddr.
	EventClusterBrokerJoined = "cluster.broker_joined"
	// EventClusterBrokerLeft: a broker's entry went away. Payload: clusterBroker,
	// clusterNode, clusterAddr, reason ("left": it stopped cleanly; "expired": no heartbeat
	// within the TTL).
	EventClusterBrokerLeft = "cluster.broker_left"
	// EventClusterNameTaken: this node could not register because another live broker has
	// its name; it keeps trying. Payload: clusterBroker, clusterNode, clusterAddr, reason.
	EventClusterNameTaken = "cluster.name_taken"
	// EventClusterReplicaMaster: this node became its replica set's master (it won the
	// lease). Payload: clusterBroker (the broker name), clusterNode, clusterAddr, reason
	// ("epoch N").
	EventClusterReplicaMaster = "cluster.replica_master"
	// EventClusterReplicaSteppedDown: this node stopped being its replica set's master: it
	// fenced itself (its lease not renewed in time) or another member holds the lease.
	// Payload as EventClusterReplicaMaster, reason saying which.
	EventClusterReplicaSteppedDown = "cluster.replica_stepped_down"
	// EventClusterReplicaInSync: the master's in-sync set changed. Payload as
	// EventClusterReplicaMaster, reason the in-sync replicas, comma-separated ("" for none).
	EventClusterReplicaInSync = "cluster.replica_in_sync"
)

// ClusterEvent is one change of the cluster's registry as this node saw it: the daemon
// maps its member's events onto it.
type ClusterEvent struct {
	// Type is one of EventClusterBrokerJoined, EventClusterBrokerLeft, EventClusterNameTaken,
	// EventClusterReplicaMaster, EventClusterReplicaSteppedDown, EventClusterReplicaInSync.
	Type string
	Time time.Time
	// Broker, Node and Addr name the broker concerned, its node and its remoting address.
	Broker, Node, Addr string
	Reason             string
}

// Cluster publishes a cluster event on flowd.evt.<cluster>.cluster.<event>. Like Plugin it
// never blocks on NATS: while the connection is down the event waits in the buffer.
func (p *Publisher) Cluster(e ClusterEvent) {
	d := EventData{ClusterBroker: e.Broker, ClusterNode: e.Node, ClusterAddr: e.Addr, Reason: e.Reason}
	d.Cluster, d.Broker, d.Time = p.cfg.Cluster, p.cfg.Node, e.Time
	if d.Time.IsZero() {
		d.Time = time.Now()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.emitLocked(p.message(e.Type, p.boot+"."+strings.ReplaceAll(e.Type, ".", "-")+"."+nuid.Next(), e.Broker, 0, d))
}
