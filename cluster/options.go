package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
)

// Options configure a Member. The zero value of every field but Conn means its documented
// default, nats-server style: Options{Conn: nc} is a working member.
type Options struct {
	// Conn is the NATS connection the shared state is kept through (JetStream KV). Required.
	// The member does not close it.
	Conn *nats.Conn

	// Node names the flowd process this broker runs in, for operators reading the registry.
	// Default: the broker's name.
	Node string

	// GRPCAddr is the broker's RocketMQ 5 gRPC address ("host:port", its grpc.advertise or
	// the bound listener's) that the registry publishes for the other brokers' gRPC routes.
	// Default "": the broker serves no gRPC endpoint, and no gRPC route names it.
	GRPCAddr string

	// Version is the flowd version the node reports in the registry. Default "dev".
	Version string

	// BrokersBucket is the KV bucket of live brokers, one key per broker name, each kept
	// alive by heartbeats. Default "flowd_brokers".
	BrokersBucket string

	// TopicsBucket is the KV bucket of topic configurations, one key per topic. Default
	// "flowd_topics".
	TopicsBucket string

	// GroupsBucket is the KV bucket of subscription-group configurations, one key per
	// group. Default "flowd_groups".
	GroupsBucket string

	// Replicas is the buckets' replica count when this member creates them. Default 0:
	// min(3, the servers of the NATS cluster the connection knows of).
	Replicas int

	// TTL is how long a broker stays in the registry after its last heartbeat: a node that
	// stops heartbeating leaves every route within it. It is the brokers bucket's max age,
	// so the member that creates the bucket sets it for the cluster. Default 6 s; at least
	// 1 s (JetStream's smallest limit-marker TTL, which delivers the expiry to watchers).
	TTL time.Duration

	// HeartbeatInterval is how often the member rewrites its registry entry (with its
	// load). Default TTL/3, so that two heartbeats may be lost before the entry expires.
	// It must be below TTL.
	HeartbeatInterval time.Duration

	// RetryInterval is how often a member that could not reach JetStream at Join tries
	// again; it serves alone meanwhile. Default 2 s.
	RetryInterval time.Duration

	// RequestTimeout bounds each JetStream call (KV read, write, bucket creation). Default 5 s.
	RequestTimeout time.Duration

	// Logger receives the member's logs. Default slog.Default().
	Logger *slog.Logger

	// ReplicaSet, if set, makes this the member of a replica set's node (docs/cluster.md,
	// "Several replica sets in one cluster"): it registers the broker name only while
	// ReplicaSet.Master says this node holds the set's lease, with the set's addresses by
	// broker id, replacing the entry of the set's previous master, and withdraws it when the
	// node stops being master (fenced, or the lease taken); it shares the cluster's topics
	// and groups only while master, and applies the cluster's to its broker either way.
	// Default nil: a plain broker, registered for as long as it runs.
	ReplicaSet ReplicaSetRole

	// ServerName is the name of the NATS server this node embeds, if any. A replica set's
	// master keeps the registry stream's Raft leader off it, as its lease does for the
	// lease's stream: when the master dies with its server, its successor's entry is then
	// written at once rather than after JetStream elects another leader (seconds). Default
	// "": the leader is left where it is. Used only with ReplicaSet.
	ServerName string

	// OnEvent is called for every registry change (a broker joined or left, this member's
	// name taken), in order, on the member's registry goroutine: it must return quickly.
	// Default nil: events are only logged.
	OnEvent func(Event)
}

const (
	defaultBrokersBucket  = "flowd_brokers"
	defaultTopicsBucket   = "flowd_topics"
	defaultGroupsBucket   = "flowd_groups"
	defaultTTL            = 6 * time.Second
	minTTL                = time.Second
	defaultRetryInterval  = 2 * time.Second
	defaultRequestTimeout = 5 * time.Second
)

func (o Options) withDefaults() (Options, error) {
	if o.Conn == nil {
		return o, errors.New("cluster: Options.Conn is required")
	}
	if o.Version == "" {
		o.Version = "dev"
	}
	if o.BrokersBucket == "" {
		o.BrokersBucket = defaultBrokersBucket
	}
	if o.TopicsBucket == "" {
		o.TopicsBucket = defaultTopicsBucket
	}
	if o.GroupsBucket == "" {
		o.GroupsBucket = defaultGroupsBucket
	}
	if o.BrokersBucket == o.TopicsBucket || o.BrokersBucket == o.GroupsBucket || o.TopicsBucket == o.GroupsBucket {
		return o, fmt.Errorf("cluster: BrokersBucket %q, TopicsBucket %q and GroupsBucket %q must differ", o.BrokersBucket, o.TopicsBucket, o.GroupsBucket)
	}
	if o.Replicas < 0 || o.Replicas > 5 {
		return o, fmt.Errorf("cluster: Replicas %d is outside 0..5", o.Replicas)
	}
	if o.TTL == 0 {
		o.TTL = defaultTTL
	}
	if o.TTL < minTTL {
		return o, fmt.Errorf("cluster: TTL %s is below the minimum %s", o.TTL, minTTL)
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = o.TTL / 3
	}
	if o.HeartbeatInterval < 0 || o.HeartbeatInterval >= o.TTL {
		return o, fmt.Errorf("cluster: HeartbeatInterval %s must be positive and below TTL %s", o.HeartbeatInterval, o.TTL)
	}
	if o.RetryInterval == 0 {
		o.RetryInterval = defaultRetryInterval
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = defaultRequestTimeout
	}
	if o.RetryInterval < 0 || o.RequestTimeout < 0 {
		return o, errors.New("cluster: RetryInterval and RequestTimeout must not be negative")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

// replicas is the buckets' replica count: the configured one, or min(3, known servers).
func (o Options) replicas() int {
	if o.Replicas > 0 {
		return o.Replicas
	}
	return max(1, min(3, len(o.Conn.Servers())))
}
