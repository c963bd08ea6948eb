package control

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// Members reporting different allocators make one group.allocator_mismatch event that lists
// each member's.
func TestAllocatorMismatchIsAnEvent(t *testing.T) {
	n := openEmbedded(t, nil)
	b := newBroker(t, nil)
	events := subscribeEvents(t, n.ListenURL())
	startPublisher(t, n, b, nil)
	rmq := newRocketMQ(t, b)
	for client, allocator := range map[string]string{"10.0.0.1@1": "WASM-x@1", "10.0.0.2@2": "WASM-x@2"} {
		hb := protocol.HeartbeatData{ClientID: client, ConsumerDataSet: []protocol.ConsumerData{{
			GroupName: "mixed", ConsumeType: protocol.ConsumeActively, MessageModel: protocol.Clustering,
			ConsumeFromWhere: protocol.ConsumeFromFirstOffset, Allocator: allocator,
		}}}
		body, err := hb.Encode()
		require.NoError(t, err)
		rmq.invoke(protocol.HeartBeat, nil, body)
	}
	m, d := events.wait(t, "flowd.evt.local.group.allocator_mismatch", func(d EventData) bool { return d.Group == "mixed" })
	assertCloudEvent(t, m, "io.flowd.group.v1.allocator_mismatch", "mixed")
	assert.Equal(t, map[string]string{"10.0.0.1@1": "WASM-x@1", "10.0.0.2@2": "WASM-x@2"}, d.Allocators)
}
