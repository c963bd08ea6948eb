package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// Request–reply (RocketMQ 4.6+). The broker stamps its cluster name on every message it
// stores (stampStored), so that a responder knows the reply topic; the responder sends the
// reply with SEND_REPLY_MESSAGE, which the broker stores in the reply topic and pushes to the
// requesting client (PUSH_REPLY_MESSAGE_TO_CLIENT) on that client's connection.

// replyPushTimeout bounds the push of a reply to its requester, as Java's 3 s does: the
// responder is waiting for the answer.
const replyPushTimeout = 3 * time.Second

// replyTopicConfig is the cluster's reply topic, which the broker creates at start as Java's
// does: one queue, readable and writable.
func (b *Broker) replyTopicConfig() TopicConfig {
	return TopicConfig{Name: protocol.ReplyTopic(b.cfg.Cluster), ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermRead | protocol.PermWrite}
}

// stampStored adds PropertyCluster to the properties of a message about to be stored, and
// returns them (never nil). A request (a message with PropertyReplyToClient that is not a
// reply) also registers its connection as the requesting client's: the reply may come back
// before the client's first heartbeat reaches this broker (RocketMQ's Go client heartbeats
// every 30 s).
func (b *Broker) stampStored(c *remoting.Conn, group string, props map[string]string) map[string]string {
	if props == nil {
		props = map[string]string{}
	}
	props[protocol.PropertyCluster] = b.cfg.Cluster
	if id := props[protocol.PropertyReplyToClient]; id != "" && c != nil && props[protocol.PropertyMessageType] != protocol.ReplyMessageType {
		b.producers.seen(cmp.Or(group, id), id, c, time.Now())
	}
	return props
}

// stampStoredRaw is stampStored on a raw property block: it appends to dst the block with
// PropertyCluster set in place (protocol.AppendSetProperty) and returns it.
func (b *Broker) stampStoredRaw(dst []byte, c *remoting.Conn, group, raw string) []byte {
	dst = protocol.AppendSetProperty(dst, raw, protocol.PropertyCluster, b.cfg.Cluster)
	if c == nil {
		return dst
	}
	if id, _ := protocol.PropertyIn(raw, protocol.PropertyReplyToClient); id != "" {
		if typ, _ := protocol.PropertyIn(raw, protocol.PropertyMessageType); typ != protocol.ReplyMessageType {
			b.producers.seen(cmp.Or(group, id), id, c, time.Now())
		}
	}
	return dst
}

// ErrRequesterGone is the cause in the remark of a SEND_REPLY_MESSAGE whose reply was stored
// but could not be pushed: the requesting client has no connection to this broker.
var ErrRequesterGone = errors.New("requesting client not connected")

// processSendReply serves SEND_REPLY_MESSAGE (324) and V2 (325): store the reply, then push
// it to the client named in its REPLY_TO_CLIENT. As Java's broker, a reply that could not be
// pushed is stored all the same and answered with SYSTEM_ERROR saying why.
func (b *Broker) processSendReply(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
	if err := b.writable(); err != nil {
		return replicationRefusal(req, err)
	}
	h := new(protocol.SendMessageRequestHeader)
	var err error
	if req.RequestCode() == protocol.SendReplyMessageV2 {
		err = h.DecodeV2(req.ExtFields)
	} else {
		err = h.Decode(req.ExtFields)
	}
	if err != nil {
		return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("decode %s header: %w", req.RequestCode(), err))
	}
	props, err := protocol.DecodeProperties([]byte(h.Properties))
	if err != nil {
		return errorResponse(req, protocol.MessageIllegal, fmt.Errorf("properties: %w", err))
	}
	tc, ok := b.topics.get(h.Topic)
	if !ok {
		return errorResponse(req, protocol.TopicNotExist, fmt.Errorf("topic[%s] not exist, reply to %s", h.Topic, protocol.ReplyTopic(b.cfg.Cluster)))
	}
	if !tc.Writable() {
		return errorResponse(req, protocol.NoPermission, fmt.Errorf("topic %q is not writable (perm %d)", h.Topic, tc.Perm))
	}
	if len(req.Body) > b.cfg.MaxMessageSize {
		return errorResponse(req, protocol.MessageIllegal, fmt.Errorf("message body of %d bytes exceeds the %d-byte limit", len(req.Body), b.cfg.MaxMessageSize))
	}
	queueID := h.QueueID
	if queueID < 0 || int(queueID) >= tc.WriteQueueNums {
		queueID = rand.Int32N(int32(tc.WriteQueueNums))
	}
	m := protocol.MessageExt{
		Message:        protocol.Message{Topic: h.Topic, Flag: h.Flag, Properties: b.stampStored(nil, "", props), Body: req.Body},
		QueueID:        queueID,
		SysFlag:        h.SysFlag &^ protocol.MsgTransactionMask,
		BornTimestamp:  h.BornTimestamp,
		BornHost:       addrPort(c.RemoteAddr()),
		ReconsumeTimes: h.ReconsumeTimes,
	}
	res, err := b.store.Put(ctx, &m)
	if err != nil && !storedUnflushed(err, res.MsgID != "") {
		return storeErrorResponse(req, err)
	}
	resp := storedResponse(req, err, nil)
	(&protocol.SendMessageResponseHeader{MsgID: res.MsgID, QueueID: m.QueueID, QueueOffset: res.QueueOffset}).EncodeTo(resp.ExtFields)
	if err := b.pushReply(ctx, h, &m); err != nil {
		b.log.Warn("reply stored but not pushed", "topic", h.Topic, "correlationId", props[protocol.PropertyCorrelationID], "err", err)
		resp.Code = int32(protocol.SystemError)
		resp.Remark = err.Error()
	}
	return resp
}

// pushReply sends the stored reply m to the client its REPLY_TO_CLIENT names.
func (b *Broker) pushReply(ctx context.Context, h *protocol.SendMessageRequestHeader, m *protocol.MessageExt) error {
	clientID := m.Properties[protocol.PropertyReplyToClient]
	if clientID == "" {
		return fmt.Errorf("push reply: property %s is missing", protocol.PropertyReplyToClient)
	}
	conn := b.clientConn(clientID)
	if conn == nil {
		return fmt.Errorf("push reply to %s: %w", clientID, ErrRequesterGone)
	}
	ph := &protocol.ReplyMessageRequestHeader{
		ProducerGroup: h.ProducerGroup, Topic: m.Topic, DefaultTopic: h.DefaultTopic,
		DefaultTopicQueueNums: h.DefaultTopicQueueNums, QueueID: m.QueueID, SysFlag: m.SysFlag,
		BornTimestamp: m.BornTimestamp, Flag: m.Flag, Properties: protocol.EncodeProperties(m.Properties),
		ReconsumeTimes: m.ReconsumeTimes, UnitMode: h.UnitMode,
		BornHost: m.BornHost.String(), StoreHost: m.StoreHost.String(), StoreTimestamp: m.StoreTimestamp,
	}
	ctx, cancel := context.WithTimeout(ctx, replyPushTimeout)
	defer cancel()
	resp, err := conn.Invoke(ctx, protocol.NewRequestWith(protocol.PushReplyMessageToClient, ph, m.Body))
	if err != nil {
		return fmt.Errorf("push reply to %s: %w", clientID, err)
	}
	if resp.ResponseCode() != protocol.Success {
		return fmt.Errorf("push reply to %s: %s: %s", clientID, resp.ResponseCode(), resp.Remark)
	}
	return nil
}

// clientConn finds a live connection of the client: the most recently seen of its producer
// connections, else one of its consumer connections.
func (b *Broker) clientConn(clientID string) *remoting.Conn {
	if c := b.producers.clientConn(clientID); c != nil {
		return c
	}
	b.consumers.mu.Lock()
	defer b.consumers.mu.Unlock()
	for _, g := range b.consumers.groups {
		if m := g.members[clientID]; m != nil && m.conn != nil {
			return m.conn
		}
	}
	return nil
}

// clientConn returns the most recently seen connection of clientID in any producer group.
func (m *producerManager) clientConn(clientID string) *remoting.Conn {
	m.mu.Lock()
	defer m.mu.Unlock()
	var found []*member
	for _, g := range m.groups {
		for _, mem := range g {
			if mem.clientID == clientID {
				found = append(found, mem)
			}
		}
	}
	if len(found) == 0 {
		return nil
	}
	return slices.MaxFunc(found, func(a, b *member) int { return a.lastSeen.Compare(b.lastSeen) }).conn
}
