package broker

import (
	"errors"
	"strings"

	"github.com/flowd-io/flowd/protocol"
)

// processRoute serves GET_ROUTEINFO_BY_TOPIC: this broker's queues of the topic, then those
// Config.Peers reports on the other brokers of the cluster.
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
	if h.Topic == protocol.AutoCreateTopicKey && b.cfg.DisableAutoCreateTopics {
		ok = false
	}
	var route protocol.TopicRouteData
	if ok {
		route = protocol.TopicRouteData{
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
				BrokerAddrs: b.ownAddrs(),
			}},
		}
	}
	if b.cfg.Peers != nil {
		// Other brokers' queues of the topic: a topic this broker has not (yet) got is still
		// routed to the brokers that have it.
		b.peerRoute(&route, h.Topic)
	}
	if len(route.QueueDatas) == 0 {
		return protocol.NewResponse(req, protocol.TopicNotExist, "No topic route info in name server for the topic: "+h.Topic)
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
	tc := TopicConfig{Name: h.Topic, ReadQueueNums: int(h.ReadQueueNums), WriteQueueNums: int(h.WriteQueueNums), Perm: int(h.Perm), TopicSysFlag: int(h.TopicSysFlag), Order: h.Order}
	if _, err := b.PutTopic(tc); err != nil {
		code := protocol.SystemError
		switch {
		case errors.Is(err, ErrReserved):
			code = protocol.NoPermission
		case errors.Is(err, ErrBadTopic):
			code = protocol.InvalidParameter
		}
		return errorResponse(req, code, err)
	}
	return protocol.NewResponse(req, protocol.Success, "")
}

func (b *Broker) processDeleteTopic(req *protocol.Command) *protocol.Command {
	var h protocol.DeleteTopicRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	err := b.DeleteTopic(h.Topic)
	switch {
	case err == nil, errors.Is(err, ErrNotFound):
		// Deleting a topic that is not there succeeds, as in RocketMQ.
		return protocol.NewResponse(req, protocol.Success, "")
	case errors.Is(err, ErrReserved):
		return errorResponse(req, protocol.NoPermission, err)
	default:
		return errorResponse(req, protocol.SystemError, err)
	}
}
