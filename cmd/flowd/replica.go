package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/cluster"
	"github.com/flowd-io/flowd/config"
	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/internal/grpcserver"
	"github.com/flowd-io/flowd/internal/replication"
	"github.com/flowd-io/flowd/metrics"
)

// truncateMarker is the file in the data directory that says to cut the commit log back to
// the offset it holds at the next start: a replica whose log diverged from its master's
// writes it and restarts, since the store cannot be cut under a running broker.
const truncateMarker = "replication-truncate"

// replicaSet is the daemon's part of a replica set (docs/cluster.md, "Replica sets"): the
// node's lease in JetStream KV decides whether it is master (it serves its commit log on the
// HA listener and takes sends) or a replica (it follows the master's stream and refuses
// sends). It is the broker's Config.Replication.
type replicaSet struct {
	c      config.Config
	log    *slog.Logger
	node   string
	epochs *replication.EpochFile
	ln     net.Listener // the HA listener, kept for the process's life

	b     *broker.Broker
	lease *cluster.Lease
	// leased is lease once start set it, for the gRPC routes, which are served before.
	leased   atomic.Pointer[cluster.Lease]
	master   atomic.Pointer[replication.Master]
	follower atomic.Pointer[replication.Follower] // the replica's stream, for its lag

	mu       sync.Mutex // transitions
	follow   context.CancelFunc
	followWG sync.WaitGroup
	ctx      context.Context
	cancel   context.CancelFunc
	runWG    sync.WaitGroup
	// restart is signalled when the log diverged: serve stops, then runs the daemon again
	// (reexec), which cuts the log before the store opens.
	restart     chan struct{} // closed once
	restartOnce sync.Once
	// events publishes the set's changes as cluster events (nil: NATS publishes none).
	events func(control.ClusterEvent)
	// sets is every replica set of the cluster as last read (watchSets); readReplica the
	// broker id the master suggests for reads (0: none).
	sets        atomic.Pointer[[]cluster.ReplicaSetState]
	readReplica atomic.Int64
	// leaseStream is the lease bucket's stream as JetStream last answered this node
	// it (watchSets); nil before the first read.
	leaseStream atomic.Pointer[leaseStreamView]
	// refused is why the master refused this replica (nil: it was not): it takes no part,
	// and answers /readyz not ready, until an operator acts.
	refused atomic.Pointer[error]
	// member is the node's cluster member once it joined: told of every lease change, so
	// that the registry names a new master (or none) at once.
	member atomic.Pointer[cluster.Member]
}

// readyCheck is the readiness check of a member: not ready once its master refused it
// (another replica set's log, another segment size), so that nothing routes to a member
// that takes no part.
func (r *replicaSet) readyCheck() metrics.Check {
	return metrics.Check{Name: "replica set", Fn: func(context.Context) error {
		if err := r.refused.Load(); err != nil {
			return fmt.Errorf("%w: %w", *err, metrics.ErrNotReady)
		}
		return nil
	}}
}

// setRole is the replica set as the cluster member asks of it (cluster.ReplicaSetRole).
type setRole struct{ r *replicaSet }

var _ cluster.ReplicaSetRole = setRole{}

// Master implements cluster.ReplicaSetRole: this node while it serves as master and holds
// the lease unfenced.
func (s setRole) Master() (string, int64, bool) {
	r := s.r
	if r.master.Load() == nil || r.lease == nil || !r.lease.Held() {
		return "", 0, false
	}
	rec, ok := r.lease.Leader()
	if !ok || rec.Node != r.node {
		return "", 0, false
	}
	return r.node, rec.Epoch, true
}

// BrokerAddrs implements cluster.ReplicaSetRole: the addresses this node's own routes name.
func (s setRole) BrokerAddrs() map[int64]string { return s.r.BrokerAddrs(s.r.b.Addr()) }

// event publishes one of the replica set's cluster events about this node.
func (r *replicaSet) event(typ, reason string) {
	if r.events != nil {
		r.events(control.ClusterEvent{Type: typ, Time: time.Now(), Broker: r.c.BrokerName, Node: r.node, Addr: r.b.Addr(), Reason: reason})
	}
}

// replicaNode is a replica-set member's name: its broker name and id.
func replicaNode(c config.Config) string {
	return c.BrokerName + "-" + strconv.FormatInt(c.Replication.BrokerID, 10)
}

// openReplicaSet prepares the replica set before the broker opens its store: it cuts the
// log first if a divergence asked for it, opens the epoch file and binds the HA listener.
func openReplicaSet(ctx context.Context, c config.Config, sopts store.Options, log *slog.Logger) (*replicaSet, error) {
	r := &replicaSet{c: c, log: log, node: replicaNode(c)}
	var err error
	if r.epochs, err = replication.OpenEpochFile(filepath.Join(c.DataDir, replication.EpochFileName)); err != nil {
		return nil, fmt.Errorf("serve: replication: %w", err)
	}
	if err := r.applyTruncation(sopts); err != nil {
		return nil, err
	}
	if r.ln, err = listen(ctx, addrSetting{what: "replica-set stream", key: "listen.ha", addr: c.Listen.HA}); err != nil {
		return nil, err
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.restart = make(chan struct{})
	return r, nil
}

// applyTruncation cuts the store and the epoch history back to a pending marker's offset.
func (r *replicaSet) applyTruncation(sopts store.Options) error {
	path := filepath.Join(r.c.DataDir, truncateMarker)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("serve: replication: %w", err)
	}
	off, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return fmt.Errorf("serve: replication: %s holds %q, not an offset: %w", path, b, err)
	}
	if err := store.Truncate(filepath.Join(r.c.DataDir, "store"), off, sopts); err != nil {
		return fmt.Errorf("serve: replication: cut the diverged log: %w", err)
	}
	if err := r.epochs.TruncateTo(off); err != nil {
		return fmt.Errorf("serve: replication: %w", err)
	}
	r.log.Warn("replica set: the commit log was cut back to where it agrees with the master's", "offset", off)
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("serve: replication: %w", err)
	}
	return nil
}

// haAddr is the address replicas dial: replication.ha_advertise, else the listener's, with
// the broker's host when it is bound to every interface.
func (r *replicaSet) haAddr() string {
	if a := r.c.Replication.HAAdvertise; a != "" {
		return a
	}
	a := r.ln.Addr().(*net.TCPAddr)
	if !a.IP.IsUnspecified() {
		return a.String()
	}
	host, _, err := net.SplitHostPort(r.b.Addr())
	if err != nil {
		return a.String()
	}
	return net.JoinHostPort(host, strconv.Itoa(a.Port))
}

// start runs the lease over the cluster's JetStream once the broker serves.
func (r *replicaSet) start(ctx context.Context, b *broker.Broker, nc *nats.Conn, replicas int, grpcAddr string, events func(control.ClusterEvent)) error {
	r.b, r.events = b, events
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("serve: replication: %w", err)
	}
	kvctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	kv, err := cluster.OpenReplicaSets(kvctx, js, replicas)
	if err != nil {
		return fmt.Errorf("serve: replication: %w", err)
	}
	rc := r.c.Replication
	// With the NATS server embedded, the master's death takes that server with it: the
	// lease keeps the bucket's Raft leader elsewhere (LeaseOptions.ServerName).
	serverName := ""
	if r.c.NATS.Cluster.Listen != "" {
		serverName, _ = natsCluster(r.c)
	}
	var position func() cluster.LogPosition // nil: the first eligible member takes a lapsed lease
	if rc.ElectLongestLog {
		position = func() cluster.LogPosition {
			end, _ := b.Store().Positions() // written: what a sync send's acknowledgement counts
			return cluster.LogPosition{Epoch: r.epochs.Last().Epoch, End: end}
		}
	}
	var trace *slog.Logger
	if os.Getenv("FLOWD_LEASE_TRACE") == "1" {
		trace = slog.New(debugHandler{r.log.Handler()})
	}
	r.lease = cluster.NewLease(cluster.LeaseOptions{
		KV: kv, BrokerName: r.c.BrokerName, Node: r.node, HAAddr: r.haAddr(), Addr: b.Addr(), GRPCAddr: grpcAddr,
		MayBootstrap: rc.BrokerID == 1, LastEpoch: r.epochs.Last().Epoch, TTL: rc.LeaseTTL, Position: position,
		Healthy:  func() bool { return b.StoreStats().WriteFailure == nil },
		OnChange: r.onLease, Replicas: r.replicaLags, Logger: r.log, Trace: trace, Conn: nc, ServerName: serverName, MayLead: r.mayLeadLeases,
	})
	r.leased.Store(r.lease)
	r.runWG.Go(func() { r.lease.Run(r.ctx) })
	r.runWG.Go(func() { r.watchSets(r.ctx, kv) })
	r.log.Info("replica set: member started", "broker", r.c.BrokerName, "node", r.node, "mode", rc.Mode, "ha", r.haAddr())
	return nil
}

// mayLeadLeases accepts, as the leases' stream leader, a NATS server of no replica set's
// master and of no member of this set, as last read (watchSets): with several sets, the
// stream's peers may include none of this set's in-sync members.
func (r *replicaSet) mayLeadLeases(server string) bool {
	p := r.sets.Load()
	if p == nil {
		return false
	}
	for _, s := range *p {
		if s.Leader != nil && s.Leader.Node == server {
			return false
		}
		for _, mem := range s.Members {
			if mem.Node == server && s.BrokerName == r.c.BrokerName {
				return false
			}
		}
	}
	return true
}

// close stops the lease (it lapses: another member takes over), the master or follower,
// and the HA listener.
func (r *replicaSet) close(context.Context) error {
	r.cancel()
	r.runWG.Wait()
	r.mu.Lock()
	r.stopFollowLocked()
	if m := r.master.Swap(nil); m != nil {
		m.Close()
	}
	r.mu.Unlock()
	return r.ln.Close()
}

// stats is the member's state for the metrics, from memory.
func (r *replicaSet) stats() metrics.ReplicaSetStats {
	st := metrics.ReplicaSetStats{Epoch: r.epochs.Last().Epoch}
	if r.lease != nil {
		st.Elections, st.Fenced = r.lease.Counts()
	}
	if m := r.master.Load(); m != nil {
		st.Master = r.lease != nil && r.lease.Held()
		for _, rep := range m.Replicas() {
			st.Replicas = append(st.Replicas, metrics.ReplicaLag{Node: rep.Node, LagBytes: rep.LagBytes, LagTime: rep.LagTime, InSync: rep.InSync})
		}
	} else if f := r.follower.Load(); f != nil {
		st.LagBytes = f.LagBytes()
	}
	if v := r.leaseStream.Load(); v != nil {
		st.LeaseStreamKnown, st.LeaseStreamWhole = true, v.err == nil && v.h.Whole()
	}
	return st
}

// Writable implements broker.Replication.
func (r *replicaSet) Writable() error {
	m := r.master.Load()
	if m == nil || r.lease == nil || !r.lease.Held() {
		return fmt.Errorf("%s is a replica of %s (or its lease lapsed): %w", r.node, r.c.BrokerName, broker.ErrNotMaster)
	}
	if n := m.InSyncCount() + 1; r.Sync() && n < r.c.Replication.MinInSync {
		return fmt.Errorf("%d of %d required members in sync: %w", n, r.c.Replication.MinInSync, broker.ErrNotEnoughInSync)
	}
	return nil
}

// Sync implements broker.Replication.
func (r *replicaSet) Sync() bool { return r.c.Replication.Mode == "sync" }

// Await implements broker.Replication.
func (r *replicaSet) Await(end int64, deadline time.Time, done func(error)) {
	m := r.master.Load()
	if m == nil {
		done(broker.ErrNotMaster)
		return
	}
	m.Await(end, deadline, done)
}

var _ grpcserver.ReplicaSet = (*replicaSet)(nil)

// GRPCMaster implements grpcserver.ReplicaSet: on a replica, the gRPC address of the master
// the lease names, so that 5.x clients send and receive there.
func (r *replicaSet) GRPCMaster() (string, bool) {
	l := r.leased.Load()
	if l == nil || r.master.Load() != nil {
		return "", false
	}
	if rec, ok := l.Leader(); ok && rec.Node != r.node && rec.GRPCAddr != "" {
		return rec.GRPCAddr, true
	}
	return "", false
}

// onLease moves the node between master and replica as the lease says. It runs on the
// lease's goroutine.
func (r *replicaSet) onLease(st cluster.LeaseState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch m := r.master.Load(); {
	case st.Self && m == nil:
		r.promoteLocked(st.Leader.Epoch)
	case !st.Self && m != nil:
		r.master.Store(nil)
		m.Close()
		reason := "fenced: the lease was not renewed in time"
		if st.Leader.Node != r.node {
			reason = fmt.Sprintf("%s holds the lease, epoch %d", st.Leader.Node, st.Leader.Epoch)
		}
		r.log.Warn("replica set: stepped down", "broker", r.c.BrokerName, "node", r.node, "epoch", m.Epoch(), "leader", st.Leader.Node, "reason", reason)
		r.event(control.EventClusterReplicaSteppedDown, reason)
	}
	if !st.Self && st.Known && st.Leader.Node != r.node && r.follow == nil {
		r.startFollowLocked()
	}
	if m := r.member.Load(); m != nil {
		m.Refresh()
	}
}

func (r *replicaSet) promoteLocked(epoch int64) {
	r.stopFollowLocked()
	rc := r.c.Replication
	// The previous master of this process woke its Accept with a deadline.
	if err := r.ln.(*net.TCPListener).SetDeadline(time.Time{}); err != nil {
		r.log.Error("replica set: HA listener", "err", err)
	}
	m, err := replication.StartMaster(keepOpen{r.ln.(*net.TCPListener)}, replication.MasterConfig{
		Store: r.b.Store(), Epochs: r.epochs, Epoch: epoch, Cluster: r.c.Cluster, BrokerName: r.c.BrokerName,
		Sync: r.Sync(), MinInSync: rc.MinInSync, MaxLagBytes: int64(rc.MaxLag), MaxLagTime: rc.MaxLagTime, AsyncPace: rc.AsyncPace,
		Snapshots: r.snapshots, Logger: r.log,
		OnInSyncChange: func(nodes []string) {
			r.lease.SetInSync(nodes)
			r.event(control.EventClusterReplicaInSync, strings.Join(nodes, ","))
		},
	})
	if err != nil {
		r.log.Error("replica set: cannot serve as master; taking no sends", "err", err)
		return
	}
	if err := r.b.Promoted(r.ctx); err != nil {
		r.log.Error("replica set: promoted without its pending transactions", "err", err)
	}
	r.master.Store(m)
	r.log.Info("replica set: this node is master", "broker", r.c.BrokerName, "node", r.node, "epoch", epoch)
	r.event(control.EventClusterReplicaMaster, fmt.Sprintf("epoch %d", epoch))
}

func (r *replicaSet) snapshots() map[string][]byte {
	out := map[string][]byte{}
	if b, err := r.b.OffsetsSnapshot(); err == nil {
		out["offsets"] = b
	}
	if b, err := r.b.TopicsSnapshot(); err == nil {
		out["topics"] = b
	}
	if b, err := r.b.GroupsSnapshot(); err == nil {
		out["groups"] = b
	}
	if b, err := r.b.PopSnapshot(); err == nil {
		out["pop"] = b
	}
	return out
}

func (r *replicaSet) startFollowLocked() {
	ctx, cancel := context.WithCancel(r.ctx)
	r.follow = cancel
	f := replication.NewFollower(replication.ReplicaConfig{
		Store: r.b.Store(), Epochs: r.epochs, Cluster: r.c.Cluster, BrokerName: r.c.BrokerName, Node: r.node,
		Master: func() string {
			if rec, ok := r.lease.Leader(); ok && rec.Node != r.node {
				return rec.HAAddr
			}
			return ""
		},
		OnSnapshot: func(name string, data []byte) {
			var err error
			switch name {
			case "offsets", "pop": // pop progress lands in the offset table: see PopSnapshot
				err = r.b.MergeOffsets(data)
			case "topics":
				err = r.b.MergeTopics(data)
			case "groups":
				err = r.b.MergeGroups(data)
			}
			if err != nil {
				r.log.Warn("replica set: snapshot not applied", "name", name, "err", err)
			}
		},
		Logger: r.log,
	})
	r.follower.Store(f)
	r.followWG.Go(func() {
		err := f.Run(ctx)
		var div *replication.DivergedError
		switch {
		case errors.As(err, &div):
			r.diverged(div)
		case errors.Is(err, replication.ErrRefused):
			r.refused.Store(&err)
			r.log.Error("replica set: the master refused this replica; it takes no part until an operator acts", "err", err,
				"set", r.epochs.Identity().String())
		}
	})
}

func (r *replicaSet) stopFollowLocked() {
	if r.follow != nil {
		r.follow()
		r.follow = nil
		r.followWG.Wait()
	}
}

// diverged records the cut and has the daemon restart, to cut the log before it opens.
func (r *replicaSet) diverged(div *replication.DivergedError) {
	path := filepath.Join(r.c.DataDir, truncateMarker)
	if err := os.WriteFile(path, []byte(strconv.FormatInt(div.TruncateTo, 10)+"\n"), 0o644); err != nil {
		r.log.Error("replica set: cannot record the cut of the diverged log", "err", err)
		return
	}
	r.log.Warn("replica set: this node's log holds records its master never had (a deposed master's tail); restarting to cut it",
		"end", div.End, "cut_to", div.TruncateTo)
	r.restartOnce.Do(func() { close(r.restart) })
}

// reexec runs this flowd again in the place of the process (same pid, arguments and
// environment), once serve stopped every part: the way a replica cuts its diverged log.
func reexec() error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	return fmt.Errorf("restart %s: %w", exe, syscall.Exec(exe, os.Args, os.Environ()))
}

// debugHandler logs its records whatever the daemon's log level: the lease's trace
// (FLOWD_LEASE_TRACE=1), debug lines asked for without the daemon's other debug lines.
type debugHandler struct{ slog.Handler }

func (debugHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h debugHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return debugHandler{h.Handler.WithAttrs(as)}
}

func (h debugHandler) WithGroup(name string) slog.Handler {
	return debugHandler{h.Handler.WithGroup(name)}
}

// keepOpen is the HA listener as a Master sees it: its Close only wakes the Master's
// Accept (a deadline), so that the next Master of this process accepts on the same address.
type keepOpen struct{ *net.TCPListener }

func (k keepOpen) Close() error { return k.SetDeadline(time.Now()) }
