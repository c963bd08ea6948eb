package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/protocol"
	"github.com/flowd-io/flowd/remoting"
)

// serveBroker is the broker listener's handler: one call per request, each on its own
// goroutine, so a parked pull does not hold up the connection's other requests.
func (b *Broker) serveBroker(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
	switch req.RequestCode() {
	case protocol.SendMessage, protocol.SendMessageV2, protocol.SendBatchMessage:
		return b.processSend(ctx, c, req)
	case protocol.PullMessage:
		return b.processPull(ctx, c, req)
	case protocol.HeartBeat:
		return b.processHeartbeat(c, req)
	case protocol.UnregisterClient:
		return b.processUnregister(req)
	case protocol.GetConsumerListByGroup:
		return b.processConsumerList(req)
	case protocol.QueryConsumerOffset:
		return b.processQueryOffset(req)
	case protocol.UpdateConsumerOffset:
		return b.processUpdateOffset(req)
	case protocol.GetMaxOffset, protocol.GetMinOffset:
		return b.processMinMaxOffset(req)
	case protocol.SearchOffsetByTimestamp:
		return b.processSearchOffset(req)
	case protocol.ConsumerSendMsgBack:
		return b.processSendBack(ctx, c, req)
	case protocol.LockBatchMQ, protocol.UnlockBatchMQ:
		return b.processLock(req)
	case protocol.ViewMessageByID:
		return b.processViewMessage(req)
	}
	return b.serveCommon(req)
}

// serveNamesrv is the name service listener's handler.
func (b *Broker) serveNamesrv(_ context.Context, _ *remoting.Conn, req *protocol.Command) *protocol.Command {
	return b.serveCommon(req)
}

// serveCommon answers what both listeners answer: routes and topic administration.
func (b *Broker) serveCommon(req *protocol.Command) *protocol.Command {
	switch req.RequestCode() {
	case protocol.GetRouteInfoByTopic:
		return b.processRoute(req)
	case protocol.UpdateAndCreateTopic:
		return b.processCreateTopic(req)
	case protocol.DeleteTopicInBroker, protocol.DeleteTopicInNamesrv:
		return b.processDeleteTopic(req)
	}
	return protocol.NewResponse(req, protocol.RequestCodeNotSupported, fmt.Sprintf("request code %d (%s) is not supported", req.Code, req.RequestCode()))
}

// processRoute serves GET_ROUTEINFO_BY_TOPIC: every topic lives on this broker.
func (b *Broker) processRoute(req *protocol.Command) *protocol.Command {
	var h protocol.GetRouteInfoRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	tc, ok := b.topics.get(h.Topic)
	if !ok && strings.HasPrefix(h.Topic, RetryTopicPrefix) && ValidateTopic(h.Topic) == nil {
		// A consumer asks for its group's retry topic as it starts, often before its first
		// heartbeat would have created it; creating it here spares it a rebalance period.
		var err error
		if tc, err = b.internalTopic(h.Topic); err != nil {
			return errorResponse(req, protocol.SystemError, err)
		}
		ok = true
	}
	if !ok || (h.Topic == protocol.AutoCreateTopicKey && b.cfg.DisableAutoCreateTopics) {
		return protocol.NewResponse(req, protocol.TopicNotExist, "No topic route info in name server for the topic: "+h.Topic)
	}
	route := protocol.TopicRouteData{
		QueueDatas: []protocol.QueueData{{
			BrokerName:     b.cfg.BrokerName,
			ReadQueueNums:  int32(tc.ReadQueueNums),
			WriteQueueNums: int32(tc.WriteQueueNums),
			Perm:           int32(tc.Perm),
			TopicSysFlag:   int32(tc.TopicSysFlag),
		}},
		BrokerDatas: []protocol.BrokerData{{
			Cluster:     b.cfg.Cluster,
			BrokerName:  b.cfg.BrokerName,
			BrokerAddrs: map[int64]string{0: b.addr},
		}},
	}
	body, err := route.Encode()
	if err != nil {
		return errorResponse(req, protocol.SystemError, err)
	}
	resp := protocol.NewResponse(req, protocol.Success, "")
	resp.Body = body
	return resp
}

func (b *Broker) processCreateTopic(req *protocol.Command) *protocol.Command {
	var h protocol.CreateTopicRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	if isSystemTopic(h.Topic) {
		return errorResponse(req, protocol.NoPermission, fmt.Errorf("topic %q is reserved for the broker", h.Topic))
	}
	tc := TopicConfig{Name: h.Topic, ReadQueueNums: int(h.ReadQueueNums), WriteQueueNums: int(h.WriteQueueNums), Perm: int(h.Perm), TopicSysFlag: int(h.TopicSysFlag), Order: h.Order}
	created, err := b.topics.put(tc)
	if err != nil {
		code := protocol.SystemError
		if errors.Is(err, ErrBadTopic) {
			code = protocol.InvalidParameter
		}
		return errorResponse(req, code, err)
	}
	if created {
		b.log.Info("topic created", "topic", tc.Name, "queues", tc.WriteQueueNums)
		b.events.emit(Event{Type: TopicCreated, Topic: tc.Name, Queues: tc.WriteQueueNums})
	}
	return protocol.NewResponse(req, protocol.Success, "")
}

func (b *Broker) processDeleteTopic(req *protocol.Command) *protocol.Command {
	var h protocol.DeleteTopicRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	if isSystemTopic(h.Topic) {
		return errorResponse(req, protocol.NoPermission, fmt.Errorf("topic %q is reserved for the broker", h.Topic))
	}
	removed, err := b.topics.remove(h.Topic)
	if err != nil {
		return errorResponse(req, protocol.SystemError, err)
	}
	if removed {
		if err := b.store.DeleteTopic(h.Topic); err != nil {
			return errorResponse(req, protocol.SystemError, err)
		}
		b.offsets.removeTopic(h.Topic)
		b.log.Info("topic deleted", "topic", h.Topic)
		b.events.emit(Event{Type: TopicDeleted, Topic: h.Topic})
	}
	return protocol.NewResponse(req, protocol.Success, "")
}

// processHeartbeat registers the client's consumer groups and subscriptions.
func (b *Broker) processHeartbeat(c *remoting.Conn, req *protocol.Command) *protocol.Command {
	hb, err := protocol.DecodeHeartbeatData(req.Body)
	if err != nil {
		return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("heartbeat body: %w", err))
	}
	if hb.ClientID == "" {
		return errorResponse(req, protocol.InvalidParameter, errors.New("heartbeat body: clientID is empty"))
	}
	now := time.Now()
	var changes []memberChange
	for _, cd := range hb.ConsumerDataSet {
		if cd.GroupName == "" {
			return errorResponse(req, protocol.InvalidParameter, errors.New("heartbeat body: a consumer group name is empty"))
		}
		if resp := b.ensureGroup(req, cd.GroupName); resp != nil {
			return resp
		}
		if _, err := b.internalTopic(RetryTopicPrefix + cd.GroupName); err != nil {
			return errorResponse(req, protocol.SystemError, err)
		}
		subs := make([]Subscription, 0, len(cd.SubscriptionDataSet))
		for _, sd := range cd.SubscriptionDataSet {
			subs = append(subs, Subscription{Topic: sd.Topic, Expression: sd.SubString, ExpressionType: sd.ExpressionType, Tags: sd.TagsSet, Codes: sd.CodeSet, Version: sd.SubVersion})
		}
		if b.consumers.heartbeat(cd.GroupName, hb.ClientID, c, cd.ConsumeType, cd.MessageModel, cd.ConsumeFromWhere, subs, now) {
			b.log.Debug("consumer joined", "group", cd.GroupName, "client", hb.ClientID, "remote", c.RemoteAddr().String())
			changes = append(changes, memberChange{group: cd.GroupName, clientID: hb.ClientID, joined: true})
		}
	}
	b.membersChanged(changes)
	return protocol.NewResponse(req, protocol.Success, "")
}

func (b *Broker) processUnregister(req *protocol.Command) *protocol.Command {
	var h protocol.UnregisterClientRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	if h.ConsumerGroup != "" {
		b.membersChanged(b.consumers.unregister(h.ConsumerGroup, h.ClientID))
	}
	return protocol.NewResponse(req, protocol.Success, "")
}

func (b *Broker) processConsumerList(req *protocol.Command) *protocol.Command {
	var h protocol.GetConsumerListByGroupRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	ids := b.consumers.clientIDs(h.ConsumerGroup)
	if ids == nil {
		ids = []string{}
	}
	body, err := protocol.MarshalBody(protocol.ConsumerListBody{ConsumerIDList: ids})
	if err != nil {
		return errorResponse(req, protocol.SystemError, err)
	}
	resp := protocol.NewResponse(req, protocol.Success, "")
	resp.Body = body
	return resp
}

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
		if h.SetZeroIfNotFound == nil || !*h.SetZeroIfNotFound {
			return protocol.NewResponse(req, protocol.QueryNotFound, fmt.Sprintf("group %q has no offset for %s queue %d", h.ConsumerGroup, h.Topic, h.QueueID))
		}
		off = 0
	}
	resp := protocol.NewResponse(req, protocol.Success, "")
	(&protocol.OffsetResponseHeader{Offset: off}).EncodeTo(resp.ExtFields)
	return resp
}

func (b *Broker) processUpdateOffset(req *protocol.Command) *protocol.Command {
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
	b.commitOffset(h.ConsumerGroup, h.Topic, h.QueueID, h.CommitOffset)
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

// processSendBack serves CONSUMER_SEND_MSG_BACK: a message the client failed to consume goes
// to the group's retry topic after a delay, or to its dead-letter topic after the maximum
// number of attempts.
func (b *Broker) processSendBack(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
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
	props := orig.Properties
	if props == nil {
		props = map[string]string{}
	}
	if _, ok := props[protocol.PropertyRetryTopic]; !ok {
		props[protocol.PropertyRetryTopic] = orig.Topic
	}
	if _, ok := props[protocol.PropertyOriginMsgID]; !ok {
		id := h.OriginMsgID
		if id == "" {
			id = props[protocol.PropertyUniqueKey]
		}
		if id == "" {
			id = protocol.OffsetMsgID(orig.StoreHost, orig.CommitLogOffset)
		}
		props[protocol.PropertyOriginMsgID] = id
	}
	delete(props, protocol.PropertyDelayLevel)
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

func (b *Broker) processLock(req *protocol.Command) *protocol.Command {
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
	if req.RequestCode() == protocol.UnlockBatchMQ {
		b.locks.unlock(body.ConsumerGroup, body.ClientID, body.MQSet)
		return resp
	}
	locked := b.locks.lock(body.ConsumerGroup, body.ClientID, body.MQSet, time.Now())
	out, err := protocol.MarshalBody(protocol.LockBatchResponseBody{LockOKMQSet: locked})
	if err != nil {
		return errorResponse(req, protocol.SystemError, err)
	}
	resp.Body = out
	return resp
}

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

// checkQueue refuses a request about a queue that cannot exist: a topic name RocketMQ would
// refuse, a negative queue id, or a queue id beyond an existing topic's read queues. A valid
// name of a topic that does not exist (yet) passes: RocketMQ answers offset queries about it
// with 0, and clients ask before the first send creates the topic.
func (b *Broker) checkQueue(req *protocol.Command, topic string, queueID int32) *protocol.Command {
	if err := ValidateTopic(topic); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	if queueID < 0 || queueID >= maxQueues {
		return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("queueId %d is illegal: it must be within 0..%d", queueID, maxQueues-1))
	}
	if tc, ok := b.topics.get(topic); ok && int(queueID) >= tc.ReadQueueNums {
		return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("queueId %d is illegal: topic %q has %d read queues", queueID, topic, tc.ReadQueueNums))
	}
	return nil
}

// checkOffsetRequest is checkQueue plus the group name, for requests that read or write a
// group's committed offset: the group is part of the key persisted in consumerOffset.json.
func (b *Broker) checkOffsetRequest(req *protocol.Command, group, topic string, queueID int32) *protocol.Command {
	if err := ValidateGroup(group); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	return b.checkQueue(req, topic, queueID)
}
