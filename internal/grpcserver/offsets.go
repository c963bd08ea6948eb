package grpcserver

import (
	"context"
	"time"

	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

// QueryOffset answers a queue's first or next offset, or the first at a time.
func (s *Server) QueryOffset(ctx context.Context, req *pb.QueryOffsetRequest) (*pb.QueryOffsetResponse, error) {
	topic, qid := req.GetMessageQueue().GetTopic().GetName(), req.GetMessageQueue().GetId()
	var ts int64
	switch req.GetQueryOffsetPolicy() {
	case pb.QueryOffsetPolicy_BEGINNING:
		ts = 0
	case pb.QueryOffsetPolicy_END:
		ts = time.Now().Add(time.Hour).UnixMilli()
	case pb.QueryOffsetPolicy_TIMESTAMP:
		if req.Timestamp == nil {
			return &pb.QueryOffsetResponse{Status: status(pb.Code_BAD_REQUEST, "policy TIMESTAMP needs a timestamp")}, nil
		}
		ts = req.GetTimestamp().AsTime().UnixMilli()
	}
	off, err := s.b.OffsetByTime(topic, qid, ts)
	if err != nil {
		return &pb.QueryOffsetResponse{Status: statusOf(err, pb.Code_NOT_FOUND)}, nil
	}
	if req.GetQueryOffsetPolicy() == pb.QueryOffsetPolicy_END {
		off = s.b.StoreMax(topic, qid)
	}
	return &pb.QueryOffsetResponse{Status: ok(), Offset: off}, nil
}

// GetOffset answers a group's committed offset of a queue.
func (s *Server) GetOffset(ctx context.Context, req *pb.GetOffsetRequest) (*pb.GetOffsetResponse, error) {
	topic, qid := req.GetMessageQueue().GetTopic().GetName(), req.GetMessageQueue().GetId()
	if _, found := s.b.Topic(topic); !found {
		return &pb.GetOffsetResponse{Status: status(pb.Code_TOPIC_NOT_FOUND, "topic "+topic+" does not exist")}, nil
	}
	off, found := s.b.CommittedOffset(req.GetGroup().GetName(), topic, qid)
	if !found {
		return &pb.GetOffsetResponse{Status: status(pb.Code_OFFSET_NOT_FOUND, "the group has no committed offset for the queue")}, nil
	}
	return &pb.GetOffsetResponse{Status: ok(), Offset: off}, nil
}

// The RPCs below are for consumers flowd's gRPC endpoint does not serve (docs/grpc.md says
// why): the protocol's pull consumer (the 5.x clients that flowd is tested with have none;
// flowd's own lite-pull consumer and the 4.x ones pull over remoting), recall and lite
// topics. Each answers a status, not a transport error.

// PullMessage is not served: see above.
func (s *Server) PullMessage(req *pb.PullMessageRequest, stream pb.MessagingService_PullMessageServer) error {
	return stream.Send(&pb.PullMessageResponse{Content: &pb.PullMessageResponse_Status{Status: status(pb.Code_NOT_IMPLEMENTED, "PullMessage is not served by flowd's gRPC endpoint: pull over remoting (flowd's lite-pull consumer)")}})
}

// UpdateOffset is not served: see above.
func (s *Server) UpdateOffset(ctx context.Context, req *pb.UpdateOffsetRequest) (*pb.UpdateOffsetResponse, error) {
	return &pb.UpdateOffsetResponse{Status: status(pb.Code_NOT_IMPLEMENTED, "UpdateOffset is not served by flowd's gRPC endpoint: commit over remoting (flowd's lite-pull consumer)")}, nil
}

// RecallMessage is not served: see above.
func (s *Server) RecallMessage(ctx context.Context, req *pb.RecallMessageRequest) (*pb.RecallMessageResponse, error) {
	return &pb.RecallMessageResponse{Status: status(pb.Code_UNSUPPORTED, "flowd does not recall delayed messages")}, nil
}

// SyncLiteSubscription is not served: see above.
func (s *Server) SyncLiteSubscription(ctx context.Context, req *pb.SyncLiteSubscriptionRequest) (*pb.SyncLiteSubscriptionResponse, error) {
	return &pb.SyncLiteSubscriptionResponse{Status: status(pb.Code_UNSUPPORTED, "flowd has no lite topics")}, nil
}
