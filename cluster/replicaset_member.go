package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ReplicaSetRole is what the Member of a replica set's node asks of its set
// (Options.ReplicaSet). Implementations must be safe for concurrent use and must not
// block: the member asks on its heartbeat and its topic and group loops.
type ReplicaSetRole interface {
	// Master reports whether this node is its set's master now: it holds the lease and is
	// not fenced; node is its member name (<broker name>-<broker id>), epoch the lease's.
	Master() (node string, epoch int64, ok bool)
	// BrokerAddrs are the set's remoting addresses as its routes name them: the master's as
	// broker id 0 and each in-sync replica's by its broker id.
	BrokerAddrs() map[int64]string
}

// errSuperseded: the registry holds the entry of a master of this replica set in a newer
// epoch (or another master of this one), which this member never replaces.
var errSuperseded = errors.New("the registry names a newer master of this replica set")

// Refresh asks the member to act on a change of its replica set at once rather than at its
// next heartbeat: to register the broker (this node became master), rewrite its entry (the
// in-sync set changed) or withdraw it (this node stepped down or fenced), and to share the
// broker's topics and groups once master. A plain broker's member ignores it.
func (m *Member) Refresh() {
	if m.opts.ReplicaSet == nil {
		return
	}
	for _, ch := range []chan struct{}{m.beatNow, m.topicsNow, m.groupsNow} {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// sharing reports whether the member writes the broker's topics and groups to the cluster:
// always for a plain broker, only while master for a replica set's node (the replicas' tables
// are copies of the master's).
func (m *Member) sharing() bool {
	if m.opts.ReplicaSet == nil {
		return true
	}
	_, _, ok := m.opts.ReplicaSet.Master()
	return ok
}

// beatSet is a replica-set node's heartbeat: the master registers (or rewrites) the set's
// entry, a node that is no longer master withdraws the entry it wrote.
func (m *Member) beatSet(ctx context.Context) error {
	_, _, master := m.opts.ReplicaSet.Master()
	switch {
	case master && m.rev == 0:
		rev, err := m.register(ctx, m.brokersKV)
		if errors.Is(err, ErrNameTaken) {
			m.emit(Event{Type: NameTaken, Time: time.Now(), Broker: m.selfInfo(), Reason: err.Error()})
		}
		if err != nil {
			return err
		}
		m.rev = rev
		node, epoch, _ := m.opts.ReplicaSet.Master()
		m.log.Info("cluster: registered as the replica set's master", "broker", m.name, "master", node, "epoch", epoch)
		return nil
	case master:
		err := m.beat(ctx)
		if err == nil {
			m.moveRegistryLeader(ctx)
		}
		return err
	case m.rev != 0:
		return m.withdraw(ctx)
	}
	return nil
}

// withdraw deletes the entry this member wrote, on its revision: one a newer master
// replaced stays.
func (m *Member) withdraw(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, m.opts.RequestTimeout)
	defer cancel()
	rev := m.rev
	m.rev = 0
	err := m.brokersKV.Delete(cctx, encodeKey(m.name), jetstream.LastRevision(rev))
	switch {
	case err == nil:
		m.log.Info("cluster: no longer the replica set's master: registry entry withdrawn", "broker", m.name)
	case errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyNotFound):
		// Replaced by the next master, or expired: nothing of this member's is left.
	default:
		// It expires within the TTL, or the next master replaces it sooner.
		return fmt.Errorf("withdraw the registry entry of a master that stepped down: %w", err)
	}
	return nil
}

// replaces reports whether self, a replica-set master's entry, may replace other, the entry
// its broker name holds: one of the same set in an older epoch (its previous master, still
// listed until its entry expires), or this master's own. A live entry of a newer epoch, of
// another master in this epoch, or of a plain broker, is not replaced.
func replaces(self, other BrokerInfo) (bool, error) {
	if self.Epoch == 0 || other.Epoch == 0 || other.Cluster != self.Cluster {
		return false, nil
	}
	if other.Epoch > self.Epoch || (other.Epoch == self.Epoch && other.Master != self.Master) {
		return false, fmt.Errorf("cluster: register broker %q: %w: %s in epoch %d (this node, %s, is master in epoch %d)",
			self.Name, errSuperseded, other.Master, other.Epoch, self.Master, self.Epoch)
	}
	return true, nil
}

// setInfo adds a replica set's part to the master's registry entry.
func (m *Member) setInfo(bi *BrokerInfo) {
	node, epoch, ok := m.opts.ReplicaSet.Master()
	if !ok {
		return
	}
	bi.Master, bi.Epoch = node, epoch
	bi.Addrs = maps.Clone(m.opts.ReplicaSet.BrokerAddrs())
	if bi.Addrs == nil {
		bi.Addrs = map[int64]string{}
	}
	bi.Addrs[0] = bi.Addr
}

// moveRegistryLeader moves the registry stream's leadership off this master's NATS server
// (Options.ServerName), at most every leaderCheckInterval, to a server that hosts no master
// of the registry: a master's death then costs the registry no Raft election.
func (m *Member) moveRegistryLeader(ctx context.Context) {
	now := time.Now()
	if m.opts.ServerName == "" || now.Sub(m.leaderCheck) < leaderCheckInterval {
		return
	}
	m.leaderCheck = now
	masters := map[string]bool{}
	for _, bi := range m.Registry() {
		masters[bi.Master] = true
	}
	cctx, cancel := context.WithTimeout(ctx, m.opts.RequestTimeout)
	defer cancel()
	to, retry := moveLeaderOff(cctx, m.opts.Conn, m.brokersKV, m.opts.ServerName, m.log, func(name string) bool { return !masters[name] })
	if retry {
		m.leaderCheck = time.Time{}
	}
	if to != "" {
		m.log.Info("cluster: moved the registry stream's leader off the replica-set master's NATS server", "bucket", m.opts.BrokersBucket,
			"server", m.opts.ServerName, "to", to)
	}
}
