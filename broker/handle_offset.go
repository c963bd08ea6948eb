package broker

import (
	"fmt"

	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

func (b *Broker) processQueryOffset(req *protocol.Command) *protocol.Command {
	var h protocol.QueryConsumerOffsetRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	if resp := b.checkOffsetRequest(req, h.ConsumerGroup, h.Topic, h.QueueID); resp != nil {
		return resp
	}
	off, ok := b.offsets.query(h.ConsumerGroup, h.Topic, h.QueueID)
	if !ok {
		// RocketMQ's rule for a group without an offset: start at 0 while the queue still
		// holds its first message and that message is in memory, so a group reads a queue
		// created (or first written) after it started from the beginning instead of from
		// wherever the queue's end is when it first looks. Otherwise, or when the client
		// asks not to be given 0 (setZeroIfNotFound false), the client decides from its
		// consume-from-where setting.
		if h.SetZeroIfNotFound != nil && !*h.SetZeroIfNotFound {
			return protocol.NewResponse(req, protocol.QueryNotFound, fmt.Sprintf("group %q has no offset for %s queue %d", h.ConsumerGroup, h.Topic, h.QueueID))
		}
		if b.store.MinOffset(h.Topic, h.QueueID) > 0 || b.store.InDisk(h.Topic, h.QueueID, 0) {
			return protocol.NewResponse(req, protocol.QueryNotFound, fmt.Sprintf("group %q has no offset for %s queue %d, whose first message is no longer in memory", h.ConsumerGroup, h.Topic, h.QueueID))
		}
		off = 0
	}
	resp := protocol.NewResponse(req, protocol.Success, "")
	(&protocol.OffsetResponseHeader{Offset: off}).EncodeTo(resp.ExtFields)
	return resp
}

// processUpdateOffset serves UPDATE_CONSUMER_OFFSET. A commit for a queue another client of
// the group has locked is refused with NO_PERMISSION (see commitFrom). An unknown group is
// created (within Config.MaxGroups) as a pull would create it, so that offsets exist only
// for groups the table bounds.
func (b *Broker) processUpdateOffset(c *remoting.Conn, req *protocol.Command) *protocol.Command {
	var h protocol.UpdateConsumerOffsetRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	if h.CommitOffset < 0 {
		return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("commitOffset %d is negative", h.CommitOffset))
	}
	if resp := b.checkOffsetRequest(req, h.ConsumerGroup, h.Topic, h.QueueID); resp != nil {
		return resp
	}
	if _, ok := b.topics.get(h.Topic); !ok {
		return errorResponse(req, protocol.TopicNotExist, fmt.Errorf("topic %q does not exist", h.Topic))
	}
	if resp := b.ensureGroup(req, h.ConsumerGroup); resp != nil {
		return resp
	}
	if err := b.commitFrom(c, h.ConsumerGroup, h.Topic, h.QueueID, h.CommitOffset); err != nil {
		b.log.Info("commit refused", "group", h.ConsumerGroup, "remote", c.RemoteAddr().String(), "err", err)
		return errorResponse(req, protocol.NoPermission, err)
	}
	return protocol.NewResponse(req, protocol.Success, "")
}

func (b *Broker) processMinMaxOffset(req *protocol.Command) *protocol.Command {
	var topic string
	var qid int32
	if req.RequestCode() == protocol.GetMaxOffset {
		var h protocol.GetMaxOffsetRequestHeader
		if err := req.DecodeHeader(&h); err != nil {
			return errorResponse(req, protocol.InvalidParameter, err)
		}
		topic, qid = h.Topic, h.QueueID
	} else {
		var h protocol.GetMinOffsetRequestHeader
		if err := req.DecodeHeader(&h); err != nil {
			return errorResponse(req, protocol.InvalidParameter, err)
		}
		topic, qid = h.Topic, h.QueueID
	}
	if resp := b.checkQueue(req, topic, qid); resp != nil {
		return resp
	}
	off := b.store.MinOffset(topic, qid)
	if req.RequestCode() == protocol.GetMaxOffset {
		off = b.store.MaxOffset(topic, qid)
	}
	resp := protocol.NewResponse(req, protocol.Success, "")
	(&protocol.OffsetResponseHeader{Offset: off}).EncodeTo(resp.ExtFields)
	return resp
}

func (b *Broker) processSearchOffset(req *protocol.Command) *protocol.Command {
	var h protocol.SearchOffsetRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	if resp := b.checkQueue(req, h.Topic, h.QueueID); resp != nil {
		return resp
	}
	resp := protocol.NewResponse(req, protocol.Success, "")
	(&protocol.OffsetResponseHeader{Offset: b.store.OffsetByTimestamp(h.Topic, h.QueueID, h.Timestamp)}).EncodeTo(resp.ExtFields)
	return resp
}
