package control

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/fields"
	"github.com/flowd-io/flowd/protocol"
)

// GroupSummaryView is one group in group.list.
type GroupSummaryView struct {
	Group string `json:"group"`
	// Configured is true when the group has a subscription group entry.
	Configured bool     `json:"configured"`
	Members    int      `json:"members"`
	Topics     []string `json:"topics"`
	// Lag is the messages the group has still to consume, over all its topics.
	Lag int64 `json:"lag"`
	// Brokers lists, in a gathered group.list, the brokers that know the group, by name;
	// absent otherwise. Members is then the most members one broker sees (a member joins
	// every broker it reads from), Lag the sum of theirs.
	Brokers []string `json:"brokers,omitempty"`
}

// GroupListReply is the reply of group.list.
type GroupListReply struct {
	Origin
	Groups []GroupSummaryView `json:"groups"`
	Coverage
}

// GroupListRequest is the request of group.list: nothing, or a scope (see Scope).
type GroupListRequest struct {
	Local   bool             `json:"local,omitempty"`
	Timeout *fields.Duration `json:"timeout,omitempty"`
}

func (s *Service) groupList(ctx context.Context, data []byte) (any, error) {
	var req GroupListRequest
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	gather, bound, err := s.gathers(ctx, Scope(req))
	if err != nil {
		return nil, err
	}
	out := s.localGroups()
	if !gather {
		return out, nil
	}
	answers, cov := gatherFrom[GroupListReply](s, "group.list", data, bound)
	self := answer[GroupListReply]{node: s.cfg.Node, broker: s.b.Status().BrokerName, reply: out}
	out.Groups, out.Coverage = mergeGroupList(append([]answer[GroupListReply]{self}, answers...)), cov
	return out, nil
}

// mergeGroupList is the union of the nodes' group lists, by name.
func mergeGroupList(answers []answer[GroupListReply]) []GroupSummaryView {
	byName := map[string]*GroupSummaryView{}
	for _, a := range answers {
		for _, g := range a.reply.Groups {
			v, ok := byName[g.Group]
			if !ok {
				v = &GroupSummaryView{Group: g.Group, Topics: []string{}}
				byName[g.Group] = v
			}
			v.Configured = v.Configured || g.Configured
			v.Members = max(v.Members, g.Members)
			v.Lag += g.Lag
			v.Topics = append(v.Topics, g.Topics...)
			v.Brokers = append(v.Brokers, a.broker)
		}
	}
	out := make([]GroupSummaryView, 0, len(byName))
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		v := byName[name]
		slices.Sort(v.Topics)
		v.Topics = slices.Compact(v.Topics)
		slices.Sort(v.Brokers)
		out = append(out, *v)
	}
	return out
}

// localGroups is this node's group.list.
func (s *Service) localGroups() GroupListReply {
	out := GroupListReply{Origin: s.origin(), Groups: []GroupSummaryView{}}
	for _, g := range s.b.Groups() {
		v := GroupSummaryView{Group: g.Name, Configured: g.Configured, Members: g.Members, Topics: g.Topics}
		if v.Topics == nil {
			v.Topics = []string{}
		}
		if info, err := s.b.DescribeGroup(g.Name); err == nil {
			v.Lag = info.Lag
		}
		out.Groups = append(out.Groups, v)
	}
	return out
}

// GroupRef is the request of group.describe: the group, and a scope (see Scope).
type GroupRef struct {
	Group   string           `json:"group"`
	Local   bool             `json:"local,omitempty"`
	Timeout *fields.Duration `json:"timeout,omitempty"`
}

// MemberView is one live member of a group.
type MemberView struct {
	ClientID      string    `json:"client_id"`
	RemoteAddr    string    `json:"remote_addr,omitempty"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	// Brokers lists, in a gathered group.describe, the brokers it is a member on, by name
	// (RemoteAddr is its connection to the first); absent otherwise.
	Brokers []string `json:"brokers,omitempty"`
}

// SubscriptionView is what a group subscribes to in one topic.
type SubscriptionView struct {
	Topic string `json:"topic"`
	// Expression is the tag expression ("*", "a || b") or SQL92 filter.
	Expression string `json:"expression"`
	// Type is "TAG" or "SQL92".
	Type string `json:"type"`
}

// GroupQueueView is a group's position in one queue.
type GroupQueueView struct {
	Queue int32 `json:"queue"`
	// Committed is the committed offset; absent when the group never committed one.
	Committed *int64 `json:"committed,omitempty"`
	MinOffset int64  `json:"min_offset"`
	MaxOffset int64  `json:"max_offset"`
	Lag       int64  `json:"lag"`
	// Owner is the client id holding the queue's lock, the queue's owner for orderly and flowd
	// consumers; absent when nobody holds it (RocketMQ's concurrent consumers do not lock).
	Owner string `json:"owner,omitempty"`
	// Broker is the broker of the queue, in a gathered group.describe; absent otherwise.
	Broker string `json:"broker,omitempty"`
	// Pop is the group's pop progress in the queue; absent when it never received from the
	// queue by pop.
	Pop *PopQueueView `json:"pop,omitempty"`
}

// PopQueueView is a pop group's progress in one queue: handed out and not acknowledged
// (in_flight), waiting for a redelivery or held by FIFO order (visible), acknowledged,
// dead-lettered and redelivered counts, and the consumed offset (every message below it
// acknowledged or dead-lettered), from which lag counts.
type PopQueueView struct {
	InFlight       int    `json:"in_flight"`
	Visible        int    `json:"visible"`
	Acked          uint64 `json:"acked"`
	DeadLettered   uint64 `json:"dead_lettered"`
	Redelivered    uint64 `json:"redelivered"`
	ConsumedOffset int64  `json:"consumed_offset"`
	// Receiver is the client id of the last receive that got messages of the queue; absent
	// when none said.
	Receiver string `json:"receiver,omitempty"`
}

// GroupTopicView is a group's position in one topic.
type GroupTopicView struct {
	Topic  string           `json:"topic"`
	Lag    int64            `json:"lag"`
	Queues []GroupQueueView `json:"queues"`
}

// GroupDescribeReply is the reply of group.describe.
type GroupDescribeReply struct {
	Origin
	Group            string             `json:"group"`
	Configured       bool               `json:"configured"`
	ConsumeType      string             `json:"consume_type,omitempty"`
	MessageModel     string             `json:"message_model,omitempty"`
	ConsumeFromWhere string             `json:"consume_from_where,omitempty"`
	Members          []MemberView       `json:"members"`
	Subscriptions    []SubscriptionView `json:"subscriptions"`
	// Allocation maps each owned queue ("topic:queue"; gathered, "topic:broker:queue") to
	// its owner's client id, as far as the brokers know it (queue locks).
	Allocation map[string]string `json:"allocation"`
	Topics     []GroupTopicView  `json:"topics"`
	Lag        int64             `json:"lag"`
	Coverage
}

func checkGroupName(name string) error {
	if name == "" {
		return badField("group", "required")
	}
	if err := broker.ValidateGroup(name); err != nil {
		return badField("group", "%s", err)
	}
	return nil
}

func (s *Service) groupDescribe(ctx context.Context, data []byte) (any, error) {
	var req GroupRef
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	if err := checkGroupName(req.Group); err != nil {
		return nil, err
	}
	gather, bound, err := s.gathers(ctx, Scope{Local: req.Local, Timeout: req.Timeout})
	if err != nil {
		return nil, err
	}
	own, err := s.localGroup(req.Group)
	if !gather || (err != nil && !errors.Is(err, broker.ErrNotFound)) {
		if err != nil {
			return nil, brokerError(err, "group")
		}
		return own, nil
	}
	answers, cov := gatherFrom[GroupDescribeReply](s, "group.describe", data, bound)
	self := answer[GroupDescribeReply]{node: s.cfg.Node, broker: s.b.Status().BrokerName, reply: own, notFound: err != nil}
	out, found := mergeGroup(s.origin(), append([]answer[GroupDescribeReply]{self}, answers...))
	if !found {
		return nil, &cmdError{code: CodeNotFound, msg: "group " + req.Group + " is known to no node" + missingNote(cov)}
	}
	out.Coverage = cov
	return out, nil
}

// localGroup is this node's group.describe of group.
func (s *Service) localGroup(group string) (GroupDescribeReply, error) {
	info, err := s.b.DescribeGroup(group)
	if err != nil {
		return GroupDescribeReply{}, err
	}
	out := GroupDescribeReply{
		Origin: s.origin(), Group: info.Name, Configured: info.Config != nil,
		ConsumeType: info.ConsumeType, MessageModel: info.MessageModel, ConsumeFromWhere: info.ConsumeFromWhere,
		Members: []MemberView{}, Subscriptions: []SubscriptionView{}, Allocation: map[string]string{}, Topics: []GroupTopicView{}, Lag: info.Lag,
	}
	for _, m := range info.Members {
		out.Members = append(out.Members, MemberView{ClientID: m.ClientID, RemoteAddr: m.RemoteAddr, LastHeartbeat: m.LastHeartbeat})
	}
	for _, sub := range info.Subscriptions {
		out.Subscriptions = append(out.Subscriptions, SubscriptionView{Topic: sub.Topic, Expression: sub.Expression, Type: sub.ExpressionType})
	}
	for _, t := range info.Topics {
		tv := GroupTopicView{Topic: t.Topic, Lag: t.Lag, Queues: make([]GroupQueueView, 0, len(t.Queues))}
		for _, q := range t.Queues {
			qv := GroupQueueView{Queue: q.QueueID, MinOffset: q.MinOffset, MaxOffset: q.MaxOffset, Lag: q.Lag, Owner: q.Owner}
			if p := q.Pop; p != nil {
				qv.Pop = &PopQueueView{InFlight: p.InFlight, Visible: p.Visible, Acked: p.Acked, DeadLettered: p.DeadLettered,
					Redelivered: p.Redelivered, ConsumedOffset: p.ConsumedOffset, Receiver: p.Receiver}
			}
			if q.Committed >= 0 {
				c := q.Committed
				qv.Committed = &c
			}
			if q.Owner != "" {
				out.Allocation[t.Topic+":"+strconv.Itoa(int(q.QueueID))] = q.Owner
			}
			tv.Queues = append(tv.Queues, qv)
		}
		out.Topics = append(out.Topics, tv)
	}
	return out, nil
}

// mergeGroup merges the nodes' descriptions of one group: members by client id (with the
// brokers each is a member on), subscriptions once each, every broker's queues of each
// topic (marked with the broker), the lags summed. found is false when no node knows it.
func mergeGroup(origin Origin, answers []answer[GroupDescribeReply]) (out GroupDescribeReply, found bool) {
	out = GroupDescribeReply{Origin: origin, Members: []MemberView{}, Subscriptions: []SubscriptionView{}, Allocation: map[string]string{}, Topics: []GroupTopicView{}}
	members, topics, subs := map[string]int{}, map[string]int{}, map[SubscriptionView]bool{}
	for _, a := range answers {
		if a.notFound {
			continue
		}
		r := a.reply
		found, out.Group, out.Configured = true, r.Group, out.Configured || r.Configured
		out.ConsumeType = cmp.Or(out.ConsumeType, r.ConsumeType)
		out.MessageModel = cmp.Or(out.MessageModel, r.MessageModel)
		out.ConsumeFromWhere = cmp.Or(out.ConsumeFromWhere, r.ConsumeFromWhere)
		out.Lag += r.Lag
		for _, m := range r.Members {
			i, ok := members[m.ClientID]
			if !ok {
				m.Brokers = nil
				out.Members = append(out.Members, m)
				i = len(out.Members) - 1
				members[m.ClientID] = i
			} else if m.LastHeartbeat.After(out.Members[i].LastHeartbeat) {
				out.Members[i].LastHeartbeat = m.LastHeartbeat
			}
			out.Members[i].Brokers = append(out.Members[i].Brokers, a.broker)
		}
		for _, sub := range r.Subscriptions {
			if !subs[sub] {
				subs[sub] = true
				out.Subscriptions = append(out.Subscriptions, sub)
			}
		}
		for _, t := range r.Topics {
			i, ok := topics[t.Topic]
			if !ok {
				out.Topics = append(out.Topics, GroupTopicView{Topic: t.Topic, Queues: []GroupQueueView{}})
				i = len(out.Topics) - 1
				topics[t.Topic] = i
			}
			out.Topics[i].Lag += t.Lag
			for _, q := range t.Queues {
				q.Broker = a.broker
				out.Topics[i].Queues = append(out.Topics[i].Queues, q)
				if q.Owner != "" {
					out.Allocation[t.Topic+":"+a.broker+":"+strconv.Itoa(int(q.Queue))] = q.Owner
				}
			}
		}
	}
	slices.SortFunc(out.Members, func(x, y MemberView) int { return cmp.Compare(x.ClientID, y.ClientID) })
	slices.SortFunc(out.Subscriptions, func(x, y SubscriptionView) int {
		return cmp.Or(cmp.Compare(x.Topic, y.Topic), cmp.Compare(x.Expression, y.Expression), cmp.Compare(x.Type, y.Type))
	})
	slices.SortFunc(out.Topics, func(x, y GroupTopicView) int { return cmp.Compare(x.Topic, y.Topic) })
	for _, t := range out.Topics {
		slices.SortFunc(t.Queues, func(x, y GroupQueueView) int {
			return cmp.Or(cmp.Compare(x.Broker, y.Broker), cmp.Compare(x.Queue, y.Queue))
		})
	}
	return out, found
}

// ResetRequest is the request of group.reset_offset. Exactly one of To, Timestamp and
// Offsets says where the group goes.
type ResetRequest struct {
	Group string `json:"group"`
	Topic string `json:"topic"`
	// To is "earliest" (the oldest message kept) or "latest" (after the newest message).
	To string `json:"to,omitempty"`
	// Timestamp is Unix milliseconds (a number) or an RFC 3339 time (a string): every queue
	// goes to its first message stored at or after it.
	Timestamp json.RawMessage `json:"timestamp,omitempty"`
	// Offsets maps queue ids (as strings, JSON object keys) to offsets; queues not named keep
	// their offsets.
	Offsets map[string]int64 `json:"offsets,omitempty"`
}

// QueueOffset is one queue's new offset.
type QueueOffset struct {
	Queue  int32 `json:"queue"`
	Offset int64 `json:"offset"`
}

// ResetReply is the reply of group.reset_offset.
type ResetReply struct {
	Origin
	Group   string        `json:"group"`
	Topic   string        `json:"topic"`
	Offsets []QueueOffset `json:"offsets"`
	// Members is how many live members were told (RESET_CONSUMER_OFFSET).
	Members int `json:"members"`
	// Warning says which members could not be told; they continue from their own position
	// until they next read the committed offsets. Absent when all were told.
	Warning string `json:"warning,omitempty"`
}

// parseTimestamp reads a JSON number of Unix milliseconds or an RFC 3339 string.
func parseTimestamp(raw json.RawMessage) (int64, error) {
	raw = bytes.TrimSpace(raw)
	var ms int64
	if err := json.Unmarshal(raw, &ms); err == nil {
		if ms <= 0 {
			return 0, badField("timestamp", "must be positive Unix milliseconds, not %d", ms)
		}
		return ms, nil
	}
	var str string
	if err := json.Unmarshal(raw, &str); err != nil {
		return 0, badField("timestamp", "must be Unix milliseconds (a number) or an RFC 3339 time (a string), not %s", clip(string(raw), echoLimit))
	}
	t, err := time.Parse(time.RFC3339Nano, str)
	if err != nil {
		return 0, badField("timestamp", "must be Unix milliseconds or an RFC 3339 time: %s", err)
	}
	if t.UnixMilli() <= 0 {
		return 0, badField("timestamp", "must be after 1970, not %s", str)
	}
	return t.UnixMilli(), nil
}

func (s *Service) groupResetOffset(ctx context.Context, data []byte) (any, error) {
	var req ResetRequest
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	if err := checkGroupName(req.Group); err != nil {
		return nil, err
	}
	if err := checkTopicName(req.Topic); err != nil {
		return nil, err
	}
	given := 0
	for _, set := range []bool{req.To != "", req.Timestamp != nil, req.Offsets != nil} {
		if set {
			given++
		}
	}
	if given != 1 {
		return nil, badRequest("give exactly one of \"to\", \"timestamp\" and \"offsets\"")
	}
	members := len(s.b.GroupMembers(req.Group))
	var table map[protocol.MessageQueue]int64
	var err error
	field := "topic"
	switch {
	case req.To == "earliest":
		table, err = s.b.ResetOffsets(ctx, req.Group, req.Topic, 0)
	case req.To == "latest":
		tc, _ := s.b.Topic(req.Topic)
		qs, qerr := s.b.TopicQueues(req.Topic)
		if qerr != nil {
			return nil, brokerError(qerr, "topic")
		}
		offsets := make(map[int32]int64, len(qs))
		for _, q := range qs {
			if int(q.QueueID) < tc.ReadQueueNums { // consumers read these only
				offsets[q.QueueID] = q.MaxOffset
			}
		}
		table, err = s.b.ResetOffsetsTo(ctx, req.Group, req.Topic, offsets)
	case req.To != "":
		return nil, badField("to", "must be \"earliest\" or \"latest\", not %q", req.To)
	case req.Timestamp != nil:
		ts, terr := parseTimestamp(req.Timestamp)
		if terr != nil {
			return nil, terr
		}
		table, err = s.b.ResetOffsets(ctx, req.Group, req.Topic, ts)
	default:
		if len(req.Offsets) == 0 {
			return nil, badField("offsets", "must name at least one queue")
		}
		offsets := make(map[int32]int64, len(req.Offsets))
		for k, off := range req.Offsets {
			q, perr := strconv.ParseInt(k, 10, 32)
			if perr != nil {
				return nil, badField("offsets", "key %q is not a queue id", k)
			}
			offsets[int32(q)] = off
		}
		field = "offsets"
		table, err = s.b.ResetOffsetsTo(ctx, req.Group, req.Topic, offsets)
	}
	if table == nil && err != nil {
		if errors.Is(err, broker.ErrReserved) {
			field = "group"
		}
		return nil, brokerError(err, field)
	}
	out := ResetReply{Origin: s.origin(), Group: req.Group, Topic: req.Topic, Members: members, Offsets: make([]QueueOffset, 0, len(table))}
	byQueue := map[int32]int64{}
	for mq, off := range table {
		byQueue[int32(mq.QueueID)] = off
	}
	for _, q := range slices.Sorted(maps.Keys(byQueue)) {
		out.Offsets = append(out.Offsets, QueueOffset{Queue: q, Offset: byQueue[q]})
	}
	if err != nil {
		// The offsets are committed; some members were not told.
		out.Warning = err.Error()
	}
	s.log.Info("consumer offsets reset by the control plane", "group", req.Group, "topic", req.Topic, "queues", len(out.Offsets), "members", members)
	return out, nil
}
