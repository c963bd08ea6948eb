package clientcore

import (
	"fmt"
	"net/netip"

	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// ExpectReply registers a request–reply call waiting for the reply with correlationID (the
// request's CORRELATION_ID): the broker pushes replies with PUSH_REPLY_MESSAGE_TO_CLIENT to
// the client named in REPLY_TO_CLIENT, and the client hands each to the call waiting for it.
// The channel receives at most one reply. cancel forgets the call; call it when done, reply
// or not. Register before sending the request: the reply may arrive before the send's answer.
func (c *Client) ExpectReply(correlationID string) (replies <-chan *protocol.MessageExt, cancel func()) {
	ch := make(chan *protocol.MessageExt, 1)
	c.mu.Lock()
	c.replies[correlationID] = ch
	c.mu.Unlock()
	return ch, func() {
		c.mu.Lock()
		if c.replies[correlationID] == ch {
			delete(c.replies, correlationID)
		}
		c.mu.Unlock()
	}
}

// pushReply serves PUSH_REPLY_MESSAGE_TO_CLIENT: the reply goes to the call waiting for its
// correlation id. A reply nobody waits for (the call gave up, or a duplicate) is dropped and
// still answered with success, as the broker cannot do better with it.
func (c *Client) pushReply(conn *remoting.Conn, req *protocol.Command) *protocol.Command {
	var h protocol.ReplyMessageRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return protocol.NewResponse(req, protocol.InvalidParameter, err.Error())
	}
	props, err := protocol.DecodeProperties([]byte(h.Properties))
	if err != nil {
		return protocol.NewResponse(req, protocol.InvalidParameter, fmt.Sprintf("reply properties: %v", err))
	}
	m := &protocol.MessageExt{
		Message:        protocol.Message{Topic: h.Topic, Flag: h.Flag, Properties: props, Body: req.Body},
		QueueID:        h.QueueID,
		SysFlag:        h.SysFlag,
		BornTimestamp:  h.BornTimestamp,
		StoreTimestamp: h.StoreTimestamp,
		ReconsumeTimes: h.ReconsumeTimes,
	}
	m.BornHost, _ = netip.ParseAddrPort(h.BornHost)
	m.StoreHost, _ = netip.ParseAddrPort(h.StoreHost)
	id := props[protocol.PropertyCorrelationID]
	c.mu.Lock()
	ch := c.replies[id]
	delete(c.replies, id)
	c.mu.Unlock()
	if ch == nil {
		from := ""
		if conn != nil {
			from = conn.RemoteAddr().String()
		}
		c.log.Debug("reply for no waiting request", "correlationId", id, "broker", from)
		return protocol.NewResponse(req, protocol.Success, "")
	}
	ch <- m // buffered, and the entry was removed: at most one send
	return protocol.NewResponse(req, protocol.Success, "")
}
