package grpcserver

import (
	"context"
	"errors"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/broker/store"
	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

func ok() *pb.Status { return &pb.Status{Code: pb.Code_OK, Message: "OK"} }

func status(code pb.Code, msg string) *pb.Status { return &pb.Status{Code: code, Message: msg} }

// statusOf maps a broker error to the protocol's status: a client's mistake is a 4xxxx code
// naming it, only a failure of flowd's own is INTERNAL_SERVER_ERROR.
func statusOf(err error, notFound pb.Code) *pb.Status {
	if st := popStatus(err); st != nil {
		return st
	}
	switch {
	case err == nil:
		return ok()
	case errors.Is(err, broker.ErrNotFound):
		return status(notFound, err.Error())
	case errors.Is(err, broker.ErrBadMessage):
		return status(pb.Code_BAD_REQUEST, err.Error())
	case errors.Is(err, broker.ErrReserved):
		return status(pb.Code_FORBIDDEN, err.Error())
	case errors.Is(err, broker.ErrLimit):
		return status(pb.Code_TOO_MANY_REQUESTS, err.Error())
	case errors.Is(err, broker.ErrTransaction):
		return status(pb.Code_INVALID_TRANSACTION_ID, err.Error())
	case errors.Is(err, broker.ErrNotMaster), errors.Is(err, broker.ErrNotEnoughInSync):
		// A replica, a fenced master, or too few members in sync: nothing was stored.
		return status(pb.Code_HA_NOT_AVAILABLE, err.Error())
	case errors.Is(err, broker.ErrNotReplicated):
		return status(pb.Code_SLAVE_PERSISTENCE_TIMEOUT, err.Error())
	case errors.Is(err, store.ErrFlushTimeout):
		return status(pb.Code_MASTER_PERSISTENCE_TIMEOUT, err.Error())
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return status(pb.Code_PROXY_TIMEOUT, err.Error())
	}
	return status(pb.Code_INTERNAL_SERVER_ERROR, err.Error())
}
