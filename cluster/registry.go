package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowd-io/flowd/broker"
)

// selfInfo is this broker's registry entry as of now.
func (m *Member) selfInfo() BrokerInfo {
	st := m.b.Status()
	bi := BrokerInfo{
		Name: st.BrokerName, Cluster: st.Cluster, Addr: st.Addr, NamesrvAddr: st.NamesrvAddr, GRPCAddr: m.opts.GRPCAddr,
		Node: m.opts.Node, Version: m.opts.Version, Started: st.Started, Heartbeat: time.Now(),
		Load: Load{Topics: st.Topics, Clients: st.Clients, Members: st.Members, WaitingPulls: st.WaitingPulls},
	}
	if m.opts.ReplicaSet != nil {
		m.setInfo(&bi)
	}
	return bi
}

// register creates the broker's registry entry. KV Create is compare-and-set, so of two
// brokers of one name the second fails while the first's entry lives; an entry of the same
// node at the same address is this node's previous process (which held the address, so is
// gone) and is taken over rather than waited out.
func (m *Member) register(ctx context.Context, kv jetstream.KeyValue) (uint64, error) {
	self := m.selfInfo()
	data, err := json.Marshal(self)
	if err != nil {
		return 0, fmt.Errorf("cluster: encode registry entry: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, m.opts.RequestTimeout)
	defer cancel()
	key := encodeKey(self.Name)
	rev, err := kv.Create(ctx, key, data)
	if err == nil {
		return rev, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("cluster: register broker %q: %w", self.Name, err)
	}
	e, gerr := kv.Get(ctx, key)
	if gerr != nil {
		return 0, fmt.Errorf("cluster: register broker %q: read the existing entry: %w", self.Name, gerr)
	}
	var other BrokerInfo
	jerr := json.Unmarshal(e.Value(), &other)
	if jerr == nil {
		ok, err := replaces(self, other)
		if err != nil {
			return 0, err
		}
		if ok {
			// The set's previous master, listed until its entry expires: replaced on the
			// revision read, so a newer master that wrote meanwhile keeps its entry.
			rev, err = kv.Update(ctx, key, data, e.Revision())
			if err != nil {
				return 0, fmt.Errorf("cluster: register broker %q: replace the entry of the replica set's previous master %s: %w", self.Name, other.Master, err)
			}
			if other.Master != self.Master {
				m.log.Info("cluster: replaced the registry entry of the replica set's previous master", "broker", self.Name,
					"previous", other.Master, "previous_epoch", other.Epoch, "master", self.Master, "epoch", self.Epoch)
			}
			return rev, nil
		}
	}
	if jerr == nil && other.Node == self.Node && other.Addr == self.Addr {
		rev, err = kv.Update(ctx, key, data, e.Revision())
		if err != nil {
			return 0, fmt.Errorf("cluster: register broker %q: take over this node's previous entry: %w", self.Name, err)
		}
		return rev, nil
	}
	if m.lapsed(e) {
		// Update on the revision read: a broker that heartbeats meanwhile is still live,
		// and this take-over fails rather than overwrite it.
		rev, err = kv.Update(ctx, key, data, e.Revision())
		if err != nil {
			return 0, fmt.Errorf("cluster: register broker %q: take over the lapsed entry of node %q at %s: %w", self.Name, other.Node, other.Addr, err)
		}
		m.log.Info("cluster: took over a lapsed registry entry", "broker", self.Name, "node", other.Node, "addr", other.Addr, "written", e.Created())
		return rev, nil
	}
	return 0, fmt.Errorf("cluster: register broker %q: %w: node %q at %s heartbeated %s ago (its entry expires %s after its last heartbeat)",
		self.Name, ErrNameTaken, other.Node, other.Addr, time.Since(other.Heartbeat).Round(time.Millisecond), m.opts.TTL)
}

// lapsed reports whether a registry entry was written longer than the TTL ago, by the
// server's stamp: the bucket's max age should have removed it, and a live broker would
// have rewritten it. A JetStream that restarts (every node of a cluster killed at once)
// ages its entries out only once their stream has recovered, which can be after a restarted
// node registers; without this, that node would be refused by its own previous entry.
func (m *Member) lapsed(e jetstream.KeyValueEntry) bool {
	return time.Since(e.Created()) > m.opts.TTL
}

// checkCluster refuses to register when the registry holds a live broker of another flowd
// cluster name: its NATS servers route with ours, so the two clusters would share routes and
// topics while their control planes (flowd.ctl.v1.<cluster>) stay apart.
func (m *Member) checkCluster(ctx context.Context, kv jetstream.KeyValue) error {
	ctx, cancel := context.WithTimeout(ctx, m.opts.RequestTimeout)
	defer cancel()
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return fmt.Errorf("cluster: list the registry: %w", err)
	}
	defer func() { _ = keys.Stop() }()
	own := m.b.Status().Cluster
	for key := range keys.Keys() {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue // expired meanwhile
		}
		if err != nil {
			return fmt.Errorf("cluster: read the registry entry %q: %w", key, err)
		}
		if m.lapsed(e) {
			continue // a broker that stopped heartbeating: not live
		}
		var bi BrokerInfo
		if json.Unmarshal(e.Value(), &bi) == nil && bi.Cluster != own {
			return fmt.Errorf("cluster: broker %q of cluster %q (node %q at %s) is live in this NATS cluster's registry, but this broker's cluster is %q: %w: "+
				"every node of one NATS cluster needs the same cluster (--cluster), or a NATS cluster of its own (nats.cluster.name, --nats-cluster-name)",
				bi.Name, bi.Cluster, bi.Node, bi.Addr, own, ErrClusterMismatch)
		}
	}
	return nil
}

// heartbeat rewrites the registry entry every HeartbeatInterval. An entry that expired (the
// member was paused, NATS was away) is created again, which fails while another broker has
// taken the name meanwhile.
func (m *Member) heartbeat(ctx context.Context) {
	t := time.NewTicker(m.opts.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-m.beatNow:
		}
		beat := m.beat
		if m.opts.ReplicaSet != nil {
			beat = m.beatSet
		}
		if err := beat(ctx); err != nil && ctx.Err() == nil {
			m.log.Warn("cluster heartbeat failed", "broker", m.name, "err", err)
		}
		if err := m.sweep(ctx); err != nil && ctx.Err() == nil {
			m.log.Warn("cluster registry check failed", "broker", m.name, "err", err)
		}
	}
}

func (m *Member) beat(ctx context.Context) error {
	data, err := json.Marshal(m.selfInfo())
	if err != nil {
		return fmt.Errorf("encode registry entry: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, m.opts.RequestTimeout)
	defer cancel()
	rev, err := m.brokersKV.Update(cctx, encodeKey(m.name), data, m.rev)
	if err == nil {
		m.rev = rev
		return nil
	}
	if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("update registry entry: %w", err)
	}
	// The revision moved: the entry expired, or someone else wrote it.
	rev, err = m.register(ctx, m.brokersKV)
	if errors.Is(err, ErrNameTaken) {
		m.emit(Event{Type: NameTaken, Time: time.Now(), Broker: m.selfInfo(), Reason: err.Error()})
		return err
	}
	if errors.Is(err, errSuperseded) {
		m.rev = 0 // a newer master's entry: this node is about to learn it lost the lease
	}
	if err != nil {
		return err
	}
	m.rev = rev
	m.log.Info("cluster registry entry written again after it lapsed", "broker", m.name)
	return nil
}

// sweep reads again from the bucket the entry of every other broker the watch has not
// delivered within the TTL, and drops those gone. A live broker rewrites its entry every
// HeartbeatInterval, so such silence means the watch missed the entry's expiry: when the
// stream's leader dies, the watch's consumer is recreated from the bucket's last values,
// and an expiry marker that aged out meanwhile is never delivered, which left a dead broker
// in every route of that member for good.
func (m *Member) sweep(ctx context.Context) error {
	now := time.Now()
	var stale []string
	m.mu.RLock()
	for name := range m.brokers {
		if !m.own(name) && now.Sub(m.seen[name]) > m.opts.TTL {
			stale = append(stale, name)
		}
	}
	m.mu.RUnlock()
	for _, name := range stale {
		cctx, cancel := context.WithTimeout(ctx, m.opts.RequestTimeout)
		e, err := m.brokersKV.Get(cctx, encodeKey(name))
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
			m.forget(name, "expired")
		case err != nil:
			return fmt.Errorf("read the entry of broker %q: %w", name, err)
		default:
			m.applyRegistry(name, e)
		}
	}
	return nil
}

// own reports whether name's entry is this member's own, which it keeps for itself: a plain
// broker's. A replica set's entry is its master's, which may be another member of the set,
// and lapses like any other broker's.
func (m *Member) own(name string) bool { return name == m.name && m.opts.ReplicaSet == nil }

// forget drops a broker from the watched copy and reports that it left.
func (m *Member) forget(name, reason string) {
	m.mu.Lock()
	bi, had := m.brokers[name]
	delete(m.brokers, name)
	delete(m.seen, name)
	m.mu.Unlock()
	if had {
		m.emit(Event{Type: BrokerLeft, Time: time.Now(), Broker: bi, Reason: reason})
	}
}

// watchRegistry keeps m.brokers in step with the registry bucket and reports joins and
// leaves. synced is closed once the initial values are in.
//
// A watch is an ordered consumer on one NATS server: when that server dies, the watch goes
// silent until the client notices, seconds later. Every live broker rewrites its entry each
// HeartbeatInterval, so a watch that delivers nothing for two of them while the copy lists
// a broker is recreated (it delivers the last values again): a replica set's new master is
// then routed by this member within about a heartbeat, not once the sweep reads it.
func (m *Member) watchRegistry(ctx context.Context, w jetstream.KeyWatcher, synced chan<- struct{}) {
	defer func() { w.Stop() }()
	check := time.NewTicker(m.opts.HeartbeatInterval)
	defer check.Stop()
	last := time.Now()
	for {
		var e jetstream.KeyValueEntry
		var ok bool
		select {
		case <-ctx.Done():
			return
		case <-check.C:
			if silent := time.Since(last); silent > 2*m.opts.HeartbeatInterval && m.listsBrokers() {
				nw, err := m.brokersKV.WatchAll(ctx)
				if err != nil {
					m.log.Debug("cluster registry: watch silent, not recreated", "silent", silent, "err", err)
					continue
				}
				w.Stop()
				w, last = nw, time.Now()
				m.log.Info("cluster registry: watch silent while brokers are live: recreated", "broker", m.name, "silent", silent.Round(time.Millisecond))
			}
			continue
		case e, ok = <-w.Updates():
		}
		if !ok {
			return
		}
		last = time.Now()
		if e == nil {
			if synced != nil {
				close(synced)
				synced = nil
			}
			continue
		}
		name, err := decodeKey(e.Key())
		if err != nil {
			m.log.Warn("cluster registry: ignoring a key", "err", err)
			continue
		}
		m.applyRegistry(name, e)
	}
}

// listsBrokers reports whether the watched copy holds a broker, whose heartbeats the watch
// should deliver.
func (m *Member) listsBrokers() bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.brokers) > 0
}

func (m *Member) applyRegistry(name string, e jetstream.KeyValueEntry) {
	now := time.Now()
	if e.Operation() != jetstream.KeyValuePut {
		reason := "left"
		if e.Operation() == jetstream.KeyValuePurge {
			reason = "expired"
		}
		m.forget(name, reason)
		return
	}
	m.mu.RLock()
	self := m.name
	m.mu.RUnlock()
	if (name != self || m.opts.ReplicaSet != nil) && m.lapsed(e) {
		// Redelivered after it should have aged out: a watch recreated when the stream's
		// leader died delivers the last values again, and a sweep reads an entry the new
		// leader has not expired yet. Its broker stopped heartbeating a TTL ago.
		m.forget(name, "expired")
		return
	}
	var bi BrokerInfo
	if err := json.Unmarshal(e.Value(), &bi); err != nil || bi.Name != name || bi.Addr == "" {
		m.log.Warn("cluster registry: ignoring a malformed entry", "key", e.Key(), "err", err)
		return
	}
	if own := m.b.Status().Cluster; bi.Cluster != own {
		// Registered at the same moment as this member's check, or before it was refused:
		// never routed here.
		m.mu.Lock()
		told := m.foreign[name]
		m.foreign[name] = true
		m.mu.Unlock()
		if !told {
			m.log.Error("cluster registry: ignoring a broker of another cluster", "broker", bi.Name, "cluster", bi.Cluster,
				"this_cluster", own, "err", ErrClusterMismatch)
		}
		return
	}
	m.mu.Lock()
	_, had := m.brokers[name]
	m.brokers[name] = bi
	m.seen[name] = now
	m.mu.Unlock()
	if !had {
		m.emit(Event{Type: BrokerJoined, Time: now, Broker: bi})
	}
}

// startLoops starts the watchers, the topic and group loops and the heartbeat, and waits
// until the watched copies hold the buckets' contents.
func (m *Member) startLoops(ctx context.Context) error {
	regW, err := m.brokersKV.WatchAll(m.ctx)
	if err != nil {
		return fmt.Errorf("cluster: watch %q: %w", m.opts.BrokersBucket, err)
	}
	topW, err := m.topics.kv.WatchAll(m.ctx)
	if err != nil {
		regW.Stop()
		return fmt.Errorf("cluster: watch %q: %w", m.opts.TopicsBucket, err)
	}
	grpW, err := m.groups.kv.WatchAll(m.ctx)
	if err != nil {
		regW.Stop()
		topW.Stop()
		return fmt.Errorf("cluster: watch %q: %w", m.opts.GroupsBucket, err)
	}
	lctx, lcancel := context.WithCancel(m.ctx)
	regSynced, topSynced, grpSynced := make(chan struct{}), make(chan struct{}), make(chan struct{})
	localTopics, localGroups := make(chan broker.Event, 64), make(chan broker.Event, 64)
	unsubscribe := m.b.Subscribe(func(e broker.Event) {
		var ch chan broker.Event
		switch e.Type {
		case broker.TopicCreated, broker.TopicUpdated, broker.TopicDeleted:
			ch = localTopics
		case broker.GroupCreated, broker.GroupUpdated, broker.GroupDeleted:
			ch = localGroups
		default:
			return
		}
		select {
		case ch <- e:
		case <-lctx.Done():
		}
	})
	m.wg.Add(5)
	go func() { defer m.wg.Done(); m.watchRegistry(lctx, regW, regSynced) }()
	go func() { defer m.wg.Done(); m.syncTopics(lctx, topW, localTopics, topSynced) }()
	go func() { defer m.wg.Done(); m.syncGroups(lctx, grpW, localGroups, grpSynced) }()
	// The subscription ends when the loops do, before the member's goroutines are waited on.
	go func() { defer m.wg.Done(); <-lctx.Done(); unsubscribe() }()
	for _, ch := range []chan struct{}{regSynced, topSynced, grpSynced} {
		select {
		case <-ch:
		case <-ctx.Done():
			lcancel()
			m.wg.Done()
			return fmt.Errorf("cluster: load the shared state: %w", ctx.Err())
		}
	}
	if m.opts.ReplicaSet != nil {
		m.Refresh() // a master registers at once, not a heartbeat later
	}
	go func() { defer m.wg.Done(); defer lcancel(); m.heartbeat(lctx) }()
	return nil
}
