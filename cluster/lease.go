package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ReplicaSetsBucket is the KV bucket of the replica sets' leases (docs/cluster.md,
// "Replica sets"): key leader.<broker name> holds the LeaderRecord of the set's master.
// The bucket has no TTL: a lease lapses when its revision stops changing, as each member
// sees by its own clock, never by comparing clocks.
const ReplicaSetsBucket = "flowd_replica_sets"

// ErrLeaseLost: the lease was taken by another member (a compare-and-set on its revision
// failed), so this member is no longer the master.
var ErrLeaseLost = errors.New("replica-set lease lost")

// LeaderRecord is a replica set's lease: who the master is, in which epoch, where its HA
// stream and broker listen, and the in-sync set it published last (only those members may
// take over when it lapses).
type LeaderRecord struct {
	BrokerName string    `json:"broker_name"`
	Node       string    `json:"node"`
	Epoch      int64     `json:"epoch"`
	HAAddr     string    `json:"ha_addr"`
	Addr       string    `json:"addr"`
	InSync     []string  `json:"in_sync"`
	Renewed    time.Time `json:"renewed"` // informational: the writer's clock
	// Replicas is the master's view of the replicas connected to it when it last renewed
	// (LeaseOptions.Replicas), for cluster.status.
	Replicas []ReplicaLag `json:"replicas,omitempty"`
}

// LeaseOptions configures a member's lease of its replica set.
type LeaseOptions struct {
	KV         jetstream.KeyValue
	BrokerName string
	Node       string
	HAAddr     string
	Addr       string
	// MayBootstrap lets this member take a lease nobody holds yet (a new replica set):
	// the configured first master (broker id 0), so that a member with an empty log never
	// becomes the first master over one with data.
	MayBootstrap bool
	// LastEpoch is the newest epoch this member's log knows: a new term is above it.
	LastEpoch int64
	// TTL is how long a lease whose revision does not change stays valid. Default 3 s.
	// It bounds promotion time: a master's death is noticed TTL after its last renewal.
	TTL time.Duration
	// RenewInterval is how often the master renews. Default TTL/3.
	RenewInterval time.Duration
	// FenceMargin: a master that has not renewed for TTL - FenceMargin stops taking writes
	// (Held turns false), before any member can see the lease lapse. Default TTL/3.
	FenceMargin time.Duration
	// Healthy, if set, is asked before every renewal and takeover: a member whose store
	// failed (a disk error) neither renews nor takes the lease, so it steps down and an
	// in-sync replica takes over.
	Healthy func() bool
	// OnChange is called (on the lease's goroutine) when the leader record or this
	// member's holding changes.
	OnChange func(LeaseState)
	// Replicas, if set, is the master's view of its replicas, published with each renewal.
	Replicas func() []ReplicaLag
	Logger   *slog.Logger
}

// LeaseState is what OnChange reports.
type LeaseState struct {
	Leader LeaderRecord
	Known  bool // a leader record exists
	Self   bool // this member holds the lease
}

// Lease is one member's view of, and claim to, its replica set's mastership.
type Lease struct {
	o   LeaseOptions
	key string

	mu          sync.Mutex
	rec         LeaderRecord
	known       bool
	rev         uint64
	revSeen     time.Time // when rev was first seen (local clock)
	self        bool
	renewedFrom time.Time // start of the last successful renewal
	inSync      []string
	lastState   LeaseState
	elections   int64
	fenced      int64
	warnedRev   uint64        // the lapsed revision an ineligible member warned of
	kick        chan struct{} // cap 1: SetInSync asks for a renewal now
}

// OpenReplicaSets creates or binds the ReplicaSetsBucket with replicas copies.
func OpenReplicaSets(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	cfg := jetstream.KeyValueConfig{Bucket: ReplicaSetsBucket, Description: "flowd: replica-set leases", History: 1, Replicas: max(replicas, 1)}
	kv, err := js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = js.KeyValue(ctx, cfg.Bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: bucket %q: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// NewLease prepares a member's lease; Run keeps it.
func NewLease(o LeaseOptions) *Lease {
	if o.TTL == 0 {
		o.TTL = 3 * time.Second
	}
	if o.RenewInterval == 0 {
		o.RenewInterval = o.TTL / 3
	}
	if o.FenceMargin == 0 {
		o.FenceMargin = o.TTL / 3
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Lease{o: o, key: "leader." + encodeKey(o.BrokerName), kick: make(chan struct{}, 1)}
}

// Held reports whether this member holds the lease and renewed it within TTL - FenceMargin:
// the master's writes stop as soon as it is false (fencing), before another member can
// take over.
func (l *Lease) Held() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.heldLocked(time.Now())
}

func (l *Lease) heldLocked(now time.Time) bool {
	return l.self && now.Sub(l.renewedFrom) < l.o.TTL-l.o.FenceMargin
}

// Leader is the current leader record, if any.
func (l *Lease) Leader() (LeaderRecord, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rec, l.known
}

// Counts are the elections this member won and the times it fenced itself.
func (l *Lease) Counts() (elections, fenced int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.elections, l.fenced
}

// SetInSync sets the in-sync set the master publishes, at once: until it is in the
// record, a replica that caught up may not take over.
func (l *Lease) SetInSync(nodes []string) {
	l.mu.Lock()
	l.inSync = slices.Clone(nodes)
	l.mu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Run keeps the lease until ctx is done: it reads the record every RenewInterval/2,
// renews it while this member holds it, and takes it over when it lapsed and this member
// may. It never deletes the record: a stopped master's lease lapses.
func (l *Lease) Run(ctx context.Context) {
	t := time.NewTicker(max(l.o.RenewInterval/2, 10*time.Millisecond))
	defer t.Stop()
	wasHeld := false
	for {
		l.step(ctx)
		l.mu.Lock()
		held := l.heldLocked(time.Now())
		if wasHeld && !held {
			l.fenced++
			l.o.Logger.Warn("replica-set lease not renewed in time: fenced, taking no writes", "broker", l.o.BrokerName, "epoch", l.rec.Epoch)
		}
		wasHeld = held
		st := LeaseState{Leader: l.rec, Known: l.known, Self: held}
		changed := !sameState(st, l.lastState)
		l.lastState = st
		l.mu.Unlock()
		if changed && l.o.OnChange != nil {
			l.o.OnChange(st)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-l.kick:
		}
	}
}

func sameState(a, b LeaseState) bool {
	return a.Known == b.Known && a.Self == b.Self && a.Leader.Node == b.Leader.Node && a.Leader.Epoch == b.Leader.Epoch &&
		a.Leader.HAAddr == b.Leader.HAAddr && slices.Equal(a.Leader.InSync, b.Leader.InSync)
}

// step is one round: read, then renew or campaign.
func (l *Lease) step(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, l.o.FenceMargin)
	defer cancel()
	now := time.Now()
	e, err := l.o.KV.Get(rctx, l.key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		l.mu.Lock()
		l.known, l.rev = false, 0
		l.mu.Unlock()
		if l.o.MayBootstrap && (l.o.Healthy == nil || l.o.Healthy()) {
			l.take(rctx, 0, l.o.LastEpoch)
		}
		return
	case err != nil:
		l.o.Logger.Debug("replica-set lease unreadable", "broker", l.o.BrokerName, "err", err)
		return
	}
	var rec LeaderRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		l.o.Logger.Error("replica-set lease record unreadable", "broker", l.o.BrokerName, "err", err)
		return
	}
	l.mu.Lock()
	if e.Revision() != l.rev {
		l.rev, l.revSeen = e.Revision(), now
	}
	if l.self && (rec.Node != l.o.Node || rec.Epoch != l.rec.Epoch) {
		l.self = false // another member took over
		l.o.Logger.Warn("replica-set lease taken by another member", "broker", l.o.BrokerName, "node", rec.Node, "epoch", rec.Epoch)
	}
	l.rec, l.known = rec, true
	mine := l.self
	lapsed := now.Sub(l.revSeen) >= l.o.TTL
	renewDue := now.Sub(l.renewedFrom) >= l.o.RenewInterval || !slices.Equal(rec.InSync, l.inSync)
	eligible := rec.Node == l.o.Node || slices.Contains(rec.InSync, l.o.Node)
	rev := e.Revision()
	warnIneligible := !mine && lapsed && !eligible && l.warnedRev != rev
	if warnIneligible {
		l.warnedRev = rev
	}
	l.mu.Unlock()
	if warnIneligible {
		l.o.Logger.Warn("replica-set lease lapsed, but this member was not in the master's last in-sync set: it may not take over",
			"broker", l.o.BrokerName, "node", l.o.Node, "master", rec.Node, "epoch", rec.Epoch, "in_sync", rec.InSync)
	}
	if l.o.Healthy != nil && !l.o.Healthy() {
		return
	}
	switch {
	case mine && renewDue:
		l.renew(rctx, rec, rev, now)
	case !mine && lapsed && eligible:
		l.take(rctx, rev, max(rec.Epoch, l.o.LastEpoch))
	}
}

func (l *Lease) record(epoch int64) LeaderRecord {
	var reps []ReplicaLag
	if l.o.Replicas != nil {
		reps = l.o.Replicas() // outside l.mu: it reads the master's state
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return LeaderRecord{BrokerName: l.o.BrokerName, Node: l.o.Node, Epoch: epoch, HAAddr: l.o.HAAddr, Addr: l.o.Addr, InSync: slices.Clone(l.inSync), Renewed: time.Now(), Replicas: reps}
}

// take claims the lease with the epoch after last: Create when there is no record (rev 0),
// else Update on the revision read, so that of two candidates one wins.
func (l *Lease) take(ctx context.Context, rev uint64, last int64) {
	rec := l.record(last + 1)
	rec.InSync = nil // a new master's in-sync set starts empty: its replicas must catch up with it
	data, err := json.Marshal(rec)
	if err != nil {
		return
	}
	start := time.Now()
	var nrev uint64
	if rev == 0 {
		nrev, err = l.o.KV.Create(ctx, l.key, data)
	} else {
		nrev, err = l.o.KV.Update(ctx, l.key, data, rev)
	}
	if err != nil {
		l.o.Logger.Debug("replica-set lease not taken", "broker", l.o.BrokerName, "err", err)
		return
	}
	l.mu.Lock()
	l.rec, l.known, l.rev, l.revSeen, l.self, l.renewedFrom = rec, true, nrev, start, true, start
	l.inSync = nil
	l.elections++
	l.mu.Unlock()
	l.o.Logger.Info("replica-set lease taken: this node is master", "broker", l.o.BrokerName, "node", l.o.Node, "epoch", rec.Epoch)
}

// renew rewrites the record on its revision; a failed compare-and-set means another
// member took the lease.
func (l *Lease) renew(ctx context.Context, cur LeaderRecord, rev uint64, start time.Time) {
	rec := l.record(cur.Epoch)
	data, err := json.Marshal(rec)
	if err != nil {
		return
	}
	nrev, err := l.o.KV.Update(ctx, l.key, data, rev)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			l.self = false
			l.o.Logger.Warn("replica-set lease lost", "broker", l.o.BrokerName, "err", fmt.Errorf("%w: %w", ErrLeaseLost, err))
		}
		return
	}
	if !slices.Equal(cur.InSync, rec.InSync) {
		l.o.Logger.Info("replica-set in-sync set published", "broker", l.o.BrokerName, "epoch", rec.Epoch, "in_sync", rec.InSync)
	}
	l.rec, l.rev, l.revSeen, l.renewedFrom = rec, nrev, start, start
}
