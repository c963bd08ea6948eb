package broker

import (
	"context"
	"errors"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/protocol"
)

// The answers every handler builds: an error with its RocketMQ response code, a store
// error mapped to the code a client expects, and the answer to a send whose messages are
// stored.

// errorResponse answers req with code and err as its remark.
func errorResponse(req *protocol.Command, code protocol.ResponseCode, err error) *protocol.Command {
	return protocol.NewResponse(req, code, err.Error())
}

// storeErrorResponse maps a store error to the response code a RocketMQ client expects.
func storeErrorResponse(req *protocol.Command, err error) *protocol.Command {
	switch {
	case errors.Is(err, store.ErrHalfMessage):
		return errorResponse(req, protocol.NoPermission, err)
	case errors.Is(err, store.ErrMessageTooLarge):
		return errorResponse(req, protocol.MessageIllegal, err)
	case errors.Is(err, store.ErrFlushTimeout):
		return errorResponse(req, protocol.FlushDiskTimeout, err)
	case errors.Is(err, store.ErrWriteFailed), errors.Is(err, store.ErrClosed):
		return errorResponse(req, protocol.ServiceNotAvailable, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return errorResponse(req, protocol.SystemBusy, err)
	}
	return errorResponse(req, protocol.SystemError, err)
}

// storedUnflushed reports whether a Put that returned err (and a result, when haveResult)
// stored its messages without knowing them durable: the fsync wait timed out, or the request
// was canceled while waiting for it (the store only waits after the append).
func storedUnflushed(err error, haveResult bool) bool {
	if errors.Is(err, store.ErrFlushTimeout) {
		return true
	}
	return haveResult && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
}

// storedResponse answers a send whose messages are stored: SUCCESS, or FLUSH_DISK_TIMEOUT
// when the fsync covering them did not finish in time (err says why). Both carry the message id, queue and
// offset, as RocketMQ's do, because the message is stored and will be delivered: a client
// that saw an error without them would resend it and store a second copy.
//
// The answer's header is h, written straight into the frame (protocol.NewResponseWith), or,
// when h is nil, the caller's to put in ExtFields.
func storedResponse(req *protocol.Command, err error, h protocol.FieldAppender) *protocol.Command {
	code, remark := protocol.Success, ""
	if err != nil {
		code, remark = protocol.FlushDiskTimeout, err.Error()
	}
	if h != nil {
		return protocol.NewResponseWith(req, code, remark, h)
	}
	return protocol.NewResponse(req, code, remark)
}
