package grpcserver_test

import (
	"net"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/internal/grpcserver"
	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
	"github.com/flowd-io/flowd/protocol"
)

// peerTable is the cluster's other brokers as the registry would report them, by topic.
type peerTable map[string][]grpcserver.Peer

func (p peerTable) TopicPeers(topic string) []grpcserver.Peer { return p[topic] }

type routeQueue struct {
	Broker string
	Addr   string
	ID     int32
	Perm   pb.Permission
}

func routeQueues(qs []*pb.MessageQueue) []routeQueue {
	var out []routeQueue
	for _, q := range qs {
		addr := ""
		if as := q.GetBroker().GetEndpoints().GetAddresses(); len(as) == 1 {
			addr = net.JoinHostPort(as[0].GetHost(), strconv.Itoa(int(as[0].GetPort())))
		}
		out = append(out, routeQueue{Broker: q.GetBroker().GetName(), Addr: addr, ID: q.GetId(), Perm: q.GetPermission()})
	}
	return out
}

func TestQueryRouteListsEveryNodesQueuesWithItsEndpoint(t *testing.T) {
	rw := protocol.PermRead | protocol.PermWrite
	peers := peerTable{"orders": {
		{Broker: "b", Addr: "127.0.0.2:9001", Topic: broker.TopicConfig{Name: "orders", ReadQueueNums: 2, WriteQueueNums: 1, Perm: rw}},
		{Broker: "c", Addr: "", Topic: broker.TopicConfig{Name: "orders", ReadQueueNums: 4, WriteQueueNums: 4, Perm: rw}}, // no gRPC
		{Broker: "d", Addr: "[::1]:9002", Topic: broker.TopicConfig{Name: "orders", ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermRead}},
		{Broker: "e", Addr: "mq.example:9003", Topic: broker.TopicConfig{Name: "orders", ReadQueueNums: 0, WriteQueueNums: 0, Perm: rw}}, // no queues
		{Broker: "f", Addr: "mq.example:9004", Topic: broker.TopicConfig{Name: "orders", ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermWrite}},
	}}
	e := startGRPC(t, func(c *broker.Config) { c.BrokerName = "a" }, func(c *grpcserver.Config) { c.Peers = peers })
	e.topic(t, "orders", 2)
	ctx := callCtx(t, "c-route")

	resp, err := e.client.QueryRoute(ctx, &pb.QueryRouteRequest{Topic: res("orders")})
	require.NoError(t, err)
	require.Equal(t, pb.Code_OK, resp.Status.Code, resp.Status.Message)
	require.Equal(t, []routeQueue{
		{"a", e.addr, 0, pb.Permission_READ_WRITE},
		{"a", e.addr, 1, pb.Permission_READ_WRITE},
		{"b", "127.0.0.2:9001", 0, pb.Permission_READ_WRITE},
		{"b", "127.0.0.2:9001", 1, pb.Permission_READ},
		{"d", "[::1]:9002", 0, pb.Permission_READ},
		{"f", "mq.example:9004", 0, pb.Permission_WRITE},
	}, routeQueues(resp.MessageQueues))
	schemes := map[string]pb.AddressScheme{}
	for _, q := range resp.MessageQueues {
		require.Equal(t, int32(0), q.Broker.Id, "every broker is its own master")
		require.Equal(t, "orders", q.Topic.Name)
		require.Len(t, q.AcceptMessageTypes, 4)
		schemes[q.Broker.Name] = q.Broker.Endpoints.Scheme
	}
	require.Equal(t, map[string]pb.AddressScheme{"a": pb.AddressScheme_IPv4, "b": pb.AddressScheme_IPv4, "d": pb.AddressScheme_IPv6, "f": pb.AddressScheme_DOMAIN_NAME}, schemes)

	// A topic no peer hosts is this node's alone.
	e.topic(t, "local", 1)
	resp, err = e.client.QueryRoute(ctx, &pb.QueryRouteRequest{Topic: res("local")})
	require.NoError(t, err)
	require.Equal(t, []routeQueue{{"a", e.addr, 0, pb.Permission_READ_WRITE}}, routeQueues(resp.MessageQueues))

	// A push consumer is assigned queue 0 of each broker with readable queues (f's are
	// write-only), so that it receives at every node.
	as, err := e.client.QueryAssignment(ctx, &pb.QueryAssignmentRequest{Topic: res("orders"), Group: res("g")})
	require.NoError(t, err)
	require.Equal(t, pb.Code_OK, as.Status.Code, as.Status.Message)
	var assigned []*pb.MessageQueue
	for _, a := range as.Assignments {
		assigned = append(assigned, a.MessageQueue)
	}
	require.Equal(t, []routeQueue{
		{"a", e.addr, 0, pb.Permission_READ_WRITE},
		{"b", "127.0.0.2:9001", 0, pb.Permission_READ_WRITE},
		{"d", "[::1]:9002", 0, pb.Permission_READ},
	}, routeQueues(assigned))
}

// masterAt is a replica set whose lease names a master serving gRPC at addr ("": this
// broker is the master, or none is known).
type masterAt struct{ addr atomic.Pointer[string] }

func (m *masterAt) GRPCMaster() (string, bool) {
	a := *m.addr.Load()
	return a, a != ""
}

func TestReplicaRoutesNameTheMastersEndpoint(t *testing.T) {
	var rs masterAt
	master, self := "127.0.0.9:7001", ""
	rs.addr.Store(&master)
	e := startGRPC(t, func(c *broker.Config) { c.BrokerName = "rs" }, func(c *grpcserver.Config) { c.ReplicaSet = &rs })
	e.topic(t, "orders", 2)
	ctx := callCtx(t, "c-replica")
	resp, err := e.client.QueryRoute(ctx, &pb.QueryRouteRequest{Topic: res("orders")})
	require.NoError(t, err)
	require.Equal(t, []routeQueue{{"rs", "127.0.0.9:7001", 0, pb.Permission_READ_WRITE}, {"rs", "127.0.0.9:7001", 1, pb.Permission_READ_WRITE}},
		routeQueues(resp.MessageQueues), "a replica's route sends everything to the master")
	as, err := e.client.QueryAssignment(ctx, &pb.QueryAssignmentRequest{Topic: res("orders"), Group: res("g")})
	require.NoError(t, err)
	require.Len(t, as.Assignments, 1)
	require.Equal(t, []routeQueue{{"rs", "127.0.0.9:7001", 0, pb.Permission_READ_WRITE}}, routeQueues([]*pb.MessageQueue{as.Assignments[0].MessageQueue}))

	rs.addr.Store(&self) // promoted: this node is the master
	resp, err = e.client.QueryRoute(ctx, &pb.QueryRouteRequest{Topic: res("orders")})
	require.NoError(t, err)
	require.Equal(t, []routeQueue{{"rs", e.addr, 0, pb.Permission_READ_WRITE}, {"rs", e.addr, 1, pb.Permission_READ_WRITE}}, routeQueues(resp.MessageQueues))
}
