package broker_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

// staticPeers is a fixed cluster view: the seam's contract is only what it returns.
type staticPeers struct {
	queues  map[string][]protocol.QueueData
	brokers []protocol.BrokerData
	topics  []string
}

func (p staticPeers) TopicRoute(topic string) ([]protocol.QueueData, []protocol.BrokerData) {
	qs := p.queues[topic]
	if len(qs) == 0 {
		return nil, nil
	}
	return qs, p.brokers
}

func (p staticPeers) Brokers() []protocol.BrokerData { return p.brokers }

func (p staticPeers) Topics() []string { return p.topics }

func TestPeersAreMergedIntoRoutesAndClusterInfo(t *testing.T) {
	peers := staticPeers{
		queues: map[string][]protocol.QueueData{
			"both": {
				{BrokerName: "broker-c", ReadQueueNums: 2, WriteQueueNums: 2, Perm: 6},
				{BrokerName: "broker-b", ReadQueueNums: 3, WriteQueueNums: 3, Perm: 6},
				// A peer's word about this broker is ignored: its own table is the truth.
				{BrokerName: "broker-a", ReadQueueNums: 9, WriteQueueNums: 9, Perm: 6},
			},
			"elsewhere": {{BrokerName: "broker-b", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}},
		},
		brokers: []protocol.BrokerData{
			{Cluster: "local", BrokerName: "broker-c", BrokerAddrs: map[int64]string{0: "127.0.0.1:3"}},
			{Cluster: "local", BrokerName: "broker-b", BrokerAddrs: map[int64]string{0: "127.0.0.1:2"}},
		},
	}
	b := startBroker(t, func(c *broker.Config) { c.Peers = peers })
	require.NoError(t, b.CreateTopic(broker.TopicConfig{Name: "both", ReadQueueNums: 4, WriteQueueNums: 4, Perm: 6}))
	c := newRawClient(t, b, nil)

	resp := c.invoke(context.Background(), protocol.GetRouteInfoByTopic, &protocol.GetRouteInfoRequestHeader{Topic: "both"}, nil)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	route, err := protocol.DecodeTopicRouteData(resp.Body)
	require.NoError(t, err)
	var names []string
	for _, q := range route.QueueDatas {
		names = append(names, q.BrokerName)
	}
	assert.Equal(t, []string{"broker-a", "broker-b", "broker-c"}, names, "own queues first, then the peers' by name")
	assert.EqualValues(t, 4, route.QueueDatas[0].WriteQueueNums)
	require.Len(t, route.BrokerDatas, 3)
	assert.Equal(t, b.Addr(), route.BrokerDatas[0].BrokerAddrs[0])
	assert.Equal(t, "127.0.0.1:2", route.BrokerDatas[1].BrokerAddrs[0])

	resp = c.invoke(context.Background(), protocol.GetRouteInfoByTopic, &protocol.GetRouteInfoRequestHeader{Topic: "elsewhere"}, nil)
	require.Equal(t, protocol.Success, resp.ResponseCode(), "a topic only a peer has is routed there: %s", resp.Remark)
	route, err = protocol.DecodeTopicRouteData(resp.Body)
	require.NoError(t, err)
	require.Len(t, route.QueueDatas, 1)
	assert.Equal(t, "broker-b", route.QueueDatas[0].BrokerName)

	resp = c.invoke(context.Background(), protocol.GetRouteInfoByTopic, &protocol.GetRouteInfoRequestHeader{Topic: "nowhere"}, nil)
	assert.Equal(t, protocol.TopicNotExist, resp.ResponseCode())

	resp = c.invoke(context.Background(), protocol.GetBrokerClusterInfo, nil, nil)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	info, err := protocol.DecodeClusterInfo(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, []string{"broker-a", "broker-b", "broker-c"}, info.ClusterAddrTable["local"])
	assert.Equal(t, "127.0.0.1:3", info.BrokerAddrTable["broker-c"].BrokerAddrs[0])
}

// The name service's topic lists answer for the cluster: this broker's topics and the
// cluster's shared ones that Peers reports (one not materialised here yet included), each
// once, sorted; a peer's cluster gets the shared topics, an unknown cluster none.
func TestNameServiceTopicListsIncludePeerTopics(t *testing.T) {
	peers := staticPeers{
		topics: []string{"shared", "only-elsewhere"},
		brokers: []protocol.BrokerData{
			{Cluster: "c1", BrokerName: "b2", BrokerAddrs: map[int64]string{0: "127.0.0.1:2"}},
			{Cluster: "c2", BrokerName: "b3", BrokerAddrs: map[int64]string{0: "127.0.0.1:3"}},
		},
	}
	b := startBroker(t, func(c *broker.Config) { c.Cluster, c.BrokerName, c.Peers = "c1", "b1", peers })
	require.NoError(t, b.CreateTopic(broker.TopicConfig{Name: "shared", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	require.NoError(t, b.CreateTopic(broker.TopicConfig{Name: "mine", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	c := newRawClient(t, b, nil)
	list := func(code protocol.RequestCode, h protocol.Header) []string {
		t.Helper()
		resp := c.invokeAt(b.NamesrvAddr(), code, h, nil)
		require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
		var tl protocol.TopicList
		require.NoError(t, json.Unmarshal(resp.Body, &tl))
		return tl.TopicList
	}
	all := list(protocol.GetAllTopicListFromNamesrv, nil)
	assert.True(t, slices.IsSorted(all), "%v", all)
	for _, want := range []string{"mine", "shared", "only-elsewhere", protocol.AutoCreateTopicKey} {
		assert.Contains(t, all, want)
	}
	assert.Len(t, slices.Compact(slices.Clone(all)), len(all), "each topic once: %v", all)

	own := list(protocol.GetTopicsByCluster, &protocol.GetTopicsByClusterRequestHeader{Cluster: "c1"})
	assert.Equal(t, all, own, "this broker's cluster: the whole list")
	assert.Equal(t, []string{"only-elsewhere", "shared"}, list(protocol.GetTopicsByCluster, &protocol.GetTopicsByClusterRequestHeader{Cluster: "c2"}),
		"a peer's cluster: the shared topics")
	assert.Empty(t, list(protocol.GetTopicsByCluster, &protocol.GetTopicsByClusterRequestHeader{Cluster: "nobody"}))
}
