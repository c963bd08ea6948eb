package cluster_test

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/cluster"
	"github.com/flowd-io/flowd/protocol"
)

// fakeSet is a replica set's node as its member sees it: whether it is master, in which
// epoch, and the set's addresses by broker id. The tests move the lease by hand.
type fakeSet struct {
	mu     sync.Mutex
	node   string
	epoch  int64
	master bool
	addrs  map[int64]string
}

func (f *fakeSet) Master() (string, int64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.node, f.epoch, f.master
}

func (f *fakeSet) BrokerAddrs() map[int64]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.addrs)
}

func (f *fakeSet) set(master bool, epoch int64, addrs map[int64]string) {
	f.mu.Lock()
	f.master, f.epoch, f.addrs = master, epoch, addrs
	f.mu.Unlock()
}

// setNode is one member of a replica set: its broker, its member and its role.
type setNode struct {
	*node
	role *fakeSet
}

// startSet starts the members of a replica set named name (broker ids 1..n), none master.
func startSet(t *testing.T, s *natsserver.Server, name string, n int) []*setNode {
	t.Helper()
	out := make([]*setNode, n)
	for i := range out {
		role := &fakeSet{node: name + "-" + string(rune('1'+i))}
		out[i] = &setNode{node: startNode(t, s, name, func(o *cluster.Options) { o.ReplicaSet = role }), role: role}
	}
	return out
}

// promote makes member i master in epoch, with the set's other members as in-sync replicas
// (broker ids from 1), and tells its member at once, as the daemon does on a lease change.
func promote(set []*setNode, i int, epoch int64) {
	addrs := map[int64]string{}
	for j, n := range set {
		if j != i {
			addrs[int64(j+1)] = n.b.Addr()
		}
	}
	set[i].role.set(true, epoch, addrs)
	set[i].m.Refresh()
}

// stepDown makes member i a replica.
func stepDown(set []*setNode, i int) {
	set[i].role.set(false, 0, nil)
	set[i].m.Refresh()
}

// entry is the registry's entry for a broker name in n's watched copy.
func entry(n *node, name string) (cluster.BrokerInfo, bool) {
	for _, bi := range n.m.Registry() {
		if bi.Name == name {
			return bi, true
		}
	}
	return cluster.BrokerInfo{}, false
}

// TestReplicaSetsShareOneRegistryAndEveryRouteListsThem: two replica sets of two members
// and a plain broker in one NATS: the registry holds one entry per broker name (each set's
// master with its replica by id, the replicas not as brokers of their own); a topic created
// on one set's master is on every broker, replicas included, and every node's route lists
// every broker name with the master as 0 and the in-sync replica by its id; a group created
// on the plain broker reaches both sets; a replica's own topic is not shared until it is
// master.
func TestReplicaSetsShareOneRegistryAndEveryRouteListsThem(t *testing.T) {
	s := startNATS(t, false)
	a := startSet(t, s, "set-a", 2)
	b := startSet(t, s, "set-b", 2)
	c := startNode(t, s, "plain-c", nil)
	promote(a, 0, 1)
	promote(b, 0, 1)
	all := []*node{a[0].node, a[1].node, b[0].node, b[1].node, c}
	for _, n := range all {
		eventuallyTrue(t, "every node lists both sets and the plain broker", func() bool {
			_, okA := entry(n, "set-a")
			_, okB := entry(n, "set-b")
			return len(n.m.Registry()) == 3 && okA && okB
		})
	}
	ea, _ := entry(c, "set-a")
	assert.Equal(t, a[0].b.Addr(), ea.Addr)
	assert.Equal(t, "set-a-1", ea.Master)
	assert.EqualValues(t, 1, ea.Epoch)
	assert.Equal(t, map[int64]string{0: a[0].b.Addr(), 2: a[1].b.Addr()}, ea.Addrs)

	require.NoError(t, a[0].b.CreateTopic(broker.TopicConfig{Name: "orders", ReadQueueNums: 2, WriteQueueNums: 2, Perm: protocol.PermRead | protocol.PermWrite}))
	for _, n := range all {
		eventuallyTrue(t, "the topic is on every broker, replicas included", func() bool { _, ok := n.b.Topic("orders"); return ok })
	}
	for _, n := range []*node{c, b[1].node, a[1].node} {
		var r *protocol.TopicRouteData
		eventuallyTrue(t, "the route lists the three broker names", func() bool {
			r = n.route(t, "orders")
			return len(brokersOf(r)) == 3
		})
		got := map[string]map[int64]string{}
		for _, bd := range r.BrokerDatas {
			got[bd.BrokerName] = bd.BrokerAddrs
		}
		if n != a[1].node { // a replica's own set comes from its Replication, which these brokers have not
			assert.Equal(t, map[int64]string{0: a[0].b.Addr(), 2: a[1].b.Addr()}, got["set-a"], "asked at %s", n.b.Addr())
		}
		if n != b[1].node {
			assert.Equal(t, map[int64]string{0: b[0].b.Addr(), 2: b[1].b.Addr()}, got["set-b"], "asked at %s", n.b.Addr())
		}
		assert.Equal(t, map[int64]string{0: c.b.Addr()}, got["plain-c"])
	}

	_, err := c.b.PutGroup(broker.GroupConfig{Name: "billing", ConsumeEnable: true, RetryQueueNums: 1, RetryMaxTimes: 5})
	require.NoError(t, err)
	for _, n := range all {
		eventuallyTrue(t, "the group is on every broker", func() bool { g, ok := n.b.Group("billing"); return ok && g.RetryMaxTimes == 5 })
	}

	// A replica's own topic stays its own: its table is its master's copy.
	require.NoError(t, b[1].b.CreateTopic(broker.TopicConfig{Name: "replica-only", ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermRead | protocol.PermWrite}))
	require.NoError(t, c.b.CreateTopic(broker.TopicConfig{Name: "later", ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermRead | protocol.PermWrite}))
	eventuallyTrue(t, "a topic created after it reached the replica", func() bool { _, ok := b[1].b.Topic("later"); return ok })
	assert.NotContains(t, c.m.Topics(), "replica-only")
	_, onC := c.b.Topic("replica-only")
	assert.False(t, onC)

	// Promoted, it shares what it has.
	stepDown(b, 0)
	promote(b, 1, 2)
	eventuallyTrue(t, "the promoted replica's topic reached the plain broker", func() bool { _, ok := c.b.Topic("replica-only"); return ok })
}

// TestReplicaSetNewMasterReplacesTheEntryAndAFencedMasterWithdraws: when the lease moves,
// the new master's entry replaces the old one's at once (the old master still heartbeating
// in the older epoch, as a paused master that resumes would, never writes it back); the
// bucket's successive values of the set's key never go back to an older epoch; a master
// that steps down with no successor withdraws its entry, and every route drops the set.
func TestReplicaSetNewMasterReplacesTheEntryAndAFencedMasterWithdraws(t *testing.T) {
	s := startNATS(t, false)
	js, err := jetstream.New(connect(t, s))
	require.NoError(t, err)
	a := startSet(t, s, "set-a", 2)
	c := startNode(t, s, "plain-c", nil)
	kv, err := js.KeyValue(context.Background(), "flowd_brokers")
	require.NoError(t, err)
	w, err := kv.Watch(context.Background(), "set-a", jetstream.IncludeHistory())
	require.NoError(t, err)
	defer func() { _ = w.Stop() }()
	var mu sync.Mutex
	var seen []cluster.BrokerInfo // every value the bucket took for the key, in order
	go func() {
		for e := range w.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var bi cluster.BrokerInfo
			if json.Unmarshal(e.Value(), &bi) == nil {
				mu.Lock()
				seen = append(seen, bi)
				mu.Unlock()
			}
		}
	}()

	require.NoError(t, c.b.CreateTopic(broker.TopicConfig{Name: "orders", ReadQueueNums: 2, WriteQueueNums: 2, Perm: protocol.PermRead | protocol.PermWrite}))
	promote(a, 0, 1)
	eventuallyTrue(t, "the plain broker routes to set-a's first master", func() bool {
		r := c.route(t, "orders")
		return r != nil && len(r.BrokerDatas) == 2 && r.BrokerDatas[1].BrokerAddrs[0] == a[0].b.Addr()
	})

	// The lease moves to member 2 while member 1 still believes it is master in epoch 1.
	promote(a, 1, 2)
	eventuallyTrue(t, "the new master's entry replaced the old one", func() bool {
		bi, ok := entry(c, "set-a")
		return ok && bi.Master == "set-a-2" && bi.Epoch == 2 && bi.Addr == a[1].b.Addr()
	})
	r := c.route(t, "orders")
	require.Len(t, r.BrokerDatas, 2)
	assert.Equal(t, map[int64]string{0: a[1].b.Addr(), 1: a[0].b.Addr()}, r.BrokerDatas[1].BrokerAddrs)
	// Member 1 goes on heartbeating as the master of epoch 1 for several intervals.
	time.Sleep(5 * 300 * time.Millisecond)
	bi, _ := entry(c, "set-a")
	assert.Equal(t, "set-a-2", bi.Master, "the old master never wrote its entry back")
	stepDown(a, 0) // it learns it lost the lease: its withdrawal leaves the new master's entry
	time.Sleep(3 * 300 * time.Millisecond)
	bi, ok := entry(c, "set-a")
	require.True(t, ok)
	assert.Equal(t, "set-a-2", bi.Master)

	// The last master fences and nobody takes over: the set leaves the routes at once.
	stepDown(a, 1)
	c.waitEvent(t, cluster.BrokerLeft, "set-a")
	eventuallyTrue(t, "the route lists the plain broker alone", func() bool { return slices.Equal(brokersOf(c.route(t, "orders")), []string{"plain-c"}) })

	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, seen)
	var epochs []int64
	for _, bi := range seen {
		epochs = append(epochs, bi.Epoch)
	}
	for i := 1; i < len(seen); i++ {
		assert.GreaterOrEqual(t, seen[i].Epoch, seen[i-1].Epoch, "value %d of the set's key went back an epoch: %v", i, epochs)
		if seen[i].Epoch == seen[i-1].Epoch {
			assert.Equal(t, seen[i-1].Master, seen[i].Master, "two masters in one epoch")
		}
	}
	assert.EqualValues(t, 1, seen[0].Epoch)
	assert.EqualValues(t, 2, seen[len(seen)-1].Epoch)
}

// TestReplicaSetMasterDoesNotReplaceAPlainBrokerOfItsName: a replica set's master does not replace the
// live entry of a plain broker of its name, and reports the name taken.
func TestReplicaSetMasterDoesNotReplaceAPlainBrokerOfItsName(t *testing.T) {
	s := startNATS(t, false)
	plain := startNode(t, s, "set-a", nil)
	a := startSet(t, s, "set-a", 1)
	promote(a, 0, 1)
	a[0].waitEvent(t, cluster.NameTaken, "set-a")
	bi, ok := entry(plain, "set-a")
	require.True(t, ok)
	assert.Equal(t, plain.b.Addr(), bi.Addr)
	assert.Zero(t, bi.Epoch)
}
