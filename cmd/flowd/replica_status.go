package main

import (
	"context"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/cluster"
	"github.com/flowd-io/flowd/control"
)

// watchSets publishes this member's entry in the replica-sets bucket, then reads every set
// of the bucket each lease TTL into r.sets: the routes name the in-sync replicas by their
// ids from it, the master picks the replica it suggests for reads, and cluster.status
// shows every set, all from memory.
func (r *replicaSet) watchSets(ctx context.Context, kv jetstream.KeyValue) {
	self := cluster.ReplicaMember{
		BrokerName: r.c.BrokerName, Node: r.node, BrokerID: r.c.Replication.BrokerID,
		Addr: r.b.Addr(), HAAddr: r.haAddr(), Started: time.Now().UTC(),
	}
	every := max(r.c.Replication.LeaseTTL, 100*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	published := false
	for {
		rctx, cancel := context.WithTimeout(ctx, every)
		if !published {
			err := cluster.PutReplicaMember(rctx, kv, self)
			published = err == nil
			if err != nil {
				r.log.Warn("replica set: member entry not written; retrying", "err", err)
			}
		}
		sets, err := cluster.ReadReplicaSets(rctx, kv)
		if err == nil {
			r.sets.Store(&sets)
			r.readReplica.Store(r.pickReadReplica(sets))
		} else if ctx.Err() == nil {
			r.log.Debug("replica set: replica sets unreadable", "err", err)
		}
		cancel()
		// A read of its own: a held read of the sets must not make the stream look broken.
		hctx, hcancel := context.WithTimeout(ctx, every)
		h, err := cluster.ReadLeaseStreamHealth(hctx, kv)
		hcancel()
		if ctx.Err() == nil {
			r.leaseStream.Store(&leaseStreamView{h: h, err: err, at: time.Now()})
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// leaseStreamView is the lease bucket's stream as JetStream answered this node at
// a time, or why it could not be read (then it is not whole: no write of the lease would
// be answered either).
type leaseStreamView struct {
	h   cluster.StreamHealth
	err error
	at  time.Time
}

// control is the view for cluster.status.
func (v *leaseStreamView) control(node string) *control.ClusterLeaseStream {
	out := &control.ClusterLeaseStream{ReadBy: node, Whole: v.err == nil && v.h.Whole(), Read: v.at.UTC(), Leader: v.h.Leader}
	if v.err != nil {
		out.Error = v.err.Error()
	}
	for _, p := range v.h.Replicas {
		out.Replicas = append(out.Replicas, control.ClusterStreamPeer{Name: p.Name, Current: p.Current, Offline: p.Offline,
			ActiveMillis: p.Active.Milliseconds(), Lag: p.Lag})
	}
	return out
}

// ownMembers is this set's members as last read, by broker id.
func (r *replicaSet) ownMembers() []cluster.ReplicaMember {
	p := r.sets.Load()
	if p == nil {
		return nil
	}
	for _, s := range *p {
		if s.BrokerName == r.c.BrokerName {
			return s.Members
		}
	}
	return nil
}

// pickReadReplica is the in-sync replica, lowest broker id first, that the master
// suggests for pulls of old messages; 0 when this node is not master or none is in sync.
func (r *replicaSet) pickReadReplica(sets []cluster.ReplicaSetState) int64 {
	m := r.master.Load()
	if m == nil {
		return 0
	}
	var inSync []string
	for _, rep := range m.Replicas() {
		if rep.InSync {
			inSync = append(inSync, rep.Node)
		}
	}
	for _, s := range sets {
		if s.BrokerName != r.c.BrokerName {
			continue
		}
		for _, mem := range s.Members { // sorted by id
			if mem.Node != r.node && mem.Addr != "" && slices.Contains(inSync, mem.Node) {
				return mem.BrokerID
			}
		}
	}
	return 0
}

// ReadReplica implements broker.ReplicaReads.
func (r *replicaSet) ReadReplica() (int64, bool) {
	if r.master.Load() == nil {
		return 0, false
	}
	id := r.readReplica.Load()
	return id, id > 0
}

// BrokerID implements broker.ReplicaReads.
func (r *replicaSet) BrokerID() int64 { return r.c.Replication.BrokerID }

var _ broker.ReplicaReads = (*replicaSet)(nil)

// BrokerAddrs implements broker.ReplicaAddrs: the master as broker id 0 and the replicas of
// the lease's in-sync set by their ids, and this node by its id when it is a replica (so a
// client it answers can reach it even while it catches up).
func (r *replicaSet) BrokerAddrs(self string) map[int64]string {
	out := map[int64]string{}
	if r.master.Load() != nil {
		out[0] = self
	} else {
		out[r.c.Replication.BrokerID] = self
	}
	if r.lease == nil {
		return out
	}
	rec, ok := r.lease.Leader()
	if !ok {
		return out
	}
	if rec.Node != r.node && rec.Addr != "" {
		out[0] = rec.Addr
	}
	for _, mem := range r.ownMembers() {
		if mem.Node != r.node && mem.Node != rec.Node && mem.Addr != "" && slices.Contains(rec.InSync, mem.Node) {
			out[mem.BrokerID] = mem.Addr
		}
	}
	return out
}

// replicaLags is the master's view of its replicas, published in its lease.
func (r *replicaSet) replicaLags() []cluster.ReplicaLag {
	m := r.master.Load()
	if m == nil {
		return nil
	}
	var out []cluster.ReplicaLag
	for _, rep := range m.Replicas() {
		out = append(out, cluster.ReplicaLag{Node: rep.Node, InSync: rep.InSync, LagBytes: rep.LagBytes, LagMillis: rep.LagTime.Milliseconds()})
	}
	return out
}

// replicaSetsView is every replica set of the cluster for cluster.status: each member by
// broker id, the master and epoch from the lease, in-sync flags and lag from what the
// master published with its last renewal.
func (r *replicaSet) replicaSetsView() []control.ClusterReplicaSet {
	p := r.sets.Load()
	if p == nil {
		return nil
	}
	out := make([]control.ClusterReplicaSet, 0, len(*p))
	for _, s := range *p {
		v := control.ClusterReplicaSet{BrokerName: s.BrokerName, Members: []control.ClusterReplicaMember{}}
		lags := map[string]cluster.ReplicaLag{}
		if s.Leader != nil {
			v.Master, v.Epoch, v.InSync = s.Leader.Node, s.Leader.Epoch, slices.Clone(s.Leader.InSync)
			renewed := s.Leader.Renewed.UTC()
			v.Renewed = &renewed
			for _, l := range s.Leader.Replicas {
				lags[l.Node] = l
			}
		}
		for _, mem := range s.Members {
			cm := control.ClusterReplicaMember{Node: mem.Node, BrokerID: mem.BrokerID, Addr: mem.Addr, HAAddr: mem.HAAddr}
			switch l, ok := lags[mem.Node]; {
			case mem.Node == v.Master:
				cm.Role, cm.InSync = "master", true
			case ok:
				cm.Role, cm.InSync, cm.Connected = "replica", slices.Contains(v.InSync, mem.Node), true
				cm.LagBytes, cm.LagMillis = l.LagBytes, l.LagMillis
			default:
				cm.Role = "replica"
			}
			v.Members = append(v.Members, cm)
		}
		if ls := r.leaseStream.Load(); ls != nil && s.BrokerName == r.c.BrokerName {
			v.LeaseStream = ls.control(r.node)
		}
		out = append(out, v)
	}
	return out
}
