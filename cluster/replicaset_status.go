package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ReplicaMember is a replica-set member's entry in ReplicaSetsBucket, key
// member.<broker name>.<broker id>: where its broker listens, so that routes can name a
// replica by its id and cluster.status can list the set. Each member writes its own at start.
type ReplicaMember struct {
	BrokerName string    `json:"broker_name"`
	Node       string    `json:"node"`
	BrokerID   int64     `json:"broker_id"`
	Addr       string    `json:"addr"`
	HAAddr     string    `json:"ha_addr"`
	Started    time.Time `json:"started"`
}

// ReplicaLag is what the master publishes in its lease of one replica connected to it.
type ReplicaLag struct {
	Node     string `json:"node"`
	InSync   bool   `json:"in_sync"`
	LagBytes int64  `json:"lag_bytes"`
	// LagMillis is how long ago the replica was last within max_lag of the master's end.
	LagMillis int64 `json:"lag_ms"`
}

// ReplicaSetState is one replica set as ReplicaSetsBucket holds it: its lease (absent
// before a master was ever elected) and its members' entries, by broker id.
type ReplicaSetState struct {
	BrokerName string
	Leader     *LeaderRecord
	Members    []ReplicaMember
}

func memberKey(brokerName string, id int64) string {
	return fmt.Sprintf("member.%s.%d", brokerName, id)
}

// PutReplicaMember writes (or replaces) a member's entry.
func PutReplicaMember(ctx context.Context, kv jetstream.KeyValue, m ReplicaMember) error {
	data, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("cluster: encode replica member %s: %w", m.Node, err)
	}
	if _, err := kv.Put(ctx, memberKey(m.BrokerName, m.BrokerID), data); err != nil {
		return fmt.Errorf("cluster: write replica member %s: %w", m.Node, err)
	}
	return nil
}

// ReadReplicaSets reads every replica set of the bucket, sorted by broker name, members by id.
func ReadReplicaSets(ctx context.Context, kv jetstream.KeyValue) ([]ReplicaSetState, error) {
	keys, err := kv.ListKeys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: list replica sets: %w", err)
	}
	defer func() { _ = keys.Stop() }()
	sets := map[string]*ReplicaSetState{}
	set := func(name string) *ReplicaSetState {
		if sets[name] == nil {
			sets[name] = &ReplicaSetState{BrokerName: name}
		}
		return sets[name]
	}
	for key := range keys.Keys() {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("cluster: read %q: %w", key, err)
		}
		switch {
		case strings.HasPrefix(key, "leader."):
			var rec LeaderRecord
			if json.Unmarshal(e.Value(), &rec) == nil {
				set(rec.BrokerName).Leader = &rec
			}
		case strings.HasPrefix(key, "member."):
			var m ReplicaMember
			if json.Unmarshal(e.Value(), &m) == nil {
				s := set(m.BrokerName)
				s.Members = append(s.Members, m)
			}
		}
	}
	out := make([]ReplicaSetState, 0, len(sets))
	for _, s := range sets {
		slices.SortFunc(s.Members, func(a, b ReplicaMember) int { return cmp.Compare(a.BrokerID, b.BrokerID) })
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b ReplicaSetState) int { return cmp.Compare(a.BrokerName, b.BrokerName) })
	return out, nil
}

// StreamHealth is a JetStream stream's Raft group as JetStream reports it: the lease
// bucket's (ReadLeaseStreamHealth), whose writes renewals and elections are.
type StreamHealth struct {
	// Clustered is false for a stream of a single server (no Raft group): Leader and
	// Replicas are then empty and the stream is whole while it answers.
	Clustered bool
	// Leader is the server leading the group; empty while it has none.
	Leader string
	// Replicas are the other servers of the group.
	Replicas []StreamPeer
}

// StreamPeer is a follower of a stream's Raft group.
type StreamPeer struct {
	Name string
	// Current: the follower has what the leader committed; Offline: its server is known
	// to be gone.
	Current, Offline bool
	// Active is how long ago the leader last heard from it.
	Active time.Duration
	// Lag is how many entries it is behind.
	Lag uint64
}

// MaxFollowerSilence is how long a follower may go unheard and still count in a whole stream:
// the group's heartbeats come every second, and JetStream itself marks a silent follower
// not current only after ten.
const MaxFollowerSilence = 3 * time.Second

// MaxFollowerLag is how many entries a follower heard from recently may be behind and still
// count in a whole stream: the leader counts a follower current only with nothing left to
// send it, and under steady renewals one is often sampled an entry or two behind.
const MaxFollowerLag = 8

// Whole reports whether the stream has a leader and every follower is online, heard from
// within three heartbeats and current (or at most MaxFollowerLag entries behind): then it
// can lose any one server of three and still take writes. A set whose lease stream is not whole depends on every member it has left.
func (h StreamHealth) Whole() bool {
	if !h.Clustered {
		return true
	}
	if h.Leader == "" {
		return false
	}
	for _, p := range h.Replicas {
		if p.Offline || p.Active > MaxFollowerSilence || !p.Current && p.Lag > MaxFollowerLag {
			return false
		}
	}
	return true
}

// ReadLeaseStreamHealth reads the Raft group of kv's stream (ReplicaSetsBucket) as the
// stream's leader reports it (JetStream lets the leader answer a stream's info, and a member
// of the group when it has none: then Leader is empty and the stream not whole). Every member
// that reaches the leader reads the same view; one that cannot gets an error.
func ReadLeaseStreamHealth(ctx context.Context, kv jetstream.KeyValue) (StreamHealth, error) {
	st, err := kv.Status(ctx)
	if err != nil {
		return StreamHealth{}, fmt.Errorf("cluster: read the lease stream's state: %w", err)
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return StreamHealth{}, fmt.Errorf("cluster: read the lease stream's state: a bucket status of type %T", st)
	}
	ci := bs.StreamInfo().Cluster
	if ci == nil || len(ci.Replicas) == 0 && bs.StreamInfo().Config.Replicas <= 1 {
		return StreamHealth{}, nil
	}
	h := StreamHealth{Clustered: true, Leader: ci.Leader}
	for _, p := range ci.Replicas {
		h.Replicas = append(h.Replicas, StreamPeer{Name: p.Name, Current: p.Current, Offline: p.Offline, Active: p.Active, Lag: p.Lag})
	}
	slices.SortFunc(h.Replicas, func(a, b StreamPeer) int { return cmp.Compare(a.Name, b.Name) })
	return h, nil
}
