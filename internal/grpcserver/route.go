package grpcserver

import (
	"context"
	"net"
	"strconv"
	"time"

	"github.com/flowd-io/flowd/broker"
	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

// acceptTypes are the message types of every flowd topic: a topic takes any of them.
var acceptTypes = []pb.MessageType{pb.MessageType_NORMAL, pb.MessageType_FIFO, pb.MessageType_DELAY, pb.MessageType_TRANSACTION}

// Peer is a topic's share on another broker of the cluster, as gRPC routes name it.
type Peer struct {
	// Broker is the broker's name; Addr its gRPC address ("host:port"). A peer with no Addr
	// serves no gRPC endpoint and is left out of the routes.
	Broker string
	Addr   string
	// Topic is the topic's configuration there: its queue counts and permission.
	Topic broker.TopicConfig
}

// Peers reports the other brokers of the cluster that host a topic (cmd/flowd implements it
// over the cluster's registry); nil for a broker that serves alone.
type Peers interface {
	TopicPeers(topic string) []Peer
}

// ReplicaSet is a replica set's view for gRPC routes (cmd/flowd implements it over the
// set's lease).
type ReplicaSet interface {
	// GRPCMaster is the gRPC address of the set's master when this broker is a replica and
	// the master serves gRPC; false on the master, and while no master is known.
	GRPCMaster() (addr string, ok bool)
}

// self is this broker as routes name it: id 0 with this node's endpoint, or, on a replica of
// a replica set, the master's. A 5.x client sends and receives at id 0 only (RocketMQ's
// proxy names no other), and a pop's in-flight and acknowledged state is the node's own, not
// replicated, so receives go to the master too.
func (s *Server) self() *pb.Broker {
	ep := s.advertised()
	if s.cfg.ReplicaSet != nil {
		if addr, ok := s.cfg.ReplicaSet.GRPCMaster(); ok {
			ep = endpointsOf(addr)
		}
	}
	return &pb.Broker{Name: s.b.Status().BrokerName, Id: 0, Endpoints: ep}
}

// QueryRoute answers a topic's queues on every broker of the cluster that serves gRPC: this
// node's first, then each peer's, each queue with its permission and its broker's gRPC
// endpoint. A client sends to the endpoint of the queue it picked, so its sends spread over
// the nodes; the response's own endpoints stay this node's.
func (s *Server) QueryRoute(ctx context.Context, req *pb.QueryRouteRequest) (*pb.QueryRouteResponse, error) {
	name := req.GetTopic().GetName()
	if name == "" {
		return &pb.QueryRouteResponse{Status: status(pb.Code_ILLEGAL_TOPIC, "the request names no topic")}, nil
	}
	tc, found := s.b.Topic(name)
	if !found {
		return &pb.QueryRouteResponse{Status: status(pb.Code_TOPIC_NOT_FOUND, "topic "+name+" does not exist")}, nil
	}
	qs := topicQueues(req.Topic, tc, s.self())
	for _, p := range s.peers(name) {
		qs = append(qs, topicQueues(req.Topic, p.Topic, &pb.Broker{Name: p.Broker, Id: 0, Endpoints: endpointsOf(p.Addr)})...)
	}
	return &pb.QueryRouteResponse{Status: ok(), MessageQueues: qs}, nil
}

// peers is the topic's share on the other brokers that serve gRPC.
func (s *Server) peers(topic string) []Peer {
	if s.cfg.Peers == nil {
		return nil
	}
	var out []Peer
	for _, p := range s.cfg.Peers.TopicPeers(topic) {
		if p.Addr != "" && p.Broker != "" {
			out = append(out, p)
		}
	}
	return out
}

// topicQueues is a topic's queues on one broker (the max of its read and write queue
// counts), each with the permission its topic configuration gives it.
func topicQueues(topic *pb.Resource, tc broker.TopicConfig, brk *pb.Broker) []*pb.MessageQueue {
	n := max(tc.ReadQueueNums, tc.WriteQueueNums)
	qs := make([]*pb.MessageQueue, 0, n)
	for i := range n {
		qs = append(qs, &pb.MessageQueue{Topic: topic, Id: int32(i), Permission: queuePerm(tc, i), Broker: brk, AcceptMessageTypes: acceptTypes})
	}
	return qs
}

func queuePerm(tc broker.TopicConfig, i int) pb.Permission {
	r, w := i < tc.ReadQueueNums && tc.Readable(), i < tc.WriteQueueNums && tc.Writable()
	switch {
	case r && w:
		return pb.Permission_READ_WRITE
	case r:
		return pb.Permission_READ
	case w:
		return pb.Permission_WRITE
	}
	return pb.Permission_NONE
}

// QueryAssignment answers a push consumer's share of a topic: queue 0 of each broker of the
// cluster that serves gRPC and has readable queues, since a pop receive on a broker reads
// every queue of the topic there for the group (RocketMQ's proxy does the same), so
// consumers need no rebalance, and receiving at every broker misses none of its messages.
func (s *Server) QueryAssignment(ctx context.Context, req *pb.QueryAssignmentRequest) (*pb.QueryAssignmentResponse, error) {
	name := req.GetTopic().GetName()
	tc, found := s.b.Topic(name)
	if !found {
		return &pb.QueryAssignmentResponse{Status: status(pb.Code_TOPIC_NOT_FOUND, "topic "+name+" does not exist")}, nil
	}
	if req.GetGroup().GetName() == "" {
		return &pb.QueryAssignmentResponse{Status: status(pb.Code_ILLEGAL_CONSUMER_GROUP, "the request names no group")}, nil
	}
	var as []*pb.Assignment
	assign := func(tc broker.TopicConfig, brk *pb.Broker) {
		if tc.Readable() && tc.ReadQueueNums > 0 {
			q := &pb.MessageQueue{Topic: req.Topic, Id: 0, Permission: queuePerm(tc, 0), Broker: brk, AcceptMessageTypes: acceptTypes}
			as = append(as, &pb.Assignment{MessageQueue: q})
		}
	}
	assign(tc, s.self())
	for _, p := range s.peers(name) {
		assign(p.Topic, &pb.Broker{Name: p.Broker, Id: 0, Endpoints: endpointsOf(p.Addr)})
	}
	return &pb.QueryAssignmentResponse{Status: ok(), Assignments: as}, nil
}

// endpointsOf is a "host:port" address as the protocol's endpoints: IPv4, IPv6 or a
// domain name by its host.
func endpointsOf(addr string) *pb.Endpoints {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return &pb.Endpoints{Scheme: pb.AddressScheme_DOMAIN_NAME, Addresses: []*pb.Address{{Host: addr}}}
	}
	p, _ := strconv.Atoi(port)
	scheme := pb.AddressScheme_DOMAIN_NAME
	if ip := net.ParseIP(host); ip != nil {
		scheme = pb.AddressScheme_IPv4
		if ip.To4() == nil {
			scheme = pb.AddressScheme_IPv6
		}
	}
	return &pb.Endpoints{Scheme: scheme, Addresses: []*pb.Address{{Host: host, Port: int32(p)}}}
}

// Heartbeat keeps the client counted.
func (s *Server) Heartbeat(ctx context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	id := clientID(ctx)
	if id == "" {
		return &pb.HeartbeatResponse{Status: status(pb.Code_CLIENT_ID_REQUIRED, "the x-mq-client-id header is required")}, nil
	}
	s.clients.beat(id, time.Now())
	return &pb.HeartbeatResponse{Status: ok()}, nil
}

// NotifyClientTermination forgets the client.
func (s *Server) NotifyClientTermination(ctx context.Context, req *pb.NotifyClientTerminationRequest) (*pb.NotifyClientTerminationResponse, error) {
	s.clients.terminated(clientID(ctx))
	return &pb.NotifyClientTerminationResponse{Status: ok()}, nil
}
