package broker

import (
	"context"
	"errors"
	"fmt"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/protocol"
)

// ErrBadQuery is wrapped by the error of QueryMessages for a query without a key, with
// MaxNum below 1 (for a key query), or with a time range that runs backwards.
var ErrBadQuery = store.ErrBadQuery

// MaxQueryMessages bounds the messages one query returns, whatever it asks for (RocketMQ's
// maxMsgsNumBatch).
const MaxQueryMessages = store.MaxQueryMessages

// MessageQuery asks for the messages of a topic by key.
type MessageQuery struct {
	Topic string
	// Key is one of the keys of a message's KEYS property or, with Unique, its UNIQ_KEY (the
	// msgId of a send result).
	Key    string
	Unique bool
	// MaxNum bounds the result (capped at MaxQueryMessages; the newest win); a Unique query
	// returns at most one message whatever it says.
	MaxNum int
	// Begin and End bound the store time, Unix milliseconds, both inclusive.
	Begin, End int64
}

// QueryMessages returns the stored messages a query matches, oldest first; none is not an
// error. It fails with ErrBadTopic for an invalid topic name and ErrBadQuery for a bad
// query, and with ctx's error when it is done. Bodies are as stored, compressed or not.
func (b *Broker) QueryMessages(ctx context.Context, q MessageQuery) ([]*protocol.MessageExt, error) {
	res, err := b.queryStore(ctx, q)
	if err != nil {
		return nil, err
	}
	out := make([]*protocol.MessageExt, 0, len(res.Messages))
	for _, raw := range res.Messages {
		m, _, err := protocol.DecodeStored(raw)
		if err != nil {
			return nil, fmt.Errorf("query %q: %w", q.Topic, err)
		}
		out = append(out, m)
	}
	return out, nil
}

func (b *Broker) queryStore(ctx context.Context, q MessageQuery) (*store.QueryResult, error) {
	if err := ValidateTopic(q.Topic); err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}
	res, err := b.store.QueryMessages(ctx, q.Topic, q.Key, q.Unique, q.MaxNum, max(q.Begin, 0), q.End)
	if errors.Is(err, store.ErrBadTopic) {
		return nil, fmt.Errorf("query %q: %w", q.Topic, ErrBadTopic)
	}
	return res, err
}

// processQueryMessage answers QUERY_MESSAGE (12): the stored messages of the topic whose
// KEYS list the key (or, with the extField _UNIQUE_KEY_QUERY=true, whose UNIQ_KEY is it),
// stored within [beginTimestamp, endTimestamp], concatenated in the body;
// QUERY_NOT_FOUND when there are none. As in RocketMQ, the response header says how far
// the index reaches (indexLastUpdateTimestamp, indexLastUpdatePhyoffset). Unlike RocketMQ,
// the broker checks each message's key itself, so hash collisions never reach the client.
func (b *Broker) processQueryMessage(ctx context.Context, req *protocol.Command) *protocol.Command {
	var h protocol.QueryMessageRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	if err := ValidateTopic(h.Topic); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	switch {
	case h.Key == "":
		return protocol.NewResponse(req, protocol.InvalidParameter, "the key is empty")
	case !h.Unique && h.MaxNum < 1:
		return protocol.NewResponse(req, protocol.InvalidParameter, fmt.Sprintf("maxNum %d is illegal: it must be at least 1 (at most %d messages are returned)", h.MaxNum, MaxQueryMessages))
	case h.BeginTimestamp > h.EndTimestamp:
		return protocol.NewResponse(req, protocol.InvalidParameter, fmt.Sprintf("beginTimestamp %d is after endTimestamp %d", h.BeginTimestamp, h.EndTimestamp))
	}
	res, err := b.queryStore(ctx, MessageQuery{Topic: h.Topic, Key: h.Key, Unique: h.Unique, MaxNum: int(h.MaxNum), Begin: h.BeginTimestamp, End: h.EndTimestamp})
	switch {
	case errors.Is(err, ErrBadQuery), errors.Is(err, ErrBadTopic):
		return errorResponse(req, protocol.InvalidParameter, err)
	case errors.Is(err, store.ErrClosed), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return errorResponse(req, protocol.ServiceNotAvailable, err)
	case err != nil:
		return errorResponse(req, protocol.SystemError, err)
	}
	var resp *protocol.Command
	if len(res.Messages) == 0 {
		resp = protocol.NewResponse(req, protocol.QueryNotFound, "can not find message, maybe time range not correct")
	} else {
		resp = protocol.NewResponse(req, protocol.Success, "")
		n := 0
		for _, m := range res.Messages {
			n += len(m)
		}
		resp.Body = make([]byte, 0, n)
		for _, m := range res.Messages {
			resp.Body = append(resp.Body, m...)
		}
	}
	(&protocol.QueryMessageResponseHeader{IndexLastUpdateTimestamp: res.IndexLastUpdateTimestamp, IndexLastUpdatePhyoffset: res.IndexLastUpdatePhyOffset}).EncodeTo(resp.ExtFields)
	return resp
}
