package broker

import (
	"errors"
	"fmt"
	"strings"

	"github.com/flowd-io/flowd/protocol"
)

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
		// The group is created with it, so that both stay within Config.MaxGroups.
		if resp := b.ensureGroup(req, strings.TrimPrefix(h.Topic, RetryTopicPrefix)); resp != nil {
			return protocol.NewResponse(req, protocol.TopicNotExist, "No topic route info for the topic: "+h.Topic+": "+resp.Remark)
		}
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
	if _, ok := b.topics.get(h.Topic); !ok {
		return protocol.NewResponse(req, protocol.Success, "")
	}
	// The messages go first, then the config: a crash in between leaves the topic listed
	// but empty (deleting it again finishes the job). The other order could leave the
	// messages of a topic no longer listed, and the next send re-creating it would bring
	// them back.
	if err := b.store.DeleteTopic(h.Topic); err != nil {
		return errorResponse(req, protocol.SystemError, err)
	}
	removed, err := b.topics.remove(h.Topic)
	if err != nil {
		return errorResponse(req, protocol.SystemError, err)
	}
	if removed {
		b.offsets.removeTopic(h.Topic)
		b.log.Info("topic deleted", "topic", h.Topic)
		b.events.emit(Event{Type: TopicDeleted, Topic: h.Topic})
	}
	return protocol.NewResponse(req, protocol.Success, "")
}
