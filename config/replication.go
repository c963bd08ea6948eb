package config

import (
	"fmt"
	"time"
)

// Replication makes the node a member of a replica set: the nodes of one cluster with the
// same broker_name (docs/cluster.md, "Replica sets"). Left off, the node is a single
// broker, as it always was.
type Replication struct {
	Mode       string        `yaml:"mode" env:"FLOWD_REPLICATION" flag:"replication" doc:"off: a single broker; async: replicas copy the master's commit log and a send is acknowledged at once; sync: a send is acknowledged once min_in_sync members hold it; async and sync need a cluster (nats.cluster.listen or nats.urls) and broker_id"`
	BrokerID   int64         `yaml:"broker_id" env:"FLOWD_BROKER_ID" flag:"broker-id" doc:"this node's id in its replica set, 1 or more, unique in the set; id 1 starts a new set as its first master; routes list the master as 0 and the replicas by id"`
	MinInSync  int           `yaml:"min_in_sync" env:"FLOWD_MIN_IN_SYNC" flag:"min-in-sync" doc:"sync mode: members (the master included) that must hold a send before it is acknowledged; fewer in sync and sends are refused"`
	MaxLag     Size          `yaml:"max_lag" env:"FLOWD_REPLICATION_MAX_LAG" flag:"replication-max-lag" doc:"a replica further behind the master's commit log than this (bytes) for longer than max_lag_time is out of the in-sync set"`
	MaxLagTime time.Duration `yaml:"max_lag_time" env:"FLOWD_REPLICATION_MAX_LAG_TIME" flag:"replication-max-lag-time" doc:"how long a replica may stay more than max_lag behind before it leaves the in-sync set"`
	AsyncPace  time.Duration `yaml:"async_pace" env:"FLOWD_REPLICATION_ASYNC_PACE" flag:"replication-async-pace" doc:"async mode: the least time between two sends of new records to a caught-up replica, so that a trickle of sends costs a frame per pace rather than one per send; an async replica lags up to this more (what a failover can lose); 0 sends every append at once"`
	// HAAdvertise is the stream address the lease publishes when replicas reach the
	// master through another address than listen.ha (NAT, a proxy).
	HAAdvertise string `yaml:"ha_advertise" env:"FLOWD_HA_ADVERTISE" flag:"ha-advertise" doc:"replica-set stream address (host:port) the lease publishes for replicas to dial; empty: the listen.ha address"`
	// ElectLongestLog has the members that may take a lapsed lease compare their logs first
	// (docs/cluster.md, "Election"): it closes the window in which a replica lacking a send
	// acknowledged by min_in_sync members wins the race. On by default; it costs a
	// promotion a fast round or two (100 ms each), more when an in-sync member never stands.
	ElectLongestLog bool `yaml:"elect_longest_log" env:"FLOWD_REPLICATION_ELECT_LONGEST_LOG" flag:"replication-elect-longest-log" doc:"of the in-sync members that may take a lapsed lease, the one whose log goes furthest takes it, once every in-sync member stood with its log's position (a round or two of 100 ms more before promotion; up to lease_ttl/2 when an in-sync member is gone too); off: the first to see the lapse takes it"`
	// ReplicaReads mirrors broker.Config.ReplicaReads (docs/cluster.md, "Reads from
	// replicas"); RocketMQ's slaveReadEnable, off by default there too.
	ReplicaReads bool          `yaml:"replica_reads" env:"FLOWD_REPLICA_READS" flag:"replica-reads" doc:"steer pulls between master and replicas: the master suggests an in-sync replica (suggestWhichBrokerId) for messages beyond store.access_message_in_memory_max_ratio of store.memory_budget behind its log's end, and a replica sends a caught-up consumer back to the master; off: every answer suggests the master"`
	LeaseTTL     time.Duration `yaml:"lease_ttl" env:"FLOWD_REPLICATION_LEASE_TTL" flag:"replication-lease-ttl" doc:"the master's lease in JetStream KV: a master that could not renew it for two thirds of this stops taking sends, and an in-sync replica takes over once it lapsed; it bounds promotion time"`
}

// Enabled reports whether the node is a replica-set member.
func (r Replication) Enabled() bool { return r.Mode == "async" || r.Mode == "sync" }

func (c Config) replicationProblems() []Problem {
	var probs []Problem
	bad := func(key, format string, args ...any) {
		probs = append(probs, Problem{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	r := c.Replication
	switch r.Mode {
	case "off":
		return nil
	case "async", "sync":
	default:
		bad("replication.mode", "%q is not off, async or sync", r.Mode)
		return probs
	}
	if !c.NATS.Enabled || (c.NATS.Cluster.Listen == "" && len(c.NATS.URLs) == 0) {
		bad("replication.mode", "a replica set elects its master through the cluster's JetStream: set nats.cluster.listen or nats.urls")
	}
	if r.BrokerID < 1 {
		bad("replication.broker_id", "must be 1 or more in a replica set, not %d", r.BrokerID)
	}
	if r.MinInSync < 1 {
		bad("replication.min_in_sync", "must be 1 or more, not %d", r.MinInSync)
	}
	if r.MaxLag <= 0 {
		bad("replication.max_lag", "must be positive")
	}
	if r.MaxLagTime <= 0 {
		bad("replication.max_lag_time", "must be positive")
	}
	if r.AsyncPace < 0 || r.AsyncPace > time.Minute {
		bad("replication.async_pace", "must be within 0..1m, not %s", r.AsyncPace)
	}
	if r.LeaseTTL < 300*time.Millisecond {
		bad("replication.lease_ttl", "must be 300ms or more, not %s", r.LeaseTTL)
	}
	if err := checkListen(c.Listen.HA); err != nil {
		bad("listen.ha", "%q %v", c.Listen.HA, err)
	}
	if a := r.HAAdvertise; a != "" {
		if err := checkListen(a); err != nil {
			bad("replication.ha_advertise", "%q %v", a, err)
		}
	}
	return probs
}
