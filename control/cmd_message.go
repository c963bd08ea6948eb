package control

import (
	"context"
	"errors"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// maxBodyView bounds the inflated size of a compressed body message.get returns, so a
// hostile message cannot make the broker inflate without limit.
const maxBodyView = 64 << 20

// MessageRef is the request of message.get.
type MessageRef struct {
	// MsgID is the broker's offset message id (the msgId of a send result, the
	// OffsetMsgID a consumer sees).
	MsgID string `json:"msg_id"`
}

// MessageReply is the reply of message.get.
type MessageReply struct {
	Origin
	MsgID           string `json:"msg_id"`
	Topic           string `json:"topic"`
	Queue           int32  `json:"queue"`
	Offset          int64  `json:"offset"`
	CommitLogOffset int64  `json:"commit_log_offset"`
	// Properties are the message's properties (TAGS, KEYS, UNIQ_KEY, user properties).
	Properties map[string]string `json:"properties"`
	// Body is the body, inflated if it was stored compressed, in standard base64.
	Body           []byte    `json:"body"`
	BodySize       int       `json:"body_size"`
	StoreTime      time.Time `json:"store_time"`
	BornTime       time.Time `json:"born_time"`
	StoreHost      string    `json:"store_host"`
	BornHost       string    `json:"born_host"`
	ReconsumeTimes int32     `json:"reconsume_times"`
	Flag           int32     `json:"flag"`
}

func (s *Service) messageGet(_ context.Context, data []byte) (any, error) {
	var req MessageRef
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	if req.MsgID == "" {
		return nil, badField("msg_id", "required")
	}
	m, err := s.b.MessageByID(req.MsgID)
	if errors.Is(err, protocol.ErrBadMsgID) {
		return nil, badField("msg_id", "%s", err)
	}
	if err != nil {
		return nil, brokerError(err, "msg_id")
	}
	return s.messageView(m, req.MsgID, "msg_id")
}

// messageView is the reply shape of one stored message (message.get, message.query); field
// names the request field an error is blamed on.
func (s *Service) messageView(m *protocol.MessageExt, msgID, field string) (MessageReply, error) {
	body, err := m.UncompressedBody(maxBodyView)
	if err != nil {
		return MessageReply{}, brokerError(err, field)
	}
	props := m.Properties
	if props == nil {
		props = map[string]string{}
	}
	return MessageReply{
		Origin: s.origin(), MsgID: msgID, Topic: m.Topic, Queue: m.QueueID, Offset: m.QueueOffset,
		CommitLogOffset: m.CommitLogOffset, Properties: props, Body: body, BodySize: len(body),
		StoreTime: time.UnixMilli(m.StoreTimestamp).UTC(), BornTime: time.UnixMilli(m.BornTimestamp).UTC(),
		StoreHost: m.StoreHost.String(), BornHost: m.BornHost.String(), ReconsumeTimes: m.ReconsumeTimes, Flag: m.Flag,
	}, nil
}
