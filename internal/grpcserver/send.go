package grpcserver

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"time"

	"github.com/flowd-io/flowd/broker"
	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

// SendMessage stores each message through the broker's send path: normal, FIFO (its
// message group picks its queue), delayed (delivery_timestamp rounded up to a delay level)
// or transactional (a half message, resolved by EndTransaction or a check-back).
func (s *Server) SendMessage(ctx context.Context, req *pb.SendMessageRequest) (*pb.SendMessageResponse, error) {
	if len(req.GetMessages()) == 0 {
		return &pb.SendMessageResponse{Status: status(pb.Code_BAD_REQUEST, "the request holds no message")}, nil
	}
	host := bornHost(peerAddr(ctx))
	now := time.Now()
	resp := &pb.SendMessageResponse{}
	for _, m := range req.GetMessages() {
		resp.Entries = append(resp.Entries, s.sendOne(ctx, m, host, now))
	}
	resp.Status = overall(resp.Entries, func(e *pb.SendResultEntry) *pb.Status { return e.Status })
	return resp, nil
}

func (s *Server) sendOne(ctx context.Context, m *pb.Message, host netip.AddrPort, now time.Time) *pb.SendResultEntry {
	r, bad := s.fromProto(m, host, now)
	if bad != nil {
		return &pb.SendResultEntry{Status: status(bad.code, bad.msg), MessageId: m.GetSystemProperties().GetMessageId()}
	}
	res, err := s.b.Produce(ctx, r)
	if err != nil && res.MsgID == "" {
		st := statusOf(err, pb.Code_TOPIC_NOT_FOUND)
		if errors.Is(err, broker.ErrBadMessage) && len(r.Message.Body) > s.b.MaxMessageSize() {
			st.Code = pb.Code_MESSAGE_BODY_TOO_LARGE
		}
		return &pb.SendResultEntry{Status: st, MessageId: m.GetSystemProperties().GetMessageId()}
	}
	e := &pb.SendResultEntry{Status: statusOf(err, pb.Code_TOPIC_NOT_FOUND), MessageId: res.UniqKey, Offset: res.QueueOffset}
	if r.Half {
		e.TransactionId = transactionID(res.HalfOffset, res.CommitLogOffset)
	}
	return e
}

// overall is a response's status from its entries': theirs when they agree, else
// MULTIPLE_RESULTS, as the protocol has it.
func overall[E any](entries []E, st func(E) *pb.Status) *pb.Status {
	if len(entries) == 0 {
		return ok()
	}
	first := st(entries[0])
	for _, e := range entries[1:] {
		if st(e).GetCode() != first.GetCode() {
			return status(pb.Code_MULTIPLE_RESULTS, "the entries have different results")
		}
	}
	return &pb.Status{Code: first.GetCode(), Message: first.GetMessage()}
}

// EndTransaction commits or rolls back a half message named by the transaction id SendMessage
// or a check-back gave.
func (s *Server) EndTransaction(ctx context.Context, req *pb.EndTransactionRequest) (*pb.EndTransactionResponse, error) {
	half, clOffset, err := parseTransactionID(req.GetTransactionId())
	if err != nil {
		return &pb.EndTransactionResponse{Status: status(pb.Code_INVALID_TRANSACTION_ID, err.Error())}, nil
	}
	var outcome int32
	switch req.GetResolution() {
	case pb.TransactionResolution_COMMIT:
		outcome = broker.TransactionCommit
	case pb.TransactionResolution_ROLLBACK:
		outcome = broker.TransactionRollback
	default:
		outcome = broker.TransactionUnknown
	}
	err = s.b.EndTransaction(ctx, broker.EndTransactionRequest{
		ProducerGroup:   grpcProducerGroup(req.GetTopic().GetName()),
		HalfOffset:      half,
		CommitLogOffset: clOffset,
		Outcome:         outcome,
		FromCheck:       req.GetSource() == pb.TransactionSource_SOURCE_SERVER_CHECK,
	})
	return &pb.EndTransactionResponse{Status: statusOf(err, pb.Code_TOPIC_NOT_FOUND)}, nil
}

func bornHost(a net.Addr) netip.AddrPort {
	if t, isTCP := a.(*net.TCPAddr); isTCP {
		return t.AddrPort()
	}
	return netip.AddrPort{}
}
