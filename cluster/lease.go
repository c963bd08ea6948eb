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

	"github.com/nats-io/nats.go"
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
	BrokerName string `json:"broker_name"`
	Node       string `json:"node"`
	Epoch      int64  `json:"epoch"`
	HAAddr     string `json:"ha_addr"`
	Addr       string `json:"addr"`
	// GRPCAddr is the master's RocketMQ 5 gRPC address, for the set's gRPC routes ("" when
	// its endpoint is off, and in the leases of flowd versions before it was kept).
	GRPCAddr string    `json:"grpc_addr,omitempty"`
	InSync   []string  `json:"in_sync"`
	Renewed  time.Time `json:"renewed"` // informational: the writer's clock
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
	// GRPCAddr is this member's gRPC address, published while it is the master ("": off).
	GRPCAddr string
	// MayBootstrap lets this member take a lease nobody holds yet (a new replica set):
	// the configured first master (broker id 0), so that a member with an empty log never
	// becomes the first master over one with data.
	MayBootstrap bool
	// LastEpoch is the newest epoch this member's log knows: a new term is above it.
	LastEpoch int64
	// Position, if set, says where this member's log stands when it stands for a lapsed
	// lease: of the members that may take it, the one whose log goes furthest does (see
	// campaign). Nil: the first eligible member to see the lease lapse takes it.
	Position func() LogPosition
	// CandidacyWindow bounds how long a member that stands for a lapsed lease waits for an
	// in-sync member that has not stood yet: three windows from when it stood. It compares
	// as soon as every in-sync member stood. Default RenewInterval/2.
	CandidacyWindow time.Duration
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
	// Trace, if set, receives a debug line for every step of the lease (each read, stand,
	// comparison, take and renewal, with its outcome and how long the KV call took), to take
	// a promotion apart. Nil: none.
	Trace *slog.Logger
	// Conn and ServerName, if set, let the master keep the bucket's stream leader off its
	// own NATS server (ServerName): when it leads, the master asks JetStream to move the
	// leadership. A master whose process dies or pauses would otherwise take the lease's
	// Raft leader with it, and the next master could write the lease only after the Raft
	// group elected again (4 to 9 s in nats-server), on top of the TTL. The leadership
	// goes to the server of an in-sync member (the server names are the member names).
	Conn       *nats.Conn
	ServerName string
	// MayLead, if set, accepts the other servers the leadership may go to when no in-sync
	// member's server is a peer of the stream: several replica sets share the bucket, whose
	// peers need not include this set's members. It should accept no set's master (which
	// would move it again) and no member of this set (a deposed master among them).
	MayLead func(server string) bool
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
	leaderCheck time.Time     // when the master last checked who leads the bucket's stream
	kick        chan struct{} // cap 1: SetInSync asks for a renewal now
	stand       standing      // this member's campaign for a lapsed lease
	// outage is when a KV write of this member, or every read of a round, last went
	// unanswered (a timeout, no stream leader): JetStream, not the master, may be why the
	// lease stopped changing. One read attempt does not count: a direct get may go to a
	// paused replica of the stream while the next attempt, and writes, are answered.
	outage time.Time
	// graceRev is the lapsed revision this member gave the master a grace for, once
	// JetStream answered again after an outage, until graceUntil (see campaign).
	graceRev   uint64
	graceUntil time.Time
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
	if o.CandidacyWindow == 0 {
		o.CandidacyWindow = o.RenewInterval / 2
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

// Run keeps the lease until ctx is done: it reads the record every RenewInterval/2 (every
// fastRound while a renewal is late), renews it while this member holds it, and takes it over when it lapsed and this member
// may. It never deletes the record: a stopped master's lease lapses.
func (l *Lease) Run(ctx context.Context) {
	t := time.NewTimer(l.round(time.Now()))
	defer t.Stop()
	wasHeld := false
	for {
		l.step(ctx)
		l.mu.Lock()
		now := time.Now()
		held := l.heldLocked(now)
		if wasHeld && !held {
			l.fenced++
			// since: when Held turned false, which is when writes stopped; this line may
			// come up to a round later, after a KV call that timed out.
			since := l.renewedFrom.Add(l.o.TTL - l.o.FenceMargin)
			if since.After(now) {
				since = now // the lease was taken by another member before it expired
			}
			l.o.Logger.Warn("replica-set lease not renewed in time: fenced, taking no writes", "broker", l.o.BrokerName, "epoch", l.rec.Epoch,
				"since", since.UTC().Format(time.RFC3339Nano))
		}
		wasHeld = held
		st := LeaseState{Leader: l.rec, Known: l.known, Self: held}
		changed := !sameState(st, l.lastState)
		l.lastState = st
		l.mu.Unlock()
		if changed && l.o.OnChange != nil {
			l.o.OnChange(st)
		}
		t.Reset(l.round(time.Now()))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-l.kick:
		}
	}
}

// fastRound is the round while a renewal is late.
const fastRound = 100 * time.Millisecond

// round is the time to the next step: RenewInterval/2, or fastRound (at most) while the
// lease's revision has not changed for a renewal and a half: a lapse is then seen within a
// fast round of TTL, by each member, so that the candidates stand at nearly the same time and
// compare at once, and a master that could not renew retries soon.
func (l *Lease) round(now time.Time) time.Duration {
	d := max(l.o.RenewInterval/2, 10*time.Millisecond)
	l.mu.Lock()
	late := l.known && now.Sub(l.revSeen) >= l.o.RenewInterval+l.o.RenewInterval/2
	l.mu.Unlock()
	if late {
		d = min(d, fastRound)
	}
	return d
}

// readTimeout bounds one attempt of a KV read: a read that an unanswering server holds (a
// direct get may be served by any replica of the stream, a paused one too) is tried again
// on a short deadline, rather than waiting out the step's.
func (l *Lease) readTimeout() time.Duration {
	return max(l.o.RenewInterval/10, 50*time.Millisecond)
}

// get reads key, retrying on short deadlines until ctx ends. ErrKeyNotFound is an answer.
// Each attempt's deadline is twice the last one's (from readTimeout, at most TTL): a server
// that answers, but slower than the first deadline (a stream leader busy catching up, a
// loaded machine), is waited for by a later attempt instead of being cut off every time.
func (l *Lease) get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	attempt := l.readTimeout()
	for {
		actx, cancel := context.WithTimeout(ctx, attempt)
		attempt = min(2*attempt, max(l.o.TTL, l.readTimeout()))
		e, err := l.o.KV.Get(actx, key)
		cancel()
		if err == nil || errors.Is(err, jetstream.ErrKeyNotFound) || ctx.Err() != nil {
			return e, err
		}
		// Not an outage (unanswered): a direct get may go to any replica of the stream,
		// a paused one too, and the next attempt to another.
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// unanswered records that JetStream did not answer a KV write (not a lost race).
func (l *Lease) unanswered(err error) {
	if err == nil || errors.Is(err, jetstream.ErrKeyNotFound) || lostRace(err) {
		return
	}
	l.mu.Lock()
	l.outage = time.Now()
	l.mu.Unlock()
}

// lostRace reports whether err is a compare-and-set that failed because another write came
// first: JetStream's wrong-last-sequence answer, code 10071, or 10164 from replicated
// streams, which nats.go does not map to ErrKeyExists.
func lostRace(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return true
	}
	var api *jetstream.APIError
	return errors.As(err, &api) && (api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// trace logs one step of the lease on LeaseOptions.Trace.
func (l *Lease) trace(msg string, args ...any) {
	if l.o.Trace == nil {
		return
	}
	l.o.Trace.Debug("lease trace: "+msg, append([]any{"broker", l.o.BrokerName, "node", l.o.Node}, args...)...)
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
	e, err := l.get(rctx, l.key)
	if l.o.Trace != nil {
		var rev uint64
		if e != nil {
			rev = e.Revision()
		}
		l.mu.Lock()
		age := now.Sub(l.revSeen)
		l.mu.Unlock()
		l.trace("read", "rev", rev, "age", age, "took", time.Since(now), "err", err)
	}
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
		// Every attempt of the round went unanswered: an outage, unlike one attempt that a
		// paused replica of the stream held.
		l.mu.Lock()
		l.outage = time.Now()
		l.mu.Unlock()
		l.o.Logger.Debug("replica-set lease unreadable", "broker", l.o.BrokerName, "err", err)
		return
	}
	var rec LeaderRecord
	rev := e.Revision()
	l.mu.Lock()
	stale := rev < l.rev
	if stale {
		// A stale read: KV reads are direct gets any stream replica answers, and one that
		// has not caught up (a server that was paused or cut off) serves an older record.
		// Revisions only grow: this member goes on with the newer record it knows, rather
		// than take the old one for a change of master (or renew on its revision, fail,
		// and step down).
		rec, rev = l.rec, l.rev
	}
	l.mu.Unlock()
	if !stale {
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			l.o.Logger.Error("replica-set lease record unreadable", "broker", l.o.BrokerName, "err", err)
			return
		}
	}
	l.mu.Lock()
	if rev != l.rev {
		l.rev, l.revSeen = rev, now
	}
	if l.self && (rec.Node != l.o.Node || rec.Epoch != l.rec.Epoch) {
		l.self = false // another member took over
		l.o.Logger.Warn("replica-set lease taken by another member", "broker", l.o.BrokerName, "node", rec.Node, "epoch", rec.Epoch)
	}
	l.rec, l.known = rec, true
	mine := l.self
	age := now.Sub(l.revSeen)
	lapsed := age >= l.o.TTL
	renewDue := now.Sub(l.renewedFrom) >= l.o.RenewInterval || !slices.Equal(rec.InSync, l.inSync)
	eligible := rec.Node == l.o.Node || slices.Contains(rec.InSync, l.o.Node)
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
		l.moveStreamLeader(rctx, now)
	case !mine && lapsed && eligible:
		l.campaign(ctx, rev, rec, now)
	case !mine && eligible && l.o.Position != nil && age >= l.o.TTL-l.o.RenewInterval/2:
		// Each member times the lapse by its own clock, from its first read of the revision
		// (up to a round apart): one that sees another stand for this revision stands too,
		// so that the candidates compare at once. Its lapse is as good as this member's.
		if c, ok := l.standing(rctx, rec, rev); ok {
			l.trace("another member stands for the lapsed revision: standing too", "rev", rev, "other", c.Node)
			l.campaign(ctx, rev, rec, now)
		}
	}
}

func (l *Lease) record(epoch int64) LeaderRecord {
	var reps []ReplicaLag
	if l.o.Replicas != nil {
		reps = l.o.Replicas() // outside l.mu: it reads the master's state
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return LeaderRecord{BrokerName: l.o.BrokerName, Node: l.o.Node, Epoch: epoch, HAAddr: l.o.HAAddr, Addr: l.o.Addr, GRPCAddr: l.o.GRPCAddr, InSync: slices.Clone(l.inSync), Renewed: time.Now(), Replicas: reps}
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
	wctx, cancel := context.WithTimeout(ctx, l.o.FenceMargin)
	defer cancel()
	var nrev uint64
	if rev == 0 {
		nrev, err = l.o.KV.Create(wctx, l.key, data)
	} else {
		nrev, err = l.o.KV.Update(wctx, l.key, data, rev)
	}
	l.trace("take", "rev", rev, "epoch", rec.Epoch, "took", time.Since(start), "lost_race", lostRace(err), "err", err)
	if err != nil {
		l.unanswered(err)
		if lostRace(err) {
			l.o.Logger.Debug("replica-set lease not taken: another member took it first", "broker", l.o.BrokerName, "err", err)
			return
		}
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
	l.trace("renew", "rev", rev, "took", time.Since(start), "lost_race", lostRace(err), "err", err)
	l.unanswered(err)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		if lostRace(err) {
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

// leaderCheckInterval is how often a master checks that its own NATS server does not lead
// the bucket's stream.
const leaderCheckInterval = 5 * time.Second

// moveStreamLeader asks JetStream to move the bucket stream's leadership away when the
// master's own NATS server holds it (LeaseOptions.Conn), at most every leaderCheckInterval.
func (l *Lease) moveStreamLeader(ctx context.Context, now time.Time) {
	if l.o.Conn == nil || l.o.ServerName == "" || now.Sub(l.leaderCheck) < leaderCheckInterval {
		return
	}
	l.leaderCheck = now
	// The leadership goes to a peer that is current and whose member is in the in-sync set:
	// one that is following, not a deposed master about to cut its log and run again
	// (which would cost the stream the election this move is to avoid). None yet: later.
	l.mu.Lock()
	inSync := slices.Clone(l.inSync)
	l.mu.Unlock()
	prefer := []func(string) bool{func(name string) bool { return slices.Contains(inSync, name) }}
	if l.o.MayLead != nil {
		prefer = append(prefer, l.o.MayLead)
	}
	to, retry := moveLeaderOff(ctx, l.o.Conn, l.o.KV, l.o.ServerName, l.o.Logger, prefer...)
	l.trace("stream leader step-down", "to", to, "retry", retry)
	if retry {
		l.leaderCheck = time.Time{} // look again at the next renewal
	}
	if to != "" {
		l.o.Logger.Info("replica-set lease: moved the lease stream's leader off the master's NATS server", "stream", "KV_"+ReplicaSetsBucket, "server", l.o.ServerName, "to", to)
	}
}

// moveLeaderOff asks JetStream to move the leadership of kv's stream off the server self
// when it holds it, to a current peer the first of prefer that accepts any accepts. It
// returns the peer it moved the leadership to ("" when it did not), and retry when self
// may still lead: no peer fits yet, or JetStream did not answer or refused the move.
func moveLeaderOff(ctx context.Context, nc *nats.Conn, kv jetstream.KeyValue, self string, log *slog.Logger, prefer ...func(server string) bool) (to string, retry bool) {
	st, err := kv.Status(ctx)
	if err != nil {
		log.Debug("stream leader check: bucket status", "bucket", kv.Bucket(), "err", err)
		return "", true
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok || bs.StreamInfo().Cluster == nil || bs.StreamInfo().Cluster.Leader != self || len(bs.StreamInfo().Cluster.Replicas) == 0 {
		return "", false
	}
	preferred := ""
	for _, ok := range prefer {
		for _, p := range bs.StreamInfo().Cluster.Replicas {
			if preferred == "" && p.Current && !p.Offline && ok(p.Name) {
				preferred = p.Name
			}
		}
	}
	if preferred == "" {
		return "", true
	}
	stream := bs.StreamInfo().Config.Name
	req, err := json.Marshal(map[string]any{"placement": map[string]string{"preferred": preferred}})
	if err != nil {
		return "", false
	}
	resp, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, req)
	if err != nil {
		log.Debug("stream leader step-down", "stream", stream, "err", err)
		return "", true
	}
	var r struct {
		Success bool `json:"success"`
		Error   *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if json.Unmarshal(resp.Data, &r) != nil || !r.Success {
		log.Debug("stream leader step-down refused", "stream", stream, "reply", string(resp.Data))
		return "", true
	}
	return preferred, false
}
