package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

// ErrNameTaken is wrapped by Join's error when another live broker has this broker's name.
var ErrNameTaken = errors.New("broker name already live in the cluster")

// ErrClusterMismatch is wrapped by Join's error when the registry holds a live broker of
// another flowd cluster name: nodes whose NATS servers route together (one
// nats.cluster.name) but whose flowd cluster names differ would share the buckets, and
// with them routes and topics, while their control planes stay apart.
var ErrClusterMismatch = errors.New("flowd cluster names differ")

// BrokerInfo is a broker's entry in the registry.
type BrokerInfo struct {
	Name    string `json:"name"`
	Cluster string `json:"cluster"`
	// Addr is the broker's remoting address; NamesrvAddr its name service's ("" when off).
	Addr        string `json:"addr"`
	NamesrvAddr string `json:"namesrvAddr,omitempty"`
	// GRPCAddr is the broker's RocketMQ 5 gRPC address as its routes name it ("" when its
	// endpoint is off, and in the entries of flowd versions before it was kept).
	GRPCAddr string    `json:"grpcAddr,omitempty"`
	Node     string    `json:"node"`
	Version  string    `json:"version"`
	Started  time.Time `json:"started"`
	// Heartbeat is when the entry was last written.
	Heartbeat time.Time `json:"heartbeat"`
	Load      Load      `json:"load"`
	// Epoch is, for a replica set's master, its lease's epoch; 0 for a plain broker. Of two
	// masters of one set, the newer epoch's entry replaces the older's.
	Epoch int64 `json:"epoch,omitempty"`
	// Master is, for a replica set, the master's member name (<broker name>-<broker id>).
	Master string `json:"master,omitempty"`
	// Addrs are, for a replica set, the remoting addresses its routes name by broker id: the
	// master's (Addr) as 0, each in-sync replica's by its id, so that clients may read from
	// the replicas. Absent for a plain broker: Addr as id 0.
	Addrs map[int64]string `json:"addrs,omitempty"`
}

// Load is what a broker reports of its work with each heartbeat.
type Load struct {
	Topics       int   `json:"topics"`
	Clients      int   `json:"clients"`
	Members      int   `json:"members"`
	WaitingPulls int64 `json:"waitingPulls"`
}

// EventType says what an Event reports.
type EventType int

// Event types.
const (
	// BrokerJoined: a broker appeared in the registry (this one included, at Join).
	BrokerJoined EventType = iota + 1
	// BrokerLeft: a broker's entry went away; Reason is "left" (it deregistered) or
	// "expired" (no heartbeat within the TTL).
	BrokerLeft
	// NameTaken: this member could not (re)register because another live broker has its
	// name; it keeps retrying and serves alone meanwhile.
	NameTaken
)

func (t EventType) String() string {
	switch t {
	case BrokerJoined:
		return "cluster.broker_joined"
	case BrokerLeft:
		return "cluster.broker_left"
	case NameTaken:
		return "cluster.name_taken"
	}
	return fmt.Sprintf("cluster.event.%d", int(t))
}

// Event is one registry change.
type Event struct {
	Type   EventType
	Time   time.Time
	Broker BrokerInfo
	Reason string
}

// Member is one broker's membership. It implements broker.Peers: pass it as the broker's
// Config.Peers before New, then Join once the broker runs.
type Member struct {
	opts Options
	log  *slog.Logger

	mu      sync.RWMutex
	name    string // this broker's name, set by Join
	brokers map[string]BrokerInfo
	// seen is when the watch last delivered each broker's entry, by this node's clock: a
	// broker not seen within the TTL is checked against the bucket (sweep).
	seen map[string]time.Time
	// foreign names the brokers of another cluster the watch delivered, logged once each.
	foreign map[string]bool
	// topics and groups are the watched copies of the topics and groups buckets, with each
	// entry's revision (see table).
	topics table[broker.TopicConfig]
	groups table[broker.GroupConfig]
	joined bool

	b      *broker.Broker
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// brokersKV (and topics.kv, groups.kv) are set once by the goroutine that joins, before
	// it starts the loops that use them; Close reads them after wg.Wait.
	brokersKV jetstream.KeyValue
	rev       uint64 // the registry entry's last revision (0: none written), heartbeat goroutine only
	closeOnce sync.Once
	// beatNow, topicsNow and groupsNow (cap 1) are Refresh's: a replica set's change to act
	// on at once.
	beatNow, topicsNow, groupsNow chan struct{}
	// leaderCheck is when a replica set's master last checked who leads the registry's
	// stream (Options.ServerName), heartbeat goroutine only.
	leaderCheck time.Time
}

var _ broker.Peers = (*Member)(nil)

// New returns a member that knows no other broker yet; it answers broker.Peers with
// nothing until Join.
func New(o Options) (*Member, error) {
	opts, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Member{
		opts: opts, log: opts.Logger, brokers: map[string]BrokerInfo{}, seen: map[string]time.Time{}, foreign: map[string]bool{},
		topics: newTable("topic", func(tc broker.TopicConfig) string { return tc.Name }),
		groups: newTable("group", func(g broker.GroupConfig) string { return g.Name }),
		ctx:    ctx, cancel: cancel,
		beatNow: make(chan struct{}, 1), topicsNow: make(chan struct{}, 1), groupsNow: make(chan struct{}, 1),
	}, nil
}

// Join registers b (started, named by its Config.BrokerName) in the cluster, loads the
// registry, the topics and the subscription groups, materialises the cluster's topics and
// groups on b and publishes b's own.
// It fails with an error wrapping ErrNameTaken when a live broker elsewhere has b's name.
// When JetStream cannot be reached it logs, returns nil and keeps trying every
// Options.RetryInterval: the broker serves alone meanwhile.
func (m *Member) Join(ctx context.Context, b *broker.Broker) error {
	if m.b != nil {
		return errors.New("cluster: Join called twice")
	}
	st := b.Status()
	m.b = b
	m.mu.Lock()
	m.name = st.BrokerName
	m.mu.Unlock()
	if m.opts.Node == "" {
		m.opts.Node = st.BrokerName
	}
	err := m.connect(ctx)
	if err == nil || errors.Is(err, ErrNameTaken) || errors.Is(err, ErrClusterMismatch) {
		return err
	}
	if ctx.Err() != nil {
		return err
	}
	if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
		// Retrying cannot mend this one: say what to change rather than that the cluster forms.
		m.log.Warn("cluster not ready: JetStream is not enabled on the NATS server (enable it on every server of nats.urls, "+
			"or for this account): serving alone and retrying", "broker", st.BrokerName, "server", m.opts.Conn.ConnectedUrlRedacted(),
			"retry", m.opts.RetryInterval, "err", err)
	} else {
		m.log.Warn("cluster not ready (JetStream unreachable, or its leader not elected yet while the cluster forms): serving alone and retrying",
			"broker", st.BrokerName, "retry", m.opts.RetryInterval, "err", err)
	}
	m.wg.Add(1)
	go m.retryJoin()
	return nil
}

// retryJoin tries to join until it succeeds or the member closes.
func (m *Member) retryJoin() {
	defer m.wg.Done()
	t := time.NewTicker(m.opts.RetryInterval)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
		err := m.connect(m.ctx)
		if err == nil {
			m.log.Info("cluster joined after retrying", "broker", m.name)
			return
		}
		if errors.Is(err, ErrNameTaken) {
			m.emit(Event{Type: NameTaken, Time: time.Now(), Broker: m.selfInfo(), Reason: err.Error()})
		}
		if errors.Is(err, ErrClusterMismatch) {
			m.log.Error("cluster join refused: still serving alone", "broker", m.name, "err", err)
			continue
		}
		m.log.Warn("cluster join failed: still serving alone", "broker", m.name, "err", err)
	}
}

// connect creates or binds the buckets, registers the broker and starts the watchers, the
// topic loop and the heartbeat.
func (m *Member) connect(ctx context.Context) error {
	js, err := jetstream.New(m.opts.Conn)
	if err != nil {
		return fmt.Errorf("cluster: jetstream: %w", err)
	}
	brokersKV, err := m.bucket(ctx, js, jetstream.KeyValueConfig{
		Bucket: m.opts.BrokersBucket, Description: "flowd: live brokers",
		TTL: m.opts.TTL, LimitMarkerTTL: max(m.opts.TTL, minTTL),
	})
	if err != nil {
		return err
	}
	topicsKV, err := m.bucket(ctx, js, jetstream.KeyValueConfig{Bucket: m.opts.TopicsBucket, Description: "flowd: topic configurations"})
	if err != nil {
		return err
	}
	groupsKV, err := m.bucket(ctx, js, jetstream.KeyValueConfig{Bucket: m.opts.GroupsBucket, Description: "flowd: subscription group configurations"})
	if err != nil {
		return err
	}
	if err := m.checkCluster(ctx, brokersKV); err != nil {
		return err
	}
	var rev uint64
	if m.opts.ReplicaSet == nil {
		// A replica set's node registers from its heartbeat, once it is master.
		if rev, err = m.register(ctx, brokersKV); err != nil {
			return err
		}
	}
	m.brokersKV, m.topics.kv, m.groups.kv, m.rev = brokersKV, topicsKV, groupsKV, rev
	if err := m.startLoops(ctx); err != nil {
		return err
	}
	m.mu.Lock()
	m.joined = true
	m.mu.Unlock()
	return nil
}

func (m *Member) bucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	cfg.Replicas = m.opts.replicas()
	cfg.History = 1
	ctx, cancel := context.WithTimeout(ctx, m.opts.RequestTimeout)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		// Created by another member with other settings (replicas, TTL): the first
		// creator's settings hold for the cluster.
		kv, err = js.KeyValue(ctx, cfg.Bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: bucket %q: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// Joined reports whether the member is registered (false while it serves alone).
func (m *Member) Joined() bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.joined
}

// Registry lists the registry: every live broker, this one included, by name.
func (m *Member) Registry() []BrokerInfo {
	m.mu.RLock()
	out := make([]BrokerInfo, 0, len(m.brokers))
	for _, bi := range m.brokers {
		out = append(out, bi)
	}
	m.mu.RUnlock()
	slices.SortFunc(out, func(x, y BrokerInfo) int { return cmp.Compare(x.Name, y.Name) })
	return out
}

// TopicRoute implements broker.Peers: the topic's queues on every other live broker.
func (m *Member) TopicRoute(topic string) ([]protocol.QueueData, []protocol.BrokerData) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	rec, ok := m.topics.recs[topic]
	if !ok {
		return nil, nil
	}
	var qs []protocol.QueueData
	var bds []protocol.BrokerData
	for name, bi := range m.brokers {
		if name == m.name {
			continue
		}
		qs = append(qs, protocol.QueueData{
			BrokerName: name, ReadQueueNums: int32(rec.Config.ReadQueueNums), WriteQueueNums: int32(rec.Config.WriteQueueNums),
			Perm: int32(rec.Config.Perm), TopicSysFlag: int32(rec.Config.TopicSysFlag),
		})
		bds = append(bds, brokerData(bi))
	}
	return qs, bds
}

// Brokers implements broker.Peers: every other live broker.
func (m *Member) Brokers() []protocol.BrokerData {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []protocol.BrokerData
	for name, bi := range m.brokers {
		if name != m.name {
			out = append(out, brokerData(bi))
		}
	}
	return out
}

// Topics implements broker.Peers: the shared topics of the watched topics table.
func (m *Member) Topics() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]string, 0, len(m.topics.recs))
	for name := range m.topics.recs {
		out = append(out, name)
	}
	return out
}

// TopicPeer is a topic's share on another live broker: the broker's entry and the topic's
// configuration in the cluster's topic table, which every broker of the cluster serves.
type TopicPeer struct {
	Broker BrokerInfo
	Topic  broker.TopicConfig
}

// TopicPeers is the topic's share on every other live broker, by broker name; none when
// the cluster's topic table does not hold the topic.
func (m *Member) TopicPeers(topic string) []TopicPeer {
	m.mu.RLock()
	rec, ok := m.topics.recs[topic]
	var out []TopicPeer
	if ok {
		for name, bi := range m.brokers {
			if name != m.name {
				out = append(out, TopicPeer{Broker: bi, Topic: rec.Config})
			}
		}
	}
	m.mu.RUnlock()
	slices.SortFunc(out, func(x, y TopicPeer) int { return cmp.Compare(x.Broker.Name, y.Broker.Name) })
	return out
}

func brokerData(bi BrokerInfo) protocol.BrokerData {
	addrs := map[int64]string{protocol.MasterID: bi.Addr}
	for id, a := range bi.Addrs {
		if id != protocol.MasterID && a != "" {
			addrs[id] = a // a replica set's in-sync replicas
		}
	}
	return protocol.BrokerData{Cluster: bi.Cluster, BrokerName: bi.Name, BrokerAddrs: addrs}
}

func (m *Member) emit(e Event) {
	m.log.Info("cluster event", "type", e.Type.String(), "broker", e.Broker.Name, "reason", e.Reason)
	if m.opts.OnEvent != nil {
		m.opts.OnEvent(e)
	}
}

// Close stops the member and deregisters its broker, so that the others drop it from their
// routes at once rather than after the TTL. It does not stop the broker.
func (m *Member) Close(ctx context.Context) error {
	var err error
	m.closeOnce.Do(func() {
		m.cancel()
		m.wg.Wait()
		if !m.Joined() || m.rev == 0 {
			return // never registered: a replica set's node that was not master
		}
		dctx, cancel := context.WithTimeout(ctx, m.opts.RequestTimeout)
		defer cancel()
		// Only this member's own revision: a broker that took the name since stays.
		if derr := m.brokersKV.Delete(dctx, encodeKey(m.name), jetstream.LastRevision(m.rev)); derr != nil {
			err = fmt.Errorf("cluster: deregister broker %q: %w", m.name, derr)
		}
	})
	return err
}
