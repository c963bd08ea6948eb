package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

// defaultQueryMax is how many messages message.query returns when the request does not say
// (RocketMQ's defaultQueryMaxNum).
const defaultQueryMax = 32

// MessageQueryRequest is the request of message.query.
type MessageQueryRequest struct {
	Topic string `json:"topic"`
	// Key is one of the keys a producer gave the message (its KEYS property) or, with
	// Unique, its unique key (UNIQ_KEY, the msgId of a RocketMQ send result).
	Key    string `json:"key"`
	Unique bool   `json:"unique,omitempty"`
	// Begin and End bound the store time, both inclusive: Unix milliseconds (a number) or
	// an RFC 3339 time (a string). Default: all time.
	Begin json.RawMessage `json:"begin,omitempty"`
	End   json.RawMessage `json:"end,omitempty"`
	// Max bounds how many messages come back, the newest when more match: 1 to
	// broker.MaxQueryMessages (64). Default 32. A unique-key query returns at most one.
	Max *int `json:"max,omitempty"`
}

// MessageQueryReply is the reply of message.query: the matching messages, oldest first,
// each as message.get shows it.
type MessageQueryReply struct {
	Origin
	Topic    string         `json:"topic"`
	Key      string         `json:"key"`
	Messages []MessageReply `json:"messages"`
}

func (s *Service) messageQuery(ctx context.Context, data []byte) (any, error) {
	var req MessageQueryRequest
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	if req.Topic == "" {
		return nil, badField("topic", "required")
	}
	if err := broker.ValidateTopic(req.Topic); err != nil {
		return nil, badField("topic", "%s", err)
	}
	if req.Key == "" {
		return nil, badField("key", "required")
	}
	maxNum := defaultQueryMax
	if req.Max != nil {
		maxNum = *req.Max
		if maxNum < 1 || maxNum > broker.MaxQueryMessages {
			return nil, badField("max", "must be within 1..%d, not %d", broker.MaxQueryMessages, maxNum)
		}
	}
	begin, err := parseTimeBound("begin", req.Begin, 0)
	if err != nil {
		return nil, err
	}
	end, err := parseTimeBound("end", req.End, math.MaxInt64)
	if err != nil {
		return nil, err
	}
	if begin > end {
		return nil, badField("end", "is before begin")
	}
	if _, ok := s.b.Topic(req.Topic); !ok {
		return nil, &cmdError{code: CodeNotFound, msg: fmt.Sprintf("topic %q: %s", req.Topic, broker.ErrNotFound)}
	}
	ms, err := s.b.QueryMessages(ctx, broker.MessageQuery{Topic: req.Topic, Key: req.Key, Unique: req.Unique, MaxNum: maxNum, Begin: begin, End: end})
	if errors.Is(err, broker.ErrBadQuery) {
		return nil, badRequest("%s", err)
	}
	if err != nil {
		return nil, brokerError(err, "topic")
	}
	reply := MessageQueryReply{Origin: s.origin(), Topic: req.Topic, Key: req.Key, Messages: []MessageReply{}}
	for _, m := range ms {
		v, err := s.messageView(m, protocol.OffsetMsgID(m.StoreHost, m.CommitLogOffset), "key")
		if err != nil {
			return nil, err
		}
		reply.Messages = append(reply.Messages, v)
	}
	return reply, nil
}

// parseTimeBound reads a time bound: Unix milliseconds (a number, 0 or more) or an RFC 3339
// string; absent is def.
func parseTimeBound(field string, raw json.RawMessage, def int64) (int64, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return def, nil
	}
	var ms int64
	if err := json.Unmarshal(raw, &ms); err == nil {
		if ms < 0 {
			return 0, badField(field, "must be Unix milliseconds (0 or more), not %d", ms)
		}
		return ms, nil
	}
	var str string
	if err := json.Unmarshal(raw, &str); err != nil {
		return 0, badField(field, "must be Unix milliseconds (a number) or an RFC 3339 time (a string), not %s", clip(string(raw), echoLimit))
	}
	t, err := time.Parse(time.RFC3339Nano, str)
	if err != nil {
		return 0, badField(field, "must be Unix milliseconds or an RFC 3339 time: %s", err)
	}
	if t.UnixMilli() < 0 {
		return 0, badField(field, "must not be before 1970, not %s", str)
	}
	return t.UnixMilli(), nil
}
