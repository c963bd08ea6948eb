package control

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"

	"github.com/flowd-io/flowd/broker/filter"
	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/protocol"
)

// MessageSearchRequest is the request of message.search: scan a topic's queues (or one) and
// return the messages a SQL92 expression or a deployed Wasm filter plugin keeps.
type MessageSearchRequest struct {
	Topic string `json:"topic"`
	// Queue limits the scan to one queue; default every read queue, one after the other.
	Queue *int32 `json:"queue,omitempty"`
	// FromOffset starts every queue scanned at that offset; FromTime at the first message
	// stored at or after it (Unix milliseconds or RFC 3339). Default each queue's first.
	FromOffset *int64          `json:"from_offset,omitempty"`
	FromTime   json.RawMessage `json:"from_time,omitempty"`
	// Positions continues a search: the Next of the previous reply (queue → offset). Only
	// the queues it names are scanned; it replaces queue, from_offset and from_time.
	Positions map[string]int64 `json:"positions,omitempty"`
	// To ends the scan of a queue at its first message stored after it (Unix milliseconds
	// or RFC 3339). Default: the queue's end.
	To json.RawMessage `json:"to,omitempty"`
	// SQL92 is an expression over the properties (TAGS and KEYS included), as a
	// subscription's; Filter names a deployed filter plugin (its active version). Exactly
	// one of them.
	SQL92  string `json:"sql92,omitempty"`
	Filter string `json:"filter,omitempty"`
	// MaxScan bounds the messages read (1 to 100 000, default 10 000); MaxMatches the
	// messages returned (1 to 100, default 20); Timeout the time spent (a duration, up to
	// 10 s, default 2 s).
	MaxScan    *int   `json:"max_scan,omitempty"`
	MaxMatches *int   `json:"max_matches,omitempty"`
	Timeout    string `json:"timeout,omitempty"`
}

// MessageSearchReply is the reply of message.search.
type MessageSearchReply struct {
	Origin
	Topic string `json:"topic"`
	// Matches are the kept messages in scan order (queue by queue, by offset), each as
	// message.get shows it.
	Matches []MessageReply `json:"matches"`
	// Scanned counts the messages read.
	Scanned int `json:"scanned"`
	// Next is where the search stopped in each queue not finished: send it back as
	// positions for the next page. A queue that reached to is left out; one that reached
	// its end is kept (at its end), as new messages may come.
	Next map[string]int64 `json:"next"`
	// Stopped is the bound the search stopped on: "max_matches", "max_scan" or "timeout";
	// empty when every queue was scanned to its end (or to to).
	Stopped string `json:"stopped,omitempty"`
}

// matcher decides which of a batch of messages a search keeps.
type searchMatcher func(ctx context.Context, ms []*protocol.MessageExt, keep []bool) error

func (s *Service) messageSearch(ctx context.Context, data []byte) (any, error) {
	var req MessageSearchRequest
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	if err := s.checkTopicField(req.Topic, ""); err != nil {
		return nil, err
	}
	match, err := s.searchMatcher(req)
	if err != nil {
		return nil, err
	}
	maxScan, err := boundedInt("max_scan", req.MaxScan, defaultMaxScan, maxMaxScan)
	if err != nil {
		return nil, err
	}
	maxMatches, err := boundedInt("max_matches", req.MaxMatches, defaultMaxMatches, maxMaxMatches)
	if err != nil {
		return nil, err
	}
	timeout, err := searchTimeout(req.Timeout)
	if err != nil {
		return nil, err
	}
	to, err := parseTimeBound("to", req.To, endOfTime)
	if err != nil {
		return nil, err
	}
	starts, err := s.searchStarts(req)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	sc := &scan{s: s, topic: req.Topic, match: match, to: to, maxScan: maxScan, maxMatches: maxMatches,
		reply: MessageSearchReply{Origin: s.origin(), Topic: req.Topic, Matches: []MessageReply{}, Next: map[string]int64{}}}
	for i, st := range starts {
		if sc.reply.Stopped != "" {
			// Queues not reached keep their starts, so the next page scans them.
			for _, rest := range starts[i:] {
				sc.reply.Next[strconv.Itoa(int(rest.queue))] = rest.offset
			}
			break
		}
		if err := sc.queue(sctx, st.queue, st.offset); err != nil {
			return nil, err
		}
	}
	return sc.reply, nil
}

// searchMatcher compiles the request's expression: SQL92 with filter.ParseSQL92, or a
// deployed filter plugin of the service's registry.
func (s *Service) searchMatcher(req MessageSearchRequest) (searchMatcher, error) {
	switch {
	case req.SQL92 != "" && req.Filter != "":
		return nil, badField("filter", "give sql92 or filter, not both")
	case req.SQL92 != "":
		sel, err := filter.ParseSQL92(req.SQL92)
		if err != nil {
			return nil, badField("sql92", "%s", err)
		}
		return func(_ context.Context, ms []*protocol.MessageExt, keep []bool) error {
			for i, m := range ms {
				keep[i] = sel.Match(func(k string) (string, bool) { v, ok := m.Properties[k]; return v, ok })
			}
			return nil
		}, nil
	case req.Filter != "":
		if s.cfg.Plugins == nil {
			return nil, badField("filter", "this node has no plugin registry")
		}
		f, err := s.cfg.Plugins.Filter(req.Filter)
		if err != nil {
			return nil, badField("filter", "%s", err)
		}
		if s.cfg.Plugins.ActiveVersion(req.Filter) == "" {
			return nil, badField("filter", "filter plugin %q has no active version", req.Filter)
		}
		return func(ctx context.Context, ms []*protocol.MessageExt, keep []bool) error {
			pms := make([]plugins.Message, len(ms))
			for i, m := range ms {
				body, err := m.UncompressedBody(maxBodyView)
				if err != nil {
					body = nil // the filter sees it empty, as a pull's filter does
				}
				pms[i] = plugins.Message{
					Topic: m.Topic, QueueID: m.QueueID, QueueOffset: m.QueueOffset, StoreTimestamp: m.StoreTimestamp,
					Tags: m.Properties[protocol.PropertyTags], Keys: m.Properties[protocol.PropertyKeys],
					Properties: protocol.AppendProperties(nil, m.Properties), Body: body,
				}
			}
			return f.Match(ctx, pms, keep)
		}, nil
	}
	return nil, badField("sql92", "give sql92 or filter")
}

// searchStart is where a search begins in one queue.
type searchStart struct {
	queue  int32
	offset int64
}

// searchStarts resolves the queues and their first offsets from the request.
func (s *Service) searchStarts(req MessageSearchRequest) ([]searchStart, error) {
	var out []searchStart
	if len(req.Positions) > 0 {
		for k, off := range req.Positions {
			q, err := strconv.ParseInt(k, 10, 32)
			if err != nil || q < 0 || off < 0 {
				return nil, badField("positions", "want queue numbers to offsets (0 or more), not %q: %d", clip(k, echoLimit), off)
			}
			out = append(out, searchStart{queue: int32(q), offset: off})
		}
		slices.SortFunc(out, func(a, b searchStart) int { return int(a.queue - b.queue) })
		return out, nil
	}
	if req.FromOffset != nil && len(req.FromTime) > 0 {
		return nil, badField("from_time", "give from_offset or from_time, not both")
	}
	if req.FromOffset != nil && *req.FromOffset < 0 {
		return nil, badField("from_offset", "must be 0 or more, not %d", *req.FromOffset)
	}
	tc, _ := s.b.Topic(req.Topic)
	queues := []int32{}
	if req.Queue != nil {
		if *req.Queue < 0 || int(*req.Queue) >= tc.ReadQueueNums {
			return nil, badField("queue", "topic %q has read queues 0..%d, not %d", req.Topic, tc.ReadQueueNums-1, *req.Queue)
		}
		queues = append(queues, *req.Queue)
	} else {
		for q := range tc.ReadQueueNums {
			queues = append(queues, int32(q))
		}
	}
	fromTime, err := parseTimeBound("from_time", req.FromTime, -1)
	if err != nil {
		return nil, err
	}
	for _, q := range queues {
		st := searchStart{queue: q}
		if req.FromOffset != nil {
			st.offset = *req.FromOffset
		}
		if fromTime >= 0 {
			if st.offset, err = s.b.OffsetByTime(req.Topic, q, fromTime); err != nil {
				return nil, brokerError(err, "queue")
			}
		}
		out = append(out, st)
	}
	return out, nil
}

// scan is one search's progress over its queues.
type scan struct {
	s                   *Service
	topic               string
	match               searchMatcher
	to                  int64
	maxScan, maxMatches int
	reply               MessageSearchReply
}

// queue scans one queue from offset until its end, to, or a bound, recording where it
// stopped in reply.Next.
func (sc *scan) queue(ctx context.Context, q int32, offset int64) error {
	key := strconv.Itoa(int(q))
	for {
		n := min(scanBatch, sc.maxScan-sc.reply.Scanned)
		if n <= 0 {
			sc.reply.Next[key], sc.reply.Stopped = offset, "max_scan"
			return nil
		}
		rd, err := sc.s.b.ReadQueue(ctx, sc.topic, q, offset, n)
		if ctx.Err() != nil {
			sc.reply.Next[key], sc.reply.Stopped = offset, "timeout"
			return nil
		}
		if err != nil {
			return brokerError(err, "positions")
		}
		if len(rd.Messages) == 0 {
			sc.reply.Next[key] = max(rd.Next, offset)
			return nil
		}
		ms := rd.Messages
		for i, m := range ms {
			if m.StoreTimestamp > sc.to {
				ms = ms[:i]
				break
			}
		}
		keep := make([]bool, len(ms))
		if err := sc.match(ctx, ms, keep); err != nil {
			if ctx.Err() != nil {
				sc.reply.Next[key], sc.reply.Stopped = offset, "timeout"
				return nil
			}
			return &cmdError{code: CodeInternal, msg: "filter: " + err.Error()}
		}
		for i, m := range ms {
			sc.reply.Scanned++
			offset = m.QueueOffset + 1
			if !keep[i] {
				continue
			}
			v, err := sc.s.messageView(m, protocol.OffsetMsgID(m.StoreHost, m.CommitLogOffset), "topic")
			if err != nil {
				return err
			}
			sc.reply.Matches = append(sc.reply.Matches, v)
			if len(sc.reply.Matches) >= sc.maxMatches {
				sc.reply.Next[key], sc.reply.Stopped = offset, "max_matches"
				return nil
			}
		}
		if len(ms) < len(rd.Messages) {
			return nil // reached to: the queue is done, and left out of Next
		}
		offset = max(offset, rd.Next)
	}
}
