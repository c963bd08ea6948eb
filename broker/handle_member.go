package broker

import (
	"errors"
	"fmt"
	"time"

	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// maxSubscriptions caps the topics one heartbeat may subscribe a group to.
const maxSubscriptions = 1024

// processHeartbeat registers the client's consumer groups and subscriptions.
func (b *Broker) processHeartbeat(c *remoting.Conn, req *protocol.Command) *protocol.Command {
	hb, err := protocol.DecodeHeartbeatData(req.Body)
	if err != nil {
		return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("heartbeat body: %w", err))
	}
	if hb.ClientID == "" {
		return errorResponse(req, protocol.InvalidParameter, errors.New("heartbeat body: clientID is empty"))
	}
	// Check the whole body before anything is created or registered.
	for _, cd := range hb.ConsumerDataSet {
		if cd.GroupName == "" {
			return errorResponse(req, protocol.InvalidParameter, errors.New("heartbeat body: a consumer group name is empty"))
		}
		if len(cd.SubscriptionDataSet) > maxSubscriptions {
			return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("heartbeat body: group %q subscribes to %d topics, more than %d", cd.GroupName, len(cd.SubscriptionDataSet), maxSubscriptions))
		}
		for _, sd := range cd.SubscriptionDataSet {
			// Subscriptions are kept per topic name for the group's life: names no topic
			// could have would pile up in the table.
			if err := ValidateTopic(sd.Topic); err != nil {
				return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("heartbeat body: group %q subscription: %w", cd.GroupName, err))
			}
		}
	}
	now := time.Now()
	var changes []memberChange
	defer func() { b.membersChanged(changes) }() // the groups joined before a refusal are told too
	for _, cd := range hb.ConsumerDataSet {
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
		joined, allocatorChanged := b.consumers.heartbeat(cd.GroupName, hb.ClientID, c, cd.ConsumeType, cd.MessageModel, cd.ConsumeFromWhere, cd.Allocator, subs, now)
		switch {
		case joined:
			b.log.Debug("consumer joined", "group", cd.GroupName, "client", hb.ClientID, "remote", c.RemoteAddr().String())
			changes = append(changes, memberChange{group: cd.GroupName, clientID: hb.ClientID, joined: true})
		case allocatorChanged:
			// The members allocate by what the group reports: have them read it again.
			b.log.Info("consumer changed its allocator", "group", cd.GroupName, "client", hb.ClientID, "allocator", cd.Allocator)
			changes = append(changes, memberChange{group: cd.GroupName, clientID: hb.ClientID, joined: true})
		}
	}
	for _, pd := range hb.ProducerDataSet {
		if pd.GroupName != "" {
			b.producers.seen(pd.GroupName, hb.ClientID, c, now) // for transaction check-backs
		}
	}
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
	if h.ProducerGroup != "" {
		b.producers.unregister(h.ProducerGroup, h.ClientID)
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
