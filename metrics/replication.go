package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ReplicaSetStats is a replica-set member's state (docs/cluster.md, "Replica sets"), read
// at scrape time from the daemon's replica set.
type ReplicaSetStats struct {
	// Master: this node holds the set's lease and takes sends.
	Master bool
	// Epoch is the newest epoch this node's log knows.
	Epoch int64
	// Elections this node won and the times it fenced itself, since it started.
	Elections, Fenced int64
	// Replicas, on the master: each connected replica's lag.
	Replicas []ReplicaLag
	// LagBytes, on a replica: how far its log is behind the master's end as last reported.
	LagBytes int64
	// LeaseStreamWhole: the lease bucket's stream, as JetStream last answered this node (the
	// stream's leader answers), has a leader and every follower current
	// (cluster.StreamHealth.Whole); exported once LeaseStreamKnown.
	LeaseStreamKnown, LeaseStreamWhole bool
}

// ReplicaLag is one replica as its master sees it.
type ReplicaLag struct {
	Node     string
	LagBytes int64
	LagTime  time.Duration // since it was last within the allowed lag
	InSync   bool
}

// WatchReplicaSet registers a collector of the replica-set member's state; stats is called
// at every scrape and must answer from memory.
func (m *Metrics) WatchReplicaSet(stats func() ReplicaSetStats) {
	m.reg.MustRegister(&replicaSetCollector{stats: stats})
}

type replicaSetCollector struct{ stats func() ReplicaSetStats }

var (
	descReplMaster     = desc("flowd_replication_master", "1 while this node is its replica set's master (holds the lease), 0 while a replica.")
	descReplEpoch      = desc("flowd_replication_epoch", "The newest epoch this node's commit log knows.")
	descReplInSync     = desc("flowd_replication_in_sync_replicas", "On the master: replicas in the in-sync set (the master not counted).")
	descReplElections  = desc("flowd_replication_elections_total", "Elections this node won (lease taken) since it started.")
	descReplFenced     = desc("flowd_replication_fenced_total", "Times this node, as master, could not renew its lease in time and stopped taking sends.")
	descReplLagBytes   = desc("flowd_replication_replica_lag_bytes", "On the master: how far a replica's acknowledged log is behind the master's end.", "replica")
	descReplLagSeconds = desc("flowd_replication_replica_lag_seconds", "On the master: time since a replica was last within the allowed lag (0 while caught up).", "replica")
	descReplOwnLag     = desc("flowd_replication_lag_bytes", "On a replica: how far its log is behind its master's end, as the master last reported it.")
	descReplLeaseWhole = desc("flowd_replication_lease_stream_whole", "1 while the JetStream stream of the replica-set leases has a leader and every follower current, online and heard from within 3 s, as the stream's leader answered this node; 0 while not, or when this node could not read it (the set then survives the loss of no further member).")
)

func (c *replicaSetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReplMaster, descReplEpoch, descReplInSync, descReplElections, descReplFenced,
		descReplLagBytes, descReplLagSeconds, descReplOwnLag, descReplLeaseWhole} {
		ch <- d
	}
}

func (c *replicaSetCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	master, inSync := 0.0, 0
	if s.Master {
		master = 1
	}
	for _, r := range s.Replicas {
		if r.InSync {
			inSync++
		}
		gauge(ch, descReplLagBytes, float64(r.LagBytes), r.Node)
		gauge(ch, descReplLagSeconds, r.LagTime.Seconds(), r.Node)
	}
	gauge(ch, descReplMaster, master)
	gauge(ch, descReplEpoch, float64(s.Epoch))
	gauge(ch, descReplInSync, float64(inSync))
	counter(ch, descReplElections, uint64(s.Elections))
	counter(ch, descReplFenced, uint64(s.Fenced))
	gauge(ch, descReplOwnLag, float64(s.LagBytes))
	if s.LeaseStreamKnown {
		whole := 0.0
		if s.LeaseStreamWhole {
			whole = 1
		}
		gauge(ch, descReplLeaseWhole, whole)
	}
}
