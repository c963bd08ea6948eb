package grpcserver

import (
	"context"
	"errors"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/flowd-io/flowd/broker"
	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

// minInvisible is the shortest invisibility a receive or a change accepts. RocketMQ's proxy
// refuses below 10 s; nothing in the protocol needs that floor, and tests of redelivery
// want short ones.
const minInvisible = broker.PopMinInvisible

// wasmPrefix marks flowd's extension of the filter expressions: "wasm:NAME[:ARG]" selects
// with a deployed Wasm filter plugin, whatever the expression's type.
const wasmPrefix = "wasm:"

// filterOf maps a 5.x filter expression onto the broker's expression type and text.
func filterOf(f *pb.FilterExpression) (typ, expr string, bad *pb.Status) {
	e := f.GetExpression()
	if rest, found := strings.CutPrefix(e, wasmPrefix); found {
		return "WASM", rest, nil
	}
	switch f.GetType() {
	case pb.FilterType_TAG, pb.FilterType_FILTER_TYPE_UNSPECIFIED:
		if strings.TrimSpace(e) == "" {
			e = "*"
		}
		return "TAG", e, nil
	case pb.FilterType_SQL:
		return "SQL92", e, nil
	}
	return "", "", status(pb.Code_ILLEGAL_FILTER_EXPRESSION, "filter type "+f.GetType().String()+" is not known")
}

// ReceiveMessage pops messages of the request's topic for its group, from any queue of the
// topic (the clients receive from one queue of a route; RocketMQ's proxy too reads them
// all), long polling up to the client's long_polling_timeout, and streams them, each with
// its receipt handle, then a status: OK, or MESSAGE_NOT_FOUND when none came.
func (s *Server) ReceiveMessage(req *pb.ReceiveMessageRequest, stream pb.MessagingService_ReceiveMessageServer) error {
	ctx := stream.Context()
	send := func(st *pb.Status) error {
		return stream.Send(&pb.ReceiveMessageResponse{Content: &pb.ReceiveMessageResponse_Status{Status: st}})
	}
	group, topic := req.GetGroup().GetName(), req.GetMessageQueue().GetTopic().GetName()
	if group == "" {
		return send(status(pb.Code_ILLEGAL_CONSUMER_GROUP, "the request names no group"))
	}
	if topic == "" {
		return send(status(pb.Code_ILLEGAL_TOPIC, "the request names no topic"))
	}
	typ, expr, bad := filterOf(req.GetFilterExpression())
	if bad != nil {
		return send(bad)
	}
	invisible := req.GetInvisibleDuration().AsDuration()
	if req.InvisibleDuration == nil {
		invisible = 30 * time.Second
	}
	if invisible < minInvisible || invisible > broker.PopMaxInvisible {
		return send(status(pb.Code_ILLEGAL_INVISIBLE_TIME, "the invisible duration "+invisible.String()+" is outside "+minInvisible.String()+" to "+broker.PopMaxInvisible.String()))
	}
	batch := int(req.GetBatchSize())
	if batch <= 0 {
		return send(status(pb.Code_BAD_REQUEST, "batch_size must be positive"))
	}
	batch = min(batch, s.cfg.MaxBatch)
	wait := min(req.GetLongPollingTimeout().AsDuration(), s.cfg.MaxReceiveWait)
	if req.GetLongPollingTimeout().AsDuration() < 0 {
		return send(status(pb.Code_ILLEGAL_POLLING_TIME, "the long polling timeout is negative"))
	}
	if dl, has := ctx.Deadline(); has {
		// Answer before the client's deadline: an empty answer, not a deadline error.
		wait = min(wait, time.Until(dl)-500*time.Millisecond)
	}
	wait = max(wait, 0)
	pctx, cancel := s.untilStop(ctx)
	defer cancel()
	popped, err := s.b.Pop(pctx, broker.PopRequest{
		Group: group, Topic: topic, QueueID: -1, MaxMessages: batch, Invisible: invisible,
		ExpressionType: typ, Expression: expr, Wait: wait, ClientID: clientID(ctx),
	})
	if err != nil {
		return send(statusOf(err, pb.Code_TOPIC_NOT_FOUND))
	}
	if len(popped) == 0 {
		return send(status(pb.Code_MESSAGE_NOT_FOUND, "no new message"))
	}
	if err := stream.Send(&pb.ReceiveMessageResponse{Content: &pb.ReceiveMessageResponse_DeliveryTimestamp{DeliveryTimestamp: timestamppb.Now()}}); err != nil {
		return err
	}
	for i := range popped {
		p := &popped[i]
		o := s.outOf(p.Message, topic, &delivery{handle: p.Handle, attempt: p.Attempt, invisibleUntil: p.InvisibleUntil})
		if err := s.sendDelivery(stream, &o); err != nil {
			// The client is gone: what it did not get comes back after its invisibility.
			return err
		}
	}
	return send(ok())
}

// sendDelivery streams o, written by hand into a pooled buffer (wire.go); a message with a
// string protobuf would refuse goes through the generated types, which refuse it.
func (s *Server) sendDelivery(stream pb.MessagingService_ReceiveMessageServer, o *outMessage) error {
	if o.wireSafe() {
		enc, err := o.encodeDelivery()
		if err != nil {
			return err
		}
		return stream.SendMsg(enc)
	}
	return stream.Send(&pb.ReceiveMessageResponse{Content: &pb.ReceiveMessageResponse_Message{Message: o.proto()}})
}

// AckMessage acknowledges each entry's receipt handle.
func (s *Server) AckMessage(ctx context.Context, req *pb.AckMessageRequest) (*pb.AckMessageResponse, error) {
	group, topic := req.GetGroup().GetName(), req.GetTopic().GetName()
	if len(req.GetEntries()) == 0 {
		return &pb.AckMessageResponse{Status: status(pb.Code_BAD_REQUEST, "the request holds no entry")}, nil
	}
	entries := req.GetEntries()
	handles := make([]string, len(entries))
	for i, e := range entries {
		handles[i] = e.GetReceiptHandle()
	}
	// One pass over the batch: one journal write for all of it, not one per entry.
	errs := s.b.PopAckBatch(ctx, group, topic, handles)
	resp := &pb.AckMessageResponse{Entries: make([]*pb.AckMessageResultEntry, len(entries))}
	// The batch's result entries in one allocation, not one each.
	results := make([]pb.AckMessageResultEntry, len(entries))
	okStatus := ok()
	for i, e := range entries {
		r := &results[i]
		r.MessageId, r.ReceiptHandle, r.Status = e.GetMessageId(), e.GetReceiptHandle(), okStatus
		if errs[i] != nil {
			r.Status = statusOf(errs[i], pb.Code_NOT_FOUND)
		}
		resp.Entries[i] = r
	}
	resp.Status = overall(resp.Entries, func(e *pb.AckMessageResultEntry) *pb.Status { return e.Status })
	return resp, nil
}

// ChangeInvisibleDuration makes a received message invisible for the given time from now;
// the answer's receipt handle replaces the old one.
func (s *Server) ChangeInvisibleDuration(ctx context.Context, req *pb.ChangeInvisibleDurationRequest) (*pb.ChangeInvisibleDurationResponse, error) {
	d := req.GetInvisibleDuration().AsDuration()
	if d < minInvisible || d > broker.PopMaxInvisible {
		return &pb.ChangeInvisibleDurationResponse{Status: status(pb.Code_ILLEGAL_INVISIBLE_TIME, "the invisible duration "+d.String()+" is outside "+minInvisible.String()+" to "+broker.PopMaxInvisible.String())}, nil
	}
	h, err := s.b.PopChangeInvisible(ctx, req.GetGroup().GetName(), req.GetTopic().GetName(), req.GetReceiptHandle(), d)
	if err != nil {
		return &pb.ChangeInvisibleDurationResponse{Status: statusOf(err, pb.Code_NOT_FOUND)}, nil
	}
	return &pb.ChangeInvisibleDurationResponse{Status: ok(), ReceiptHandle: h}, nil
}

// ForwardMessageToDeadLetterQueue moves a received message to its group's dead-letter topic
// (a push consumer that gave up on it).
func (s *Server) ForwardMessageToDeadLetterQueue(ctx context.Context, req *pb.ForwardMessageToDeadLetterQueueRequest) (*pb.ForwardMessageToDeadLetterQueueResponse, error) {
	err := s.b.PopToDLQ(ctx, req.GetGroup().GetName(), req.GetTopic().GetName(), req.GetReceiptHandle())
	return &pb.ForwardMessageToDeadLetterQueueResponse{Status: statusOf(err, pb.Code_NOT_FOUND)}, nil
}

// popStatus maps the errors of pop consumption.
func popStatus(err error) *pb.Status {
	switch {
	case errors.Is(err, broker.ErrInvalidReceiptHandle):
		return status(pb.Code_INVALID_RECEIPT_HANDLE, err.Error())
	case errors.Is(err, broker.ErrReceiptHandleExpired):
		return status(pb.Code_INVALID_RECEIPT_HANDLE, err.Error())
	case errors.Is(err, broker.ErrBadFilter):
		return status(pb.Code_ILLEGAL_FILTER_EXPRESSION, err.Error())
	case errors.Is(err, broker.ErrBadRequest):
		return status(pb.Code_BAD_REQUEST, err.Error())
	}
	return nil
}

// fifoGroup reports whether group consumes in order (a FIFO group).
func (s *Server) fifoGroup(group string) bool {
	g, found := s.b.Group(group)
	return found && g.ConsumeOrderly
}
