package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

// Bounds of message.browse and message.search: a request reads the store on the command's
// goroutine, so how much one request may read is capped.
const (
	defaultBrowseMax  = 20
	maxBrowseMax      = 100
	defaultMaxScan    = 10_000
	maxMaxScan        = 100_000
	defaultMaxMatches = 20
	maxMaxMatches     = 100
	defaultSearchTime = 2 * time.Second
	maxSearchTime     = 10 * time.Second
	// scanBatch is how many messages a search reads of a queue at a time.
	scanBatch = 64
)

// MessageBrowseRequest is the request of message.browse: one queue of a topic from an
// offset, or from the first message stored at or after a time.
type MessageBrowseRequest struct {
	Topic string `json:"topic"`
	// Broker, when set, must name this node (a cluster's node answers for its own store).
	Broker string `json:"broker,omitempty"`
	Queue  *int32 `json:"queue"`
	// Offset is the queue offset to start at; Timestamp (Unix milliseconds or RFC 3339)
	// starts at the first message stored at or after it. At most one; default the queue's
	// first stored message.
	Offset    *int64          `json:"offset,omitempty"`
	Timestamp json.RawMessage `json:"timestamp,omitempty"`
	// Max bounds the messages returned: 1 to 100, default 20.
	Max *int `json:"max,omitempty"`
}

// MessageBrowseReply is the reply of message.browse.
type MessageBrowseReply struct {
	Origin
	Topic string `json:"topic"`
	Queue int32  `json:"queue"`
	// Offset is where the read started; Next where the next page starts (request it with
	// offset: next). MinOffset and MaxOffset are the queue's bounds (MaxOffset exclusive).
	Offset    int64          `json:"offset"`
	Next      int64          `json:"next"`
	MinOffset int64          `json:"min_offset"`
	MaxOffset int64          `json:"max_offset"`
	Messages  []MessageReply `json:"messages"`
}

func (s *Service) messageBrowse(ctx context.Context, data []byte) (any, error) {
	var req MessageBrowseRequest
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	if err := s.checkTopicField(req.Topic, req.Broker); err != nil {
		return nil, err
	}
	if req.Queue == nil {
		return nil, badField("queue", "required")
	}
	maxMsgs, err := boundedInt("max", req.Max, defaultBrowseMax, maxBrowseMax)
	if err != nil {
		return nil, err
	}
	if req.Offset != nil && len(req.Timestamp) > 0 {
		return nil, badField("timestamp", "give offset or timestamp, not both")
	}
	if req.Offset != nil && *req.Offset < 0 {
		return nil, badField("offset", "must be 0 or more, not %d", *req.Offset)
	}
	from := int64(0)
	if req.Offset != nil {
		from = *req.Offset
	}
	if len(req.Timestamp) > 0 {
		ts, err := parseTimeBound("timestamp", req.Timestamp, 0)
		if err != nil {
			return nil, err
		}
		if from, err = s.b.OffsetByTime(req.Topic, *req.Queue, ts); err != nil {
			return nil, brokerError(err, "queue")
		}
	}
	rd, err := s.b.ReadQueue(ctx, req.Topic, *req.Queue, from, maxMsgs)
	if err != nil {
		return nil, brokerError(err, "queue")
	}
	if from < rd.Min {
		from = rd.Min
	}
	reply := MessageBrowseReply{
		Origin: s.origin(), Topic: req.Topic, Queue: *req.Queue, Offset: from, Next: rd.Next,
		MinOffset: rd.Min, MaxOffset: rd.Max, Messages: []MessageReply{},
	}
	for _, m := range rd.Messages {
		v, err := s.messageView(m, protocol.OffsetMsgID(m.StoreHost, m.CommitLogOffset), "queue")
		if err != nil {
			return nil, err
		}
		reply.Messages = append(reply.Messages, v)
	}
	return reply, nil
}

// checkTopicField checks a request's topic (required, valid, existing) and broker (this
// node, when set).
func (s *Service) checkTopicField(topic, brokerName string) error {
	if topic == "" {
		return badField("topic", "required")
	}
	if err := broker.ValidateTopic(topic); err != nil {
		return badField("topic", "%s", err)
	}
	if brokerName != "" && brokerName != s.cfg.Node {
		return &cmdError{code: CodeNotFound, msg: fmt.Sprintf("broker %q: this node is %q; send the command to that node's subject", brokerName, s.cfg.Node)}
	}
	if _, ok := s.b.Topic(topic); !ok {
		return &cmdError{code: CodeNotFound, msg: fmt.Sprintf("topic %q: %s", topic, broker.ErrNotFound)}
	}
	return nil
}

// boundedInt is an optional count field: def when absent, else within 1..limit.
func boundedInt(field string, v *int, def, limit int) (int, error) {
	if v == nil {
		return def, nil
	}
	if *v < 1 || *v > limit {
		return 0, badField(field, "must be within 1..%d, not %d", limit, *v)
	}
	return *v, nil
}

// MessageSendRequest is the request of message.send: one test message, stored as a
// producer's send would store it.
type MessageSendRequest struct {
	Topic string `json:"topic"`
	// Body is the message body, as text.
	Body string `json:"body"`
	Tags string `json:"tags,omitempty"`
	// Keys become the KEYS property (separated by spaces), so message.query finds them.
	Keys       []string          `json:"keys,omitempty"`
	Properties map[string]string `json:"properties,omitempty"`
	// Queue is the write queue; default a random one.
	Queue *int32 `json:"queue,omitempty"`
}

// MessageSendReply is the reply of message.send.
type MessageSendReply struct {
	Origin
	// MsgID is the offset message id (message.get takes it); UniqKey the UNIQ_KEY (the
	// msgId a RocketMQ client shows; message.query with unique takes it).
	MsgID     string    `json:"msg_id"`
	UniqKey   string    `json:"uniq_key"`
	Topic     string    `json:"topic"`
	Queue     int32     `json:"queue"`
	Offset    int64     `json:"offset"`
	StoreTime time.Time `json:"store_time"`
}

func (s *Service) messageSend(ctx context.Context, data []byte) (any, error) {
	var req MessageSendRequest
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	if err := s.checkTopicField(req.Topic, ""); err != nil {
		return nil, err
	}
	if req.Body == "" {
		return nil, badField("body", "required")
	}
	props := map[string]string{}
	for k, v := range req.Properties {
		if k == protocol.PropertyDelayLevel || k == protocol.PropertyTransactionPrepared {
			return nil, badField("properties", "%s is not supported by message.send (no delayed or transactional test messages)", k)
		}
		if k == "" || strings.ContainsAny(k+v, "\x01\x02") {
			return nil, badField("properties", "names must be non-empty, and names and values must not hold the bytes 0x01 or 0x02 (property %q)", clip(k, echoLimit))
		}
		props[k] = v
	}
	for field, v := range map[string]string{"tags": req.Tags, "keys": strings.Join(req.Keys, " ")} {
		if strings.ContainsAny(v, "\x01\x02") {
			return nil, badField(field, "must not hold the bytes 0x01 or 0x02")
		}
	}
	if req.Tags != "" {
		props[protocol.PropertyTags] = req.Tags
	}
	if len(req.Keys) > 0 {
		props[protocol.PropertyKeys] = strings.Join(req.Keys, " ")
	}
	queue := int32(-1)
	if req.Queue != nil {
		if *req.Queue < 0 {
			return nil, badField("queue", "must be 0 or more, not %d", *req.Queue)
		}
		queue = *req.Queue
	}
	res, err := s.b.Send(ctx, protocol.Message{Topic: req.Topic, Properties: props, Body: []byte(req.Body)}, queue)
	switch {
	case errors.Is(err, broker.ErrBadMessage):
		return nil, badField("body", "%s", err)
	case errors.Is(err, broker.ErrNotFound) && req.Queue != nil:
		return nil, badField("queue", "%s", err)
	case err != nil:
		return nil, brokerError(err, "topic")
	}
	return MessageSendReply{
		Origin: s.origin(), MsgID: res.MsgID, UniqKey: res.UniqKey, Topic: req.Topic, Queue: res.QueueID,
		Offset: res.QueueOffset, StoreTime: res.StoreTime,
	}, nil
}

// searchTimeout reads message.search's timeout: a Go duration ("2s", "500ms"), up to 10 s.
func searchTimeout(v string) (time.Duration, error) {
	if v == "" {
		return defaultSearchTime, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, badField("timeout", "must be a duration such as 2s or 500ms: %s", err)
	}
	if d <= 0 || d > maxSearchTime {
		return 0, badField("timeout", "must be more than 0 and at most %s, not %s", maxSearchTime, v)
	}
	return d, nil
}

// endOfTime is the default upper store-time bound of a search.
const endOfTime = math.MaxInt64
