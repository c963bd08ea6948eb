package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/flowd-io/flowd/broker/filter"
	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/internal/sql92"
)

// Config is everything a Broker is built from. The zero value of every field means its
// documented default, so Config{DataDir: dir} is a working broker.
type Config struct {
	// DataDir holds the commit log, the consume queues and the broker's own state (topics,
	// consumer offsets, subscription groups). Default "./flowd-data".
	DataDir string

	// Listen is the broker's address. Default "127.0.0.1:10911".
	Listen string

	// NamesrvListen is the address of the built-in name service, which answers route queries
	// the way a RocketMQ name server does. Empty means the default "127.0.0.1:9876"; "off"
	// disables it (the broker's own address answers route queries too).
	NamesrvListen string

	// AdvertisedAddr is the address put into topic routes. Default: the bound Listen address.
	// Set it when clients reach the broker through another address.
	AdvertisedAddr string

	// Cluster is the cluster name in routes. Default "local".
	Cluster string

	// BrokerName is the broker's name in routes and message queues. Default "broker-a".
	BrokerName string

	// AutoCreateTopics lets a producer send to a topic that does not exist yet: the route of
	// protocol.AutoCreateTopicKey is served and the topic is created on the first send.
	// Default true; set DisableAutoCreateTopics to turn it off.
	DisableAutoCreateTopics bool

	// DefaultTopicQueues is the queue count of auto-created topics when the producer asks for
	// none. Default 4.
	DefaultTopicQueues int

	// DisableAutoCreateGroups refuses heartbeats, pulls and commits of groups not created
	// beforehand (in subscriptionGroups.json); those groups are then never forgotten for
	// being idle. By default a subscription group is created by its first heartbeat.
	DisableAutoCreateGroups bool

	// MaxMessageSize is the largest message body accepted, after compression. Default 4 MiB.
	MaxMessageSize int

	// ClientExpiry is how long a client may stay silent (no heartbeat, no request) before it
	// is removed from its groups. Default 45 s: RocketMQ's Go client heartbeats every 30 s, so
	// anything shorter would drop healthy clients; a closed connection removes a client at once.
	ClientExpiry time.Duration

	// LockLease is how long a queue lock taken with LOCK_BATCH_MQ lasts without renewal.
	// Default 60 s (RocketMQ's rebalance lock lifetime).
	LockLease time.Duration

	// RebalanceSettle is how long a group's queue locks must stay unchanged before a
	// GroupRebalanced event reports the new assignment, so that one rebalance (members
	// releasing and taking queues one request at a time) is one event. Default 500 ms.
	RebalanceSettle time.Duration

	// MaxReconsumeTimes is how often a message may be sent back before it goes to the group's
	// dead-letter topic, when the client does not say. Default 16.
	MaxReconsumeTimes int

	// DelayLevels are the delays of the message delay levels 1, 2, …, written as RocketMQ
	// writes them. Default "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h".
	DelayLevels string

	// MaxLongPoll caps the suspend time a pull may ask for. Default 30 s.
	MaxLongPoll time.Duration

	// OffsetFlushInterval is how often committed consumer offsets are written to disk when
	// they changed. Default 500 ms, so a commit is durable within a second.
	OffsetFlushInterval time.Duration

	// MaxGroups caps the subscription groups the broker keeps. Groups are created by any
	// client that names one (heartbeat, pull, commit, send-back), so without a cap a client
	// could grow the group table, its file, the offset table and the retry topics without
	// bound. At the cap a request that would create a group is refused with
	// SUBSCRIPTION_GROUP_NOT_EXIST and a remark naming the cap. Retry and dead-letter topics
	// are capped at twice this. Default 10000.
	MaxGroups int

	// GroupRetention is how long a subscription group with no live member and no commit is
	// kept. After it the group, its offsets, its locks and its retry topic are forgotten
	// (a returning consumer starts again from its consumeFromWhere). Offsets of groups not
	// in the group table follow the same rule. With DisableAutoCreateGroups the group table
	// is left alone. Default 7 days.
	GroupRetention time.Duration

	// TableFlushInterval is how long an implicitly created topic or group may wait before
	// the topic and group files are rewritten. Creations within it share one write. Explicit
	// topic changes (create, delete) are written at once. Default 200 ms.
	TableFlushInterval time.Duration

	// EventQueueSize is how many events a subscriber (Broker.Subscribe) may have waiting;
	// events past it are dropped and counted (Broker.EventsDropped). Default 4096.
	EventQueueSize int

	// TransactionTimeout is how old a transactional half message must be before the broker
	// asks its producer group for the outcome (CHECK_TRANSACTION_STATE). A message's
	// CHECK_IMMUNITY_TIME_IN_SECONDS property can make its first check later. Default 6 s
	// (RocketMQ's transactionTimeOut).
	TransactionTimeout time.Duration

	// TransactionCheckInterval is how often half messages without an outcome are checked
	// back. Default 60 s (RocketMQ's transactionCheckInterval).
	TransactionCheckInterval time.Duration

	// TransactionCheckMax is how many check-backs a half message gets; after that it is
	// discarded, logged, and reported as a TransactionDiscarded event. Default 15
	// (RocketMQ's transactionCheckMax).
	TransactionCheckMax int

	// Filters compiles the subscriptions of pulls into read filters and caches them. TAG
	// is built in; SQL92 is registered unless DisableSQL92 is set; the daemon registers
	// WASM (filter.Batch) on it. A pull whose expression type has no compiler is answered
	// SUBSCRIPTION_PARSE_FAILED. Default: filter.NewRegistry(filter.DefaultCacheSize) with
	// TAG and SQL92.
	Filters *filter.Registry

	// DisableSQL92 turns SQL92 property filters (MessageSelector.bySql) off: such
	// subscriptions are answered SUBSCRIPTION_PARSE_FAILED. RocketMQ has them off unless
	// enablePropertyFilter is set; flowd has them on, since they cost nothing unless used.
	// Applies to the default Filters only.
	DisableSQL92 bool

	// DisableZeroCopy makes every pull copy its messages into the response. By default a
	// pull whose subscription has no filter on the messages' content (none, or tags: SQL92
	// and Wasm filters need the bytes) is answered from the commit-log files: the store
	// hands out regions of its segments (store.GetRegions) and the transport sends them
	// with sendfile(2), or copies the small ones straight into its write buffer (see
	// Transport.SendfileThreshold), instead of the store copying them into a buffer and the
	// response copying them again. The bytes sent are the same either way; this switch is
	// there to measure the difference and as a way out.
	DisableZeroCopy bool

	// Store configures the commit log and consume queues; see store.Options for defaults.
	// StoreHost is set from the advertised address when left empty.
	Store store.Options

	// Transport tunes the broker listener's connections: frame size, requests in flight and
	// parked (long-polling pulls) per connection, timeouts, the connection cap; see
	// TransportConfig for each default.
	Transport TransportConfig

	// Logger receives the broker's logs. Default slog.Default().
	Logger *slog.Logger

	// Observer is told of every stored send and every answered pull, for metrics. It is
	// called on the request's goroutine, so it must be cheap and must not block. Default
	// nil: no calls, and no clock reads for it.
	Observer Observer

	// Peers is the rest of the cluster as the name service sees it: route queries
	// (GET_ROUTEINFO_BY_TOPIC) and cluster info (GET_BROKER_CLUSTER_INFO) add the brokers it
	// reports to this broker's own answer. It is read on the request path, so it must
	// answer from memory. Default nil: a cluster of this one broker, the answers exactly
	// those of a single node.
	Peers Peers

	// Replication, when set, makes the broker a member of a replica set (docs/cluster.md,
	// "Replica sets"): it refuses sends while it is not the master, and in sync mode answers
	// a send only once enough members hold it. Default nil: a single node.
	Replication Replication

	// ReplicaReads lets a replica set's members steer pulls between master and replicas
	// (RocketMQ's slaveReadEnable; docs/cluster.md, "Reads from replicas"): a master whose
	// Replication implements ReplicaReads suggests an in-sync replica in a pull's answer
	// (suggestWhichBrokerId) when the pull's messages lie beyond the store's memory budget,
	// and a replica sends a consumer that caught up back to the master (PULL_RETRY_IMMEDIATELY,
	// suggesting 0) instead of holding its pull. Default false: every answer suggests the
	// master, as RocketMQ's default does, and a replica holds a caught-up pull as any broker
	// does. Either way a replica corrects no offset from its copy (PULL_RETRY_IMMEDIATELY at
	// the offset asked for instead of OFFSET_MOVED).
	ReplicaReads bool
}

// Observer counts traffic on the broker's hot paths (the metrics package implements it).
// Everything else the broker knows is read at scrape time through Status, Groups,
// DescribeGroup and the store's Stats, so only what no snapshot can reconstruct comes
// through here. Implementations must be safe for concurrent use and should not allocate.
type Observer interface {
	// MessagesIn reports n messages with bodies totalling bytes stored in topic by one send
	// (one message, or a batch). Sends that fail to store are not reported.
	MessagesIn(topic string, n, bytes int)
	// MessagesOut reports n messages totalling bytes (stored size) returned by one pull of
	// topic. Pulls that return nothing are not reported.
	MessagesOut(topic string, n, bytes int)
	// PullLatency reports how long a pull took from its decoded header to its answer;
	// parked says whether it long-polled (its time is then mostly waiting).
	PullLatency(d time.Duration, parked bool)
}

// DefaultDelayLevels is RocketMQ's messageDelayLevel.
const DefaultDelayLevels = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

func (c *Config) withDefaults() (Config, error) {
	cfg := *c
	if cfg.DataDir == "" {
		cfg.DataDir = "./flowd-data"
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:10911"
	}
	if cfg.NamesrvListen == "" {
		cfg.NamesrvListen = "127.0.0.1:9876"
	}
	if cfg.Cluster == "" {
		cfg.Cluster = "local"
	}
	if cfg.BrokerName == "" {
		cfg.BrokerName = "broker-a"
	}
	if strings.ContainsAny(cfg.BrokerName, " \t\n") {
		return cfg, fmt.Errorf("config: broker name %q must not contain spaces", cfg.BrokerName)
	}
	if cfg.DefaultTopicQueues == 0 {
		cfg.DefaultTopicQueues = 4
	}
	if cfg.DefaultTopicQueues < 0 || cfg.DefaultTopicQueues > maxQueues {
		return cfg, fmt.Errorf("config: DefaultTopicQueues %d is outside 1..%d", cfg.DefaultTopicQueues, maxQueues)
	}
	if cfg.MaxMessageSize == 0 {
		cfg.MaxMessageSize = 4 << 20
	}
	if cfg.MaxMessageSize < 0 {
		return cfg, errors.New("config: MaxMessageSize must not be negative")
	}
	if cfg.ClientExpiry == 0 {
		cfg.ClientExpiry = 45 * time.Second
	}
	if cfg.LockLease == 0 {
		cfg.LockLease = 60 * time.Second
	}
	if cfg.RebalanceSettle == 0 {
		cfg.RebalanceSettle = 500 * time.Millisecond
	}
	if cfg.MaxReconsumeTimes == 0 {
		cfg.MaxReconsumeTimes = 16
	}
	if cfg.DelayLevels == "" {
		cfg.DelayLevels = DefaultDelayLevels
	}
	if cfg.MaxLongPoll == 0 {
		cfg.MaxLongPoll = 30 * time.Second
	}
	if cfg.OffsetFlushInterval == 0 {
		cfg.OffsetFlushInterval = 500 * time.Millisecond
	}
	if cfg.MaxGroups == 0 {
		cfg.MaxGroups = 10000
	}
	if cfg.GroupRetention == 0 {
		cfg.GroupRetention = 7 * 24 * time.Hour
	}
	if cfg.TableFlushInterval == 0 {
		cfg.TableFlushInterval = 200 * time.Millisecond
	}
	if cfg.EventQueueSize == 0 {
		cfg.EventQueueSize = 4096
	}
	if cfg.MaxGroups < 0 || cfg.GroupRetention < 0 || cfg.TableFlushInterval < 0 || cfg.EventQueueSize < 0 {
		return cfg, errors.New("config: MaxGroups, GroupRetention, TableFlushInterval and EventQueueSize must not be negative")
	}
	if cfg.TransactionTimeout == 0 {
		cfg.TransactionTimeout = 6 * time.Second
	}
	if cfg.TransactionCheckInterval == 0 {
		cfg.TransactionCheckInterval = 60 * time.Second
	}
	if cfg.TransactionCheckMax == 0 {
		cfg.TransactionCheckMax = 15
	}
	if cfg.TransactionTimeout < 0 || cfg.TransactionCheckInterval < 0 || cfg.TransactionCheckMax < 0 {
		return cfg, errors.New("config: TransactionTimeout, TransactionCheckInterval and TransactionCheckMax must not be negative")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Filters == nil {
		cfg.Filters = filter.NewRegistry(filter.DefaultCacheSize)
		if !cfg.DisableSQL92 {
			cfg.Filters.Register(filter.TypeSQL92, filter.SQL92(func(expr string) (filter.Selector, error) {
				return sql92.Compile(expr)
			}))
		}
	}
	if cfg.Store.MaxMessageSize == 0 {
		// The stored form adds headers, topic and properties to the body.
		cfg.Store.MaxMessageSize = cfg.MaxMessageSize + 64<<10
	}
	if cfg.Store.Logger == nil {
		cfg.Store.Logger = cfg.Logger
	}
	return cfg, nil
}

// parseDelayLevels parses "1s 5s 1m 2h 1d" into durations.
func parseDelayLevels(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range strings.Fields(s) {
		unit := f[len(f)-1]
		if unit == 'd' {
			f = f[:len(f)-1] + "h"
		}
		d, err := time.ParseDuration(f)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("config: delay level %q is not a positive duration", f)
		}
		if unit == 'd' {
			d *= 24
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return nil, errors.New("config: DelayLevels is empty")
	}
	return out, nil
}

// parseAddrPort parses an ip:port, or returns the zero value for a host name.
func parseAddrPort(s string) netip.AddrPort {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}
	}
	return ap
}

// addrPort is a connection's remote address as an ip:port (a message's born host).
func addrPort(a net.Addr) netip.AddrPort {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort()
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}

// advertisable turns a bound address into one clients can dial: a wildcard bind (0.0.0.0 or
// ::) is announced with the first non-loopback IPv4 address of the machine, or loopback when
// there is none.
func advertisable(bound netip.AddrPort) netip.AddrPort {
	if !bound.Addr().IsUnspecified() {
		return bound
	}
	ip := netip.MustParseAddr("127.0.0.1")
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if v, ok := netip.AddrFromSlice(n.IP); ok && v.Unmap().Is4() && !v.IsLoopback() {
					ip = v.Unmap()
					break
				}
			}
		}
	}
	return netip.AddrPortFrom(ip, bound.Port())
}
