package broker

import (
	"errors"
	"fmt"
	"time"

	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

func (b *Broker) processLock(c *remoting.Conn, req *protocol.Command) *protocol.Command {
	var body protocol.LockBatchRequestBody
	if err := protocol.UnmarshalBody(req.Body, &body); err != nil {
		return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("lock body: %w", err))
	}
	if body.ConsumerGroup == "" || body.ClientID == "" {
		return errorResponse(req, protocol.InvalidParameter, errors.New("lock body: consumerGroup and clientId are required"))
	}
	if err := ValidateGroup(body.ConsumerGroup); err != nil {
		return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("lock body: %w", err))
	}
	resp := protocol.NewResponse(req, protocol.Success, "")
	defer b.rebalance.changed(body.ConsumerGroup)
	if req.RequestCode() == protocol.UnlockBatchMQ {
		b.locks.unlock(body.ConsumerGroup, body.ClientID, body.MQSet)
		return resp
	}
	locked := b.locks.lockFrom(body.ConsumerGroup, body.ClientID, c, body.MQSet, time.Now())
	out, err := protocol.MarshalBody(protocol.LockBatchResponseBody{LockOKMQSet: locked})
	if err != nil {
		return errorResponse(req, protocol.SystemError, err)
	}
	resp.Body = out
	return resp
}
