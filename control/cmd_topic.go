package control

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/fields"
	"github.com/flowd-io/flowd/protocol"
)

// TopicView is a topic's configuration as the topic commands show it.
type TopicView struct {
	Topic       string `json:"topic"`
	ReadQueues  int    `json:"read_queues"`
	WriteQueues int    `json:"write_queues"`
	// Perm is "rw", "r" (producers are refused), "w" (consumers are refused) or "none".
	Perm  string `json:"perm"`
	Order bool   `json:"order"`
	// Kind is "user", "retry" (%RETRY%<group>), "dlq" (%DLQ%<group>) or "system" (the
	// broker's own: TBW102, SCHEDULE_TOPIC_XXXX).
	Kind string `json:"kind"`
	// Brokers lists, in a gathered topic.list, each broker that has the topic with its
	// queues, by name; absent otherwise.
	Brokers []TopicBrokerView `json:"brokers,omitempty"`
}

// TopicBrokerView is one broker's queues of a topic in a gathered topic.list.
type TopicBrokerView struct {
	Broker      string `json:"broker"`
	Node        string `json:"node"`
	ReadQueues  int    `json:"read_queues"`
	WriteQueues int    `json:"write_queues"`
	Perm        string `json:"perm"`
}

func topicView(tc broker.TopicConfig) TopicView {
	return TopicView{Topic: tc.Name, ReadQueues: tc.ReadQueueNums, WriteQueues: tc.WriteQueueNums, Perm: permString(tc.Perm), Order: tc.Order, Kind: topicKind(tc.Name)}
}

func topicKind(name string) string {
	switch {
	case strings.HasPrefix(name, broker.RetryTopicPrefix):
		return "retry"
	case strings.HasPrefix(name, broker.DLQTopicPrefix):
		return "dlq"
	case name == broker.ScheduleTopic || name == protocol.AutoCreateTopicKey:
		return "system"
	}
	return "user"
}

func permString(p int) string {
	switch p & (protocol.PermRead | protocol.PermWrite) {
	case protocol.PermRead | protocol.PermWrite:
		return "rw"
	case protocol.PermRead:
		return "r"
	case protocol.PermWrite:
		return "w"
	}
	return "none"
}

func parsePerm(s string) (int, error) {
	switch s {
	case "rw", "wr":
		return protocol.PermRead | protocol.PermWrite, nil
	case "r":
		return protocol.PermRead, nil
	case "w":
		return protocol.PermWrite, nil
	case "none":
		return 0, nil
	}
	return 0, badField("perm", "must be \"rw\", \"r\", \"w\" or \"none\", not %q", s)
}

// TopicSpec is the request of topic.create and topic.update. Queues sets the read and the
// write queue counts; ReadQueues and WriteQueues override one of them.
type TopicSpec struct {
	Topic       string  `json:"topic"`
	Queues      *int    `json:"queues,omitempty"`
	ReadQueues  *int    `json:"read_queues,omitempty"`
	WriteQueues *int    `json:"write_queues,omitempty"`
	Perm        *string `json:"perm,omitempty"`
	Order       *bool   `json:"order,omitempty"`
}

// TopicReply is the reply of topic.create and topic.update.
type TopicReply struct {
	Origin
	Topic TopicView `json:"topic"`
}

func checkTopicName(name string) error {
	if name == "" {
		return badField("topic", "required")
	}
	if err := broker.ValidateTopic(name); err != nil {
		return badField("topic", "%s", err)
	}
	return nil
}

func checkQueues(field string, n *int) error {
	if n != nil && (*n < 1 || *n > broker.MaxQueues) {
		return badField(field, "must be 1..%d, not %d", broker.MaxQueues, *n)
	}
	return nil
}

// apply writes the spec's fields over tc.
func (spec *TopicSpec) apply(tc *broker.TopicConfig) error {
	for _, f := range []struct {
		name string
		n    *int
	}{{"queues", spec.Queues}, {"read_queues", spec.ReadQueues}, {"write_queues", spec.WriteQueues}} {
		if err := checkQueues(f.name, f.n); err != nil {
			return err
		}
	}
	if spec.Queues != nil {
		tc.ReadQueueNums, tc.WriteQueueNums = *spec.Queues, *spec.Queues
	}
	if spec.ReadQueues != nil {
		tc.ReadQueueNums = *spec.ReadQueues
	}
	if spec.WriteQueues != nil {
		tc.WriteQueueNums = *spec.WriteQueues
	}
	if spec.Perm != nil {
		p, err := parsePerm(*spec.Perm)
		if err != nil {
			return err
		}
		tc.Perm = p | tc.Perm&protocol.PermInherit
	}
	if spec.Order != nil {
		tc.Order = *spec.Order
	}
	return nil
}

func (s *Service) topicCreate(_ context.Context, data []byte) (any, error) {
	var req TopicSpec
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	if err := checkTopicName(req.Topic); err != nil {
		return nil, err
	}
	if req.Queues == nil && (req.ReadQueues == nil || req.WriteQueues == nil) {
		return nil, badField("queues", "required (or both read_queues and write_queues)")
	}
	tc := broker.TopicConfig{Name: req.Topic, Perm: protocol.PermRead | protocol.PermWrite}
	if err := req.apply(&tc); err != nil {
		return nil, err
	}
	if err := s.b.CreateTopic(tc); err != nil {
		return nil, brokerError(err, "topic")
	}
	s.log.Info("topic created by the control plane", "topic", tc.Name, "read_queues", tc.ReadQueueNums, "write_queues", tc.WriteQueueNums)
	return TopicReply{Origin: s.origin(), Topic: topicView(tc)}, nil
}

func (s *Service) topicUpdate(_ context.Context, data []byte) (any, error) {
	var req TopicSpec
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	if err := checkTopicName(req.Topic); err != nil {
		return nil, err
	}
	if req.Queues == nil && req.ReadQueues == nil && req.WriteQueues == nil && req.Perm == nil && req.Order == nil {
		return nil, badRequest("nothing to update: give queues, read_queues, write_queues, perm or order")
	}
	tc, ok := s.b.Topic(req.Topic)
	if !ok {
		return nil, &cmdError{code: CodeNotFound, msg: "topic " + req.Topic + " does not exist"}
	}
	if err := req.apply(&tc); err != nil {
		return nil, err
	}
	if err := s.b.UpdateTopic(tc); err != nil {
		return nil, brokerError(err, "topic")
	}
	s.log.Info("topic updated by the control plane", "topic", tc.Name, "read_queues", tc.ReadQueueNums, "write_queues", tc.WriteQueueNums, "perm", permString(tc.Perm))
	return TopicReply{Origin: s.origin(), Topic: topicView(tc)}, nil
}

// TopicRef is the request of the commands that name one topic.
type TopicRef struct {
	Topic string `json:"topic"`
}

// TopicDeleteReply is the reply of topic.delete.
type TopicDeleteReply struct {
	Origin
	Topic   string `json:"topic"`
	Deleted bool   `json:"deleted"`
}

func (s *Service) topicDelete(_ context.Context, data []byte) (any, error) {
	var req TopicRef
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	if err := checkTopicName(req.Topic); err != nil {
		return nil, err
	}
	if err := s.b.DeleteTopic(req.Topic); err != nil {
		return nil, brokerError(err, "topic")
	}
	s.log.Info("topic deleted by the control plane", "topic", req.Topic)
	return TopicDeleteReply{Origin: s.origin(), Topic: req.Topic, Deleted: true}, nil
}

// TopicListRequest is the request of topic.list: nothing, or a scope (see Scope), and
// optionally a page of the list.
type TopicListRequest struct {
	Local   bool             `json:"local,omitempty"`
	Timeout *fields.Duration `json:"timeout,omitempty"`
	// Prefix keeps the topics whose name starts with it; Contains those whose name holds
	// it. Offset skips that many topics of the (kept, name-sorted) list; Limit returns at
	// most that many (1 to 1000). Any of them makes the reply a page: it then carries Total
	// and the page's Stats, so that a console with 10 000 topics asks for one page at a time.
	Prefix   string `json:"prefix,omitempty"`
	Contains string `json:"contains,omitempty"`
	Offset   *int   `json:"offset,omitempty"`
	Limit    *int   `json:"limit,omitempty"`
}

// maxTopicPage bounds topic.list's limit.
const maxTopicPage = 1000

// TopicListReply is the reply of topic.list. In a cluster it is every node's topics, each
// once with its brokers, and the coverage.
type TopicListReply struct {
	Origin
	Topics []TopicView `json:"topics"`
	// Total, in a page, counts the topics kept by prefix and contains, over every page;
	// Offset is the page's start. Stats has each topic of the page's messages and rate.
	Total  *int                  `json:"total,omitempty"`
	Offset *int                  `json:"offset,omitempty"`
	Stats  map[string]TopicStats `json:"stats,omitempty"`
	Coverage
}

func (req TopicListRequest) paged() bool {
	return req.Prefix != "" || req.Contains != "" || req.Offset != nil || req.Limit != nil
}

func (s *Service) topicList(ctx context.Context, data []byte) (any, error) {
	var req TopicListRequest
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	if req.Offset != nil && *req.Offset < 0 {
		return nil, badField("offset", "must be 0 or more, not %d", *req.Offset)
	}
	if req.Limit != nil && (*req.Limit < 1 || *req.Limit > maxTopicPage) {
		return nil, badField("limit", "must be within 1..%d, not %d", maxTopicPage, *req.Limit)
	}
	gather, bound, err := s.gathers(ctx, Scope{Local: req.Local, Timeout: req.Timeout})
	if err != nil {
		return nil, err
	}
	out := TopicListReply{Origin: s.origin(), Topics: []TopicView{}}
	for _, tc := range s.b.Topics() {
		out.Topics = append(out.Topics, topicView(tc))
	}
	if gather {
		// The other nodes answer with their whole lists: a page is cut from the union.
		whole, err := json.Marshal(Scope{Local: req.Local, Timeout: req.Timeout})
		if err != nil {
			return nil, fmt.Errorf("topic.list: %w", err)
		}
		answers, cov := gatherFrom[TopicListReply](s, "topic.list", whole, bound)
		self := answer[TopicListReply]{node: s.cfg.Node, broker: s.b.Status().BrokerName, reply: out}
		out.Topics, out.Coverage = mergeTopics(append([]answer[TopicListReply]{self}, answers...)), cov
	}
	if req.paged() {
		s.topicPage(&out, req)
	}
	return out, nil
}

// topicPage cuts the page req asks for out of a reply's topics, and adds the page's stats.
func (s *Service) topicPage(out *TopicListReply, req TopicListRequest) {
	kept := out.Topics[:0]
	for _, tv := range out.Topics {
		if strings.HasPrefix(tv.Topic, req.Prefix) && strings.Contains(tv.Topic, req.Contains) {
			kept = append(kept, tv)
		}
	}
	total, from := len(kept), 0
	if req.Offset != nil {
		from = min(*req.Offset, total)
	}
	to := total
	if req.Limit != nil {
		to = min(from+*req.Limit, total)
	}
	out.Topics = kept[from:to]
	out.Total, out.Offset = &total, &from
	out.Stats = map[string]TopicStats{}
	for _, tv := range out.Topics {
		ts := TopicStats{Messages: topicMessages(s.b, tv.Topic)}
		if r, ok := s.rates.rate(tv.Topic); ok {
			ts.Rate = &r
		}
		out.Stats[tv.Topic] = ts
	}
}

// mergeTopics is the union of the nodes' topic lists, by name, each topic with the queues
// of every broker that has it. The first answer's view of a topic (this node's) is its
// configuration; the brokers are in name order.
func mergeTopics(answers []answer[TopicListReply]) []TopicView {
	byName := map[string]*TopicView{}
	var names []string
	for _, a := range answers {
		for _, tv := range a.reply.Topics {
			v, ok := byName[tv.Topic]
			if !ok {
				base := tv
				base.Brokers = nil
				v = &base
				byName[tv.Topic] = v
				names = append(names, tv.Topic)
			}
			v.Brokers = append(v.Brokers, TopicBrokerView{Broker: a.broker, Node: a.node, ReadQueues: tv.ReadQueues, WriteQueues: tv.WriteQueues, Perm: tv.Perm})
		}
	}
	slices.Sort(names)
	out := make([]TopicView, 0, len(names))
	for _, name := range names {
		v := byName[name]
		slices.SortFunc(v.Brokers, func(x, y TopicBrokerView) int { return cmp.Compare(x.Broker, y.Broker) })
		out = append(out, *v)
	}
	return out
}

// QueueView is one queue's stored offsets.
type QueueView struct {
	Queue     int32 `json:"queue"`
	MinOffset int64 `json:"min_offset"`
	MaxOffset int64 `json:"max_offset"`
}

// TopicDescribeReply is the reply of topic.describe.
type TopicDescribeReply struct {
	Origin
	Topic  TopicView   `json:"topic"`
	Queues []QueueView `json:"queues"`
	// Messages is the number of messages stored: the sum of max - min over the queues.
	Messages int64 `json:"messages"`
	// Rate is the messages stored per second over the last sampling interval; absent until
	// the topic has been sampled twice.
	Rate *float64 `json:"rate,omitempty"`
}

func (s *Service) topicDescribe(_ context.Context, data []byte) (any, error) {
	var req TopicRef
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	if err := checkTopicName(req.Topic); err != nil {
		return nil, err
	}
	tc, ok := s.b.Topic(req.Topic)
	qs, err := s.b.TopicQueues(req.Topic)
	if !ok || errors.Is(err, broker.ErrNotFound) {
		return nil, &cmdError{code: CodeNotFound, msg: "topic " + req.Topic + " does not exist"}
	}
	if err != nil {
		return nil, brokerError(err, "topic")
	}
	out := TopicDescribeReply{Origin: s.origin(), Topic: topicView(tc), Queues: make([]QueueView, 0, len(qs))}
	for _, q := range qs {
		out.Queues = append(out.Queues, QueueView{Queue: q.QueueID, MinOffset: q.MinOffset, MaxOffset: q.MaxOffset})
		out.Messages += q.MaxOffset - q.MinOffset
	}
	if r, ok := s.rates.rate(req.Topic); ok {
		out.Rate = &r
	}
	return out, nil
}
