package broker

import (
	"context"
	"fmt"
	"strings"

	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// processSendBack serves CONSUMER_SEND_MSG_BACK: a message the client failed to consume goes
// to the group's retry topic after a delay, or to its dead-letter topic after the maximum
// number of attempts.
func (b *Broker) processSendBack(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
	if err := b.writable(); err != nil {
		return replicationRefusal(req, err)
	}
	var h protocol.ConsumerSendMsgBackRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	if resp := b.ensureGroup(req, h.Group); resp != nil {
		return resp
	}
	raw, err := b.store.MessageAt(h.Offset)
	if err != nil {
		return errorResponse(req, protocol.SystemError, fmt.Errorf("send back: look up message at commit-log offset %d: %w", h.Offset, err))
	}
	orig, _, err := protocol.DecodeStored(raw)
	if err != nil {
		return errorResponse(req, protocol.SystemError, fmt.Errorf("send back: message at %d: %w", h.Offset, err))
	}
	maxTimes := int(h.MaxReconsumeTimes)
	if maxTimes <= 0 {
		if g, ok := b.groups.get(h.Group); ok && g.RetryMaxTimes > 0 {
			maxTimes = g.RetryMaxTimes
		} else {
			maxTimes = b.cfg.MaxReconsumeTimes
		}
	}
	props := originProperties(orig, h.OriginMsgID)
	m := &protocol.MessageExt{
		Message:        protocol.Message{Flag: orig.Flag, Properties: props, Body: orig.Body},
		SysFlag:        orig.SysFlag,
		BornTimestamp:  orig.BornTimestamp,
		BornHost:       orig.BornHost,
		ReconsumeTimes: orig.ReconsumeTimes + 1,
	}
	var topic string
	if int(orig.ReconsumeTimes) >= maxTimes || h.DelayLevel < 0 {
		topic = DLQTopicPrefix + h.Group
	} else {
		topic = RetryTopicPrefix + h.Group
	}
	if _, err := b.internalTopic(topic); err != nil {
		return errorResponse(req, protocol.SystemError, err)
	}
	m.Topic = topic
	if strings.HasPrefix(topic, RetryTopicPrefix) {
		level := int(h.DelayLevel)
		if level == 0 {
			level = 3 + int(orig.ReconsumeTimes)
		}
		b.delayed(m, level)
	}
	if _, err := b.store.Put(ctx, m); err != nil {
		return storeErrorResponse(req, err)
	}
	return protocol.NewResponse(req, protocol.Success, "")
}

// originProperties are orig's properties for its copy in a retry or dead-letter topic: the
// topic and message id it first had, unless an earlier copy recorded them (RETRY_TOPIC,
// ORIGIN_MESSAGE_ID; id is the client's word for the latter, else the message's unique key,
// else its offset id), and no delay level of its own. The map is orig's, changed in place.
func originProperties(orig *protocol.MessageExt, id string) map[string]string {
	props := orig.Properties
	if props == nil {
		props = map[string]string{}
	}
	if _, ok := props[protocol.PropertyRetryTopic]; !ok {
		props[protocol.PropertyRetryTopic] = orig.Topic
	}
	if _, ok := props[protocol.PropertyOriginMsgID]; !ok {
		if id == "" {
			id = props[protocol.PropertyUniqueKey]
		}
		if id == "" {
			id = protocol.OffsetMsgID(orig.StoreHost, orig.CommitLogOffset)
		}
		props[protocol.PropertyOriginMsgID] = id
	}
	delete(props, protocol.PropertyDelayLevel)
	return props
}
