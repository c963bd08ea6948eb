package producer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// DefaultRequestTimeout bounds a Request whose context has no deadline (RocketMQ's default
// request timeout).
const DefaultRequestTimeout = 3 * time.Second

// ErrNotARequest is returned by Reply for a message that carries no reply address: it was
// not sent with Request (or by a RocketMQ client's request), or not stored by a broker that
// stamps its cluster name.
var ErrNotARequest = errors.New("producer: message is not a request")

// Request sends msg and waits for its reply (RocketMQ's request–reply): the message carries
// a fresh CORRELATION_ID, this client's id in REPLY_TO_CLIENT and the time left in TTL
// (milliseconds); a responder consuming it answers with Reply (or RocketMQ's
// CreateReplyMessage), and the broker pushes the reply to this client.
//
// The wait ends with ctx, or after DefaultRequestTimeout when ctx has no deadline; the error
// then wraps context.DeadlineExceeded. The request was sent by then, and a responder may
// still act on it.
func (p *Producer) Request(ctx context.Context, msg *Message) (*Message, error) {
	if err := p.checkRunning(); err != nil {
		return nil, err
	}
	if msg == nil {
		return nil, fmt.Errorf("%w: nil message", ErrInvalidMessage)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultRequestTimeout)
		defer cancel()
	}
	deadline, _ := ctx.Deadline()
	req := *msg
	req.Properties = maps.Clone(msg.Properties)
	if req.Properties == nil {
		req.Properties = map[string]string{}
	}
	corr := p.uniq.next()
	req.Properties[protocol.PropertyCorrelationID] = corr
	req.Properties[protocol.PropertyReplyToClient] = p.cl.ID()
	req.Properties[protocol.PropertyMessageTTL] = strconv.FormatInt(max(time.Until(deadline).Milliseconds(), 1), 10)
	replies, cancel := p.cl.ExpectReply(corr)
	defer cancel()
	if _, err := p.Send(ctx, &req); err != nil {
		return nil, fmt.Errorf("request to topic %q: %w", msg.Topic, err)
	}
	select {
	case m := <-replies:
		return p.replyMessage(m)
	case <-ctx.Done():
		return nil, fmt.Errorf("request to topic %q (correlation id %s): no reply: %w", msg.Topic, corr, ctx.Err())
	}
}

// replyMessage turns a pushed reply into a Message: its body decompressed, TAGS and KEYS in
// their fields, the other properties (CORRELATION_ID among them) in Properties.
func (p *Producer) replyMessage(m *protocol.MessageExt) (*Message, error) {
	body := m.Body
	if m.SysFlag&protocol.MsgFlagCompressed != 0 {
		var err error
		if body, err = protocol.DecompressBody(body, p.cfg.maxMessageSize); err != nil {
			return nil, fmt.Errorf("reply from topic %q: %w", m.Topic, err)
		}
	}
	props := maps.Clone(m.Properties)
	out := &Message{Topic: m.Topic, Body: body, Flag: m.Flag, Tags: props[protocol.PropertyTags], Properties: props}
	if k := props[protocol.PropertyKeys]; k != "" {
		out.Keys = strings.Fields(k)
	}
	delete(props, protocol.PropertyTags)
	delete(props, protocol.PropertyKeys)
	return out, nil
}

// Reply answers a request (a message sent with Request, or by a RocketMQ client's request,
// and consumed by the caller) with body. requestProps are the request's properties, as a
// consumer hands them out (consumer.Message.Properties): they hold the cluster that stored
// it, the requesting client and the correlation id. The reply goes to that cluster's reply
// topic with SEND_REPLY_MESSAGE, and the broker pushes it to the requesting client. It is
// sent once, without retries: a broker answers an error when the requester is no longer
// connected, and a second copy would not reach it either. Errors wrap ErrNotARequest when
// the properties lack the reply address.
func (p *Producer) Reply(ctx context.Context, requestProps map[string]string, body []byte) (SendResult, error) {
	if err := p.checkRunning(); err != nil {
		return SendResult{}, err
	}
	cluster, to := requestProps[protocol.PropertyCluster], requestProps[protocol.PropertyReplyToClient]
	if cluster == "" || to == "" {
		return SendResult{}, fmt.Errorf("%w: no %s or %s property", ErrNotARequest, protocol.PropertyCluster, protocol.PropertyReplyToClient)
	}
	reply := &Message{Topic: protocol.ReplyTopic(cluster), Body: body, Properties: map[string]string{
		protocol.PropertyMessageType:   protocol.ReplyMessageType,
		protocol.PropertyCorrelationID: requestProps[protocol.PropertyCorrelationID],
		protocol.PropertyReplyToClient: to,
	}}
	if ttl := requestProps[protocol.PropertyMessageTTL]; ttl != "" {
		reply.Properties[protocol.PropertyMessageTTL] = ttl
	}
	pm, err := p.prepare(reply, true)
	if err != nil {
		return SendResult{}, err
	}
	pm.reply = true
	ctx, cancel := context.WithTimeout(ctx, p.cfg.sendTimeout)
	defer cancel()
	queues, err := p.publishQueues(ctx, reply.Topic)
	if err != nil {
		return SendResult{}, fmt.Errorf("reply to %s: %w", to, err)
	}
	res, _, err := p.sendTo(ctx, p.cfg.selector.Select(reply, queues), pm)
	if err != nil {
		return SendResult{}, fmt.Errorf("reply to %s: %w", to, err)
	}
	return res, nil
}
