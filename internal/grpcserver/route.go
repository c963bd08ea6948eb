package grpcserver

import (
	"context"
	"time"

	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

// acceptTypes are the message types of every flowd topic: a topic takes any of them.
var acceptTypes = []pb.MessageType{pb.MessageType_NORMAL, pb.MessageType_FIFO, pb.MessageType_DELAY, pb.MessageType_TRANSACTION}

// QueryRoute answers a topic's queues, each with its permission, on this node's gRPC
// endpoint: the client sends everything to the endpoints its routes name.
func (s *Server) QueryRoute(ctx context.Context, req *pb.QueryRouteRequest) (*pb.QueryRouteResponse, error) {
	name := req.GetTopic().GetName()
	if name == "" {
		return &pb.QueryRouteResponse{Status: status(pb.Code_ILLEGAL_TOPIC, "the request names no topic")}, nil
	}
	tc, found := s.b.Topic(name)
	if !found {
		return &pb.QueryRouteResponse{Status: status(pb.Code_TOPIC_NOT_FOUND, "topic "+name+" does not exist")}, nil
	}
	brk := &pb.Broker{Name: s.b.Status().BrokerName, Id: 0, Endpoints: s.advertised()}
	n := max(tc.ReadQueueNums, tc.WriteQueueNums)
	qs := make([]*pb.MessageQueue, 0, n)
	for i := range n {
		perm := pb.Permission_NONE
		r, w := i < tc.ReadQueueNums && tc.Readable(), i < tc.WriteQueueNums && tc.Writable()
		switch {
		case r && w:
			perm = pb.Permission_READ_WRITE
		case r:
			perm = pb.Permission_READ
		case w:
			perm = pb.Permission_WRITE
		}
		qs = append(qs, &pb.MessageQueue{Topic: req.Topic, Id: int32(i), Permission: perm, Broker: brk, AcceptMessageTypes: acceptTypes})
	}
	return &pb.QueryRouteResponse{Status: ok(), MessageQueues: qs}, nil
}

// QueryAssignment answers a push consumer's share of a topic: one queue on this node, since
// a pop receive reads every queue of the topic for the group (RocketMQ's proxy does the
// same), so consumers need no rebalance.
func (s *Server) QueryAssignment(ctx context.Context, req *pb.QueryAssignmentRequest) (*pb.QueryAssignmentResponse, error) {
	name := req.GetTopic().GetName()
	tc, found := s.b.Topic(name)
	if !found {
		return &pb.QueryAssignmentResponse{Status: status(pb.Code_TOPIC_NOT_FOUND, "topic "+name+" does not exist")}, nil
	}
	if req.GetGroup().GetName() == "" {
		return &pb.QueryAssignmentResponse{Status: status(pb.Code_ILLEGAL_CONSUMER_GROUP, "the request names no group")}, nil
	}
	if !tc.Readable() || tc.ReadQueueNums == 0 {
		return &pb.QueryAssignmentResponse{Status: ok()}, nil
	}
	brk := &pb.Broker{Name: s.b.Status().BrokerName, Id: 0, Endpoints: s.advertised()}
	q := &pb.MessageQueue{Topic: req.Topic, Id: 0, Permission: pb.Permission_READ_WRITE, Broker: brk, AcceptMessageTypes: acceptTypes}
	return &pb.QueryAssignmentResponse{Status: ok(), Assignments: []*pb.Assignment{{MessageQueue: q}}}, nil
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
