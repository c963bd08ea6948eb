package broker

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// processLockOwners answers GET_LOCK_OWNERS, a flowd extension: who holds the locks of a
// group's queues of one topic. flowd's consumers lock every queue they read, so this is the
// group's current assignment as one table every member reads alike; they allocate from it.
// The answer also carries each member's reported allocator, so that members agree on the
// strategy they allocate with.
func (b *Broker) processLockOwners(req *protocol.Command) *protocol.Command {
	var body protocol.LockOwnersRequestBody
	if err := protocol.UnmarshalBody(req.Body, &body); err != nil {
		return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("lock owners body: %w", err))
	}
	if body.ConsumerGroup == "" || body.Topic == "" {
		return errorResponse(req, protocol.InvalidParameter, errors.New("lock owners body: consumerGroup and topic are required"))
	}
	if err := ValidateGroup(body.ConsumerGroup); err != nil {
		return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("lock owners body: %w", err))
	}
	if err := ValidateTopic(body.Topic); err != nil {
		return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("lock owners body: %w", err))
	}
	owners := map[string][]protocol.MessageQueue{}
	for mq, clientID := range b.locks.held(body.ConsumerGroup, time.Now()) {
		if mq.Topic == body.Topic {
			owners[clientID] = append(owners[clientID], mq)
		}
	}
	for _, mqs := range owners {
		slices.SortFunc(mqs, protocol.MessageQueue.Compare)
	}
	out, err := protocol.MarshalBody(&protocol.LockOwnersResponseBody{Owners: owners, Allocators: b.consumers.allocators(body.ConsumerGroup)})
	if err != nil {
		return errorResponse(req, protocol.SystemError, err)
	}
	resp := protocol.NewResponse(req, protocol.Success, "")
	resp.Body = out
	return resp
}
