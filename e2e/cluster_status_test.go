package e2e

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
)

// brokerNames lists the brokers of a cluster.status reply, sorted.
func brokerNames(r control.ClusterStatusReply) []string {
	var out []string
	for _, b := range r.Brokers {
		out = append(out, b.Name)
	}
	slices.Sort(out)
	return out
}

// In a three-node cluster, `flowd cluster status` through any node lists the three live
// brokers with their heartbeats and the NATS cluster's three servers; a node killed with
// SIGKILL is reported by the others as cluster.broker_left (reason expired) on the events
// subjects, and leaves the status.
func TestClusterStatusAndEventsOfThreeNodes(t *testing.T) {
	nodes := startCluster(t, "broker-1", "broker-2", "broker-3")
	a, c := nodes[0], nodes[2]
	all := []string{"broker-1", "broker-2", "broker-3"}

	for _, n := range nodes {
		var st control.ClusterStatusReply
		require.Eventually(t, func() bool {
			require.NoError(t, n.ctlJSON(&st, "cluster", "status"))
			return slices.Equal(brokerNames(st), all) && st.NATS != nil && len(st.NATS.Routes) == 2 && st.NATS.MetaLeader != ""
		}, wait, 100*time.Millisecond, "cluster status through %s lists every broker and route: %+v", n.broker, st)
		assert.True(t, st.Clustered)
		assert.True(t, st.Joined)
		assert.Equal(t, "e2e", st.Cluster)
		self := 0
		for _, b := range st.Brokers {
			require.NotNil(t, b.Heartbeat, "%s has heartbeated", b.Name)
			assert.NotEmpty(t, b.Addr)
			if b.Self {
				self++
				assert.Equal(t, st.Node, b.Name, "the answering node's broker is marked")
			}
		}
		assert.Equal(t, 1, self)
		assert.Len(t, st.NATS.Peers, 3)
	}
	out := a.ctl("cluster", "status")
	for _, name := range all {
		assert.Regexp(t, `(?m)^`+name+`( \*)?\s+`+name+`\s+127\.0\.0\.1:\d+\s`, out)
	}

	// A subscriber on A's server sees the others report C's expiry.
	nc, err := nats.Connect(a.nats)
	require.NoError(t, err)
	defer nc.Close()
	left := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe(control.EventSubjectPrefix+"."+cluster+".cluster.broker_left", left)
	require.NoError(t, err)
	defer sub.Unsubscribe()
	require.NoError(t, nc.FlushTimeout(wait))

	c.kill()
	var reporters []string
	deadline := time.After(brokerTTL + wait)
	for len(reporters) < 2 {
		select {
		case m := <-left:
			var d control.EventData
			require.NoError(t, json.Unmarshal(m.Data, &d), string(m.Data))
			assert.Equal(t, "broker-3", d.ClusterBroker)
			assert.Equal(t, "broker-3", d.ClusterNode)
			assert.Equal(t, c.daemon.broker, d.ClusterAddr)
			assert.Equal(t, "expired", d.Reason)
			assert.Equal(t, "io.flowd.cluster.v1.broker_left", m.Header.Get("ce-type"))
			assert.Equal(t, "broker-3", m.Header.Get("ce-subject"))
			if !slices.Contains(reporters, d.Broker) {
				reporters = append(reporters, d.Broker)
			}
		case <-deadline:
			t.Fatalf("broker-3's departure reported by %v only", reporters)
		}
	}
	slices.Sort(reporters)
	assert.Equal(t, []string{"broker-1", "broker-2"}, reporters, "each surviving node reports it")

	var st control.ClusterStatusReply
	require.Eventually(t, func() bool {
		require.NoError(t, a.ctlJSON(&st, "cluster", "status"))
		return slices.Equal(brokerNames(st), []string{"broker-1", "broker-2"})
	}, wait, 100*time.Millisecond, "the status drops broker-3: %+v", st)
	assert.NotRegexp(t, `(?m)^broker-3\s+broker-3\s+127\.0\.0\.1:\d+\s`, a.ctl("cluster", "status"), "no broker line of broker-3 (its NATS server stays a meta peer)")
}
