package control

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// Cluster events are CloudEvents on flowd.evt.<cluster>.cluster.<event>, naming the broker
// concerned as ce-subject and in the payload (its node and address), the publishing node
// in ce-source and broker, and no flowd-seq (they are not broker events).
func TestClusterEventsArePublished(t *testing.T) {
	n := openEmbedded(t, nil)
	b := newBroker(t, nil)
	events := subscribeEvents(t, n.ListenURL())
	p := startPublisher(t, n, b, nil)
	at := time.Date(2026, 12, 1, 2, 20, 31, 0, time.UTC)
	p.Cluster(ClusterEvent{Type: EventClusterBrokerJoined, Time: at, Broker: "broker-b", Node: "node-b", Addr: "10.0.0.2:10911"})
	p.Cluster(ClusterEvent{Type: EventClusterBrokerLeft, Broker: "broker-b", Node: "node-b", Addr: "10.0.0.2:10911", Reason: "expired"})
	p.Cluster(ClusterEvent{Type: EventClusterNameTaken, Broker: "broker-a", Node: "broker-a", Reason: "broker name already live in the cluster"})

	msg, d := events.wait(t, "flowd.evt.local.cluster.broker_joined", nil)
	assertCloudEvent(t, msg, "io.flowd.cluster.v1.broker_joined", "broker-b")
	assert.Empty(t, msg.Header.Get(HeaderSeq))
	assert.Equal(t, "broker-a", d.Broker, "the node that saw it")
	assert.Equal(t, "broker-b", d.ClusterBroker)
	assert.Equal(t, "node-b", d.ClusterNode)
	assert.Equal(t, "10.0.0.2:10911", d.ClusterAddr)
	assert.True(t, at.Equal(d.Time))
	assert.Empty(t, d.Reason)

	msg, d = events.wait(t, "flowd.evt.local.cluster.broker_left", nil)
	assertCloudEvent(t, msg, "io.flowd.cluster.v1.broker_left", "broker-b")
	assert.Equal(t, "expired", d.Reason)
	assert.False(t, d.Time.IsZero())

	msg, d = events.wait(t, "flowd.evt.local.cluster.name_taken", nil)
	assertCloudEvent(t, msg, "io.flowd.cluster.v1.name_taken", "broker-a")
	assert.Contains(t, d.Reason, "already live")
}
