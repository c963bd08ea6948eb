package broker

import (
	"errors"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/protocol"
)

func (b *Broker) processViewMessage(req *protocol.Command) *protocol.Command {
	var h protocol.ViewMessageRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	raw, err := b.store.MessageAt(h.Offset)
	if err != nil {
		code := protocol.SystemError
		if errors.Is(err, store.ErrNotFound) {
			code = protocol.QueryNotFound
		}
		return errorResponse(req, code, err)
	}
	resp := protocol.NewResponse(req, protocol.Success, "")
	resp.Body = raw
	return resp
}
