package grpcserver

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/flowd-io/flowd/broker"
	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

// Settings the server hands out in the Telemetry exchange.
const (
	// receiveBatch is a consumer's receive batch size.
	receiveBatch = 32
	// longPolling is how long a consumer's receive may wait for messages.
	longPolling = 20 * time.Second
	// retryAttempts and the backoff are a producer's resend policy and a consumer's
	// redelivery backoff (the 5.x clients read both from here).
	retryAttempts = 16
)

// serverSettings is the answer to a client's settings: its own, with the server's
// publishing or subscription part (backoff policy, body size, batch size, long polling,
// the FIFO flag of the group).
func (s *Server) serverSettings(in *pb.Settings) *pb.Settings {
	out := &pb.Settings{
		ClientType:     in.ClientType,
		AccessPoint:    s.advertised(),
		RequestTimeout: in.RequestTimeout,
		UserAgent:      in.UserAgent,
		Metric:         &pb.Metric{On: false},
		BackoffPolicy: &pb.RetryPolicy{
			MaxAttempts: retryAttempts,
			Strategy: &pb.RetryPolicy_ExponentialBackoff{ExponentialBackoff: &pb.ExponentialBackoff{
				Initial: durationpb.New(time.Second), Max: durationpb.New(60 * time.Second), Multiplier: 2,
			}},
		},
	}
	if in.RequestTimeout == nil {
		out.RequestTimeout = durationpb.New(3 * time.Second)
	}
	switch ps := in.PubSub.(type) {
	case *pb.Settings_Publishing:
		out.PubSub = &pb.Settings_Publishing{Publishing: &pb.Publishing{
			Topics:              ps.Publishing.GetTopics(),
			MaxBodySize:         int32(s.b.MaxMessageSize()),
			ValidateMessageType: false, // flowd topics accept every message type
		}}
	case *pb.Settings_Subscription:
		sub := ps.Subscription
		fifo := s.fifoGroup(sub.GetGroup().GetName())
		batch := int32(receiveBatch)
		out.PubSub = &pb.Settings_Subscription{Subscription: &pb.Subscription{
			Group:              sub.Group,
			Subscriptions:      sub.Subscriptions,
			Fifo:               &fifo,
			ReceiveBatchSize:   &batch,
			LongPollingTimeout: durationpb.New(longPolling),
		}}
	}
	return out
}

// Telemetry is the client's session: its settings in, the server's out (the client's start
// waits for that answer), and the server's commands out for as long as it stays open (a
// transaction check-back is a RecoverOrphanedTransactionCommand).
func (s *Server) Telemetry(stream pb.MessagingService_TelemetryServer) error {
	ctx := stream.Context()
	sess := &session{clientID: clientID(ctx), send: stream.Send, done: make(chan struct{}), lastSeen: time.Now()}
	if sess.clientID == "" {
		return stream.Send(&pb.TelemetryCommand{Status: status(pb.Code_CLIENT_ID_REQUIRED, "the x-mq-client-id header is required")})
	}
	errc := make(chan error, 1)
	go func() { errc <- s.telemetryReads(ctx, stream, sess) }()
	defer func() {
		s.clients.remove(sess)
		s.clients.mu.Lock()
		group := sess.group
		s.clients.mu.Unlock()
		if group != "" {
			s.b.ExternalMember(group, sess.clientID, false, "telemetry closed")
		}
	}()
	select {
	case err := <-errc:
		return err
	case <-sess.done:
		return nil
	case <-s.stopping:
		return nil
	case <-ctx.Done():
		return nil
	}
}

// telemetryReads answers the client's commands until the stream ends.
func (s *Server) telemetryReads(ctx context.Context, stream pb.MessagingService_TelemetryServer, sess *session) error {
	for {
		cmd, err := stream.Recv()
		if errors.Is(err, io.EOF) || ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		switch c := cmd.Command.(type) {
		case *pb.TelemetryCommand_Settings:
			st := c.Settings
			s.clients.mu.Lock()
			before := sess.group
			sess.typ = st.GetClientType()
			sess.lastSeen = time.Now()
			sess.topics = sess.topics[:0]
			for _, t := range st.GetPublishing().GetTopics() {
				sess.topics = append(sess.topics, t.GetName())
			}
			sess.group = st.GetSubscription().GetGroup().GetName()
			after := sess.group
			s.clients.mu.Unlock()
			s.clients.put(sess)
			if before != after && before != "" {
				s.b.ExternalMember(before, sess.clientID, false, "settings changed")
			}
			if before != after && after != "" {
				s.b.ExternalMember(after, sess.clientID, true, "")
			}
			s.log.Debug("gRPC client settings", "client", sess.clientID, "type", sess.typ.String(), "group", sess.group, "topics", sess.topics)
			if err := sess.write(&pb.TelemetryCommand{Status: ok(), Command: &pb.TelemetryCommand_Settings{Settings: s.serverSettings(st)}}); err != nil {
				return err
			}
		default:
			// The answers to commands flowd does not send (stack traces, message
			// verification) need nothing.
		}
	}
}

// checkTransaction is the broker's check-back path for gRPC producers: the half message goes
// to a producer session publishing its topic as a RecoverOrphanedTransactionCommand, which
// the client answers with EndTransaction (source SOURCE_SERVER_CHECK).
func (s *Server) checkTransaction(_ context.Context, c broker.TransactionCheck) bool {
	if !isGRPCProducerGroup(c.ProducerGroup) {
		return false
	}
	sess := s.clients.producerFor(c.Message.Topic)
	if sess == nil {
		return false
	}
	msg := s.toProto(c.Message, c.Message.Topic, nil)
	cmd := &pb.TelemetryCommand{Status: ok(), Command: &pb.TelemetryCommand_RecoverOrphanedTransactionCommand{RecoverOrphanedTransactionCommand: &pb.RecoverOrphanedTransactionCommand{
		Message:       msg,
		TransactionId: transactionID(c.HalfOffset, c.CommitLogOffset),
	}}}
	if err := sess.write(cmd); err != nil {
		s.log.Warn("transaction check-back over Telemetry failed", "client", sess.clientID, "err", err)
		return false
	}
	return true
}
