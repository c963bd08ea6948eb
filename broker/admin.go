package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/protocol"
)

// ErrNotFound is returned by the administrative methods for an unknown topic, group,
// member or message.
var ErrNotFound = errors.New("not found")

// ErrExists is wrapped by the error of CreateTopic when the topic exists already: an operator
// who meant to change it says so with UpdateTopic.
var ErrExists = errors.New("already exists")

// ErrReserved is wrapped by the error of an administrative change to a topic the broker
// keeps for itself (protocol.AutoCreateTopicKey, ScheduleTopic, the transaction topics), and
// of deleting the cluster's reply topic, which request-reply needs and the broker creates
// only when it starts.
var ErrReserved = errors.New("reserved for the broker")

// ErrBadOffset is wrapped by the error of ResetOffsetsTo for a queue id the topic does not
// have or an offset outside the queue's stored range.
var ErrBadOffset = errors.New("bad offset")

// ResetOffsets moves a group's committed offsets of topic to the first message stored at or
// after timestamp (Unix milliseconds; 0 means the oldest message kept), and tells the
// group's live members with RESET_CONSUMER_OFFSET so that they continue from there at once.
// It returns the new offset of every queue. The delay service's own group is refused
// (ErrReserved): moving it would re-deliver or drop delayed messages.
func (b *Broker) ResetOffsets(ctx context.Context, group, topic string, timestamp int64) (map[protocol.MessageQueue]int64, error) {
	if err := ValidateGroup(group); err != nil {
		return nil, fmt.Errorf("reset offsets: %w", err)
	}
	if isInternalGroup(group) {
		return nil, fmt.Errorf("reset offsets of %q: %w", group, ErrReserved)
	}
	tc, ok := b.topics.get(topic)
	if !ok {
		return nil, fmt.Errorf("reset offsets of %q: topic %q: %w", group, topic, ErrNotFound)
	}
	offsets := make(map[int32]int64, tc.ReadQueueNums)
	for q := range int32(tc.ReadQueueNums) {
		off := b.store.MinOffset(topic, q)
		if timestamp > 0 {
			off = b.store.OffsetByTimestamp(topic, q, timestamp)
		}
		offsets[q] = off
	}
	return b.applyReset(ctx, group, topic, timestamp, offsets)
}

// ResetOffsetsTo sets a group's committed offsets of some of topic's queues (queue id →
// offset) and tells the group's live members with RESET_CONSUMER_OFFSET, as ResetOffsets
// does. Every queue id must be one of the topic's read queues and every offset within the
// queue's stored range (min..max, max meaning "after the last message"), else nothing is
// changed and the error wraps ErrBadOffset. It returns the new offset of every queue given.
func (b *Broker) ResetOffsetsTo(ctx context.Context, group, topic string, offsets map[int32]int64) (map[protocol.MessageQueue]int64, error) {
	if err := ValidateGroup(group); err != nil {
		return nil, fmt.Errorf("reset offsets: %w", err)
	}
	if isInternalGroup(group) {
		return nil, fmt.Errorf("reset offsets of %q: %w", group, ErrReserved)
	}
	tc, ok := b.topics.get(topic)
	if !ok {
		return nil, fmt.Errorf("reset offsets of %q: topic %q: %w", group, topic, ErrNotFound)
	}
	if len(offsets) == 0 {
		return nil, fmt.Errorf("reset offsets of %q in %q: %w: no queue given", group, topic, ErrBadOffset)
	}
	for _, q := range slices.Sorted(maps.Keys(offsets)) {
		if q < 0 || int(q) >= tc.ReadQueueNums {
			return nil, fmt.Errorf("reset offsets of %q in %q: %w: queue %d, the topic has queues 0..%d", group, topic, ErrBadOffset, q, tc.ReadQueueNums-1)
		}
		lo, hi := b.store.MinOffset(topic, q), b.store.MaxOffset(topic, q)
		if off := offsets[q]; off < lo || off > hi {
			return nil, fmt.Errorf("reset offsets of %q in %q: %w: queue %d offset %d is outside %d..%d", group, topic, ErrBadOffset, q, off, lo, hi)
		}
	}
	return b.applyReset(ctx, group, topic, 0, offsets)
}

// applyReset commits offsets and tells the group's live members. A member that cannot be
// told keeps its position until its next rebalance or restart reads the committed offset;
// the error says which.
func (b *Broker) applyReset(ctx context.Context, group, topic string, timestamp int64, offsets map[int32]int64) (map[protocol.MessageQueue]int64, error) {
	table := make(map[protocol.MessageQueue]int64, len(offsets))
	for q, off := range offsets {
		b.commitOffset(group, topic, q, off)
		table[protocol.MessageQueue{Topic: topic, BrokerName: b.cfg.BrokerName, QueueID: int(q)}] = off
	}
	body, err := (&protocol.ResetOffsetBody{OffsetTable: table}).Encode()
	if err != nil {
		return nil, fmt.Errorf("reset offsets of %q: %w", group, err)
	}
	h := &protocol.ResetOffsetRequestHeader{Topic: topic, Group: group, Timestamp: timestamp, IsForce: true}
	var errs []error
	conns := b.consumers.conns(group)
	for _, c := range conns {
		req := protocol.NewRequestWith(protocol.ResetConsumerOffset, h, body)
		if err := c.InvokeOneway(ctx, req); err != nil {
			errs = append(errs, fmt.Errorf("tell %s: %w", c.RemoteAddr(), err))
		}
	}
	b.events.emit(Event{Type: OffsetReset, Group: group, Topic: topic, Offsets: maps.Clone(offsets)})
	b.log.Info("consumer offsets reset", "group", group, "topic", topic, "timestamp", timestamp, "members", len(conns))
	return table, errors.Join(errs...)
}

// ConsumerRunningInfo asks one member of a group for its running state
// (GET_CONSUMER_RUNNING_INFO): its subscriptions and, per queue, what it has cached and
// committed.
func (b *Broker) ConsumerRunningInfo(ctx context.Context, group, clientID string) (*protocol.ConsumerRunningInfo, error) {
	c := b.consumers.conn(group, clientID)
	if c == nil {
		return nil, fmt.Errorf("running info of %q in %q: %w", clientID, group, ErrNotFound)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	h := &protocol.GetConsumerRunningInfoRequestHeader{ConsumerGroup: group, ClientID: clientID}
	resp, err := c.Invoke(ctx, protocol.NewRequestWith(protocol.GetConsumerRunningInfo, h, nil))
	if err != nil {
		return nil, fmt.Errorf("running info of %q: %w", clientID, err)
	}
	if resp.ResponseCode() != protocol.Success {
		return nil, fmt.Errorf("running info of %q: %s: %s", clientID, resp.ResponseCode(), resp.Remark)
	}
	info, err := protocol.DecodeConsumerRunningInfo(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("running info of %q: %w", clientID, err)
	}
	return info, nil
}

// isInternalGroup reports whether a group name belongs to the broker itself (the delay
// service's offsets), which the administrative listings leave out.
func isInternalGroup(name string) bool { return name == scheduleGroup }

// CreateTopic creates a topic, written to topics.json before it returns. It fails with an
// error wrapping ErrBadTopic for a bad name, queue count or permission, ErrExists when the
// topic exists, and ErrReserved for the broker's own topics. It is what
// UPDATE_AND_CREATE_TOPIC does for a new topic, minus the silent replacement.
func (b *Broker) CreateTopic(tc TopicConfig) error {
	if isSystemTopic(tc.Name) {
		return fmt.Errorf("create topic %q: %w", tc.Name, ErrReserved)
	}
	_, err := b.putTopic(tc, func(_ TopicConfig, existed bool) error {
		if existed {
			return fmt.Errorf("create topic %q: %w", tc.Name, ErrExists)
		}
		return nil
	})
	return err
}

// UpdateTopic replaces an existing topic's configuration (queue counts, permission, order),
// written before it returns. It fails with ErrNotFound for an unknown topic, ErrBadTopic for
// a bad config and ErrReserved for the broker's own topics. Lowering the queue counts hides
// the queues above them from routes; their messages stay until retention removes them.
func (b *Broker) UpdateTopic(tc TopicConfig) error {
	if isSystemTopic(tc.Name) {
		return fmt.Errorf("update topic %q: %w", tc.Name, ErrReserved)
	}
	_, err := b.putTopic(tc, func(_ TopicConfig, existed bool) error {
		if !existed {
			return fmt.Errorf("update topic %q: %w", tc.Name, ErrNotFound)
		}
		return nil
	})
	return err
}

// PutTopic creates or replaces a topic (UPDATE_AND_CREATE_TOPIC) and reports whether it was
// created. Errors wrap ErrBadTopic or ErrReserved as CreateTopic's do.
func (b *Broker) PutTopic(tc TopicConfig) (created bool, err error) {
	if isSystemTopic(tc.Name) {
		return false, fmt.Errorf("put topic %q: %w", tc.Name, ErrReserved)
	}
	return b.putTopic(tc, nil)
}

func (b *Broker) putTopic(tc TopicConfig, check func(TopicConfig, bool) error) (bool, error) {
	created, updated, err := b.topics.putIf(tc, check)
	if err != nil {
		return false, err
	}
	switch {
	case created:
		b.log.Info("topic created", "topic", tc.Name, "queues", tc.WriteQueueNums)
		b.events.emit(Event{Type: TopicCreated, Topic: tc.Name, Queues: tc.WriteQueueNums})
	case updated:
		b.log.Info("topic updated", "topic", tc.Name, "queues", tc.WriteQueueNums)
		b.events.emit(Event{Type: TopicUpdated, Topic: tc.Name, Queues: tc.WriteQueueNums})
	}
	return created, nil
}

// DeleteTopic removes a topic: its consume queues, its configuration and every group's
// offsets of it (DELETE_TOPIC_IN_BROKER). It fails with ErrNotFound for an unknown topic and
// ErrReserved for the broker's own topics and the cluster's reply topic.
//
// The messages go first, then the config: a crash in between leaves the topic listed but
// empty (deleting it again finishes the job). The other order could leave the messages of a
// topic no longer listed, and the next send re-creating it would bring them back.
func (b *Broker) DeleteTopic(name string) error {
	if isSystemTopic(name) || name == protocol.ReplyTopic(b.cfg.Cluster) {
		return fmt.Errorf("delete topic %q: %w", name, ErrReserved)
	}
	if err := b.deleteTopic(name); err != nil {
		return fmt.Errorf("delete topic %q: %w", name, err)
	}
	b.offsets.removeTopic(name)
	b.log.Info("topic deleted", "topic", name)
	b.events.emit(Event{Type: TopicDeleted, Topic: name})
	return nil
}

// deleteTopic drops the topic's queues, then its config, under deleteMu.
func (b *Broker) deleteTopic(name string) error {
	b.deleteMu.Lock()
	defer b.deleteMu.Unlock()
	if _, ok := b.topics.get(name); !ok {
		return ErrNotFound
	}
	if err := b.store.DeleteTopic(name); err != nil {
		return err
	}
	removed, err := b.topics.remove(name)
	if err != nil {
		return err
	}
	if !removed {
		return ErrNotFound
	}
	return nil
}

// QueueRange is one queue of a topic and the offsets it stores.
type QueueRange struct {
	QueueID int32
	// MinOffset is the first offset still stored; MaxOffset is one past the last message.
	MinOffset, MaxOffset int64
}

// TopicQueues returns the stored offset range of every queue of a topic, by queue id: as
// many queues as the larger of its read and write queue counts, so that messages written to
// queues consumers do not read (more write than read queues) are seen too.
func (b *Broker) TopicQueues(name string) ([]QueueRange, error) {
	tc, ok := b.topics.get(name)
	if !ok {
		return nil, fmt.Errorf("topic %q: %w", name, ErrNotFound)
	}
	n := max(tc.ReadQueueNums, tc.WriteQueueNums)
	out := make([]QueueRange, n)
	for q := range int32(n) {
		out[q] = QueueRange{QueueID: q, MinOffset: b.store.MinOffset(name, q), MaxOffset: b.store.MaxOffset(name, q)}
	}
	return out, nil
}

// GroupSummary is one consumer group as GroupNames lists it.
type GroupSummary struct {
	Name string
	// Configured is true when the group has a subscription group entry
	// (subscriptionGroups.json); a group known only by its offsets or members has none.
	Configured bool
	// Members is the number of live members.
	Members int
	// Topics are the topics the group subscribes to or has committed offsets of, sorted.
	Topics []string
}

// Groups returns every consumer group the broker knows, by subscription group entry, live
// members or committed offsets, sorted by name. The broker's internal groups are left out.
func (b *Broker) Groups() []GroupSummary {
	byName := map[string]*GroupSummary{}
	get := func(name string) *GroupSummary {
		g := byName[name]
		if g == nil {
			g = &GroupSummary{Name: name}
			byName[name] = g
		}
		return g
	}
	topics := map[string]map[string]bool{}
	addTopic := func(group, topic string) {
		if topics[group] == nil {
			topics[group] = map[string]bool{}
		}
		topics[group][topic] = true
	}
	b.groups.mu.RLock()
	for name := range b.groups.groups {
		get(name).Configured = true
	}
	b.groups.mu.RUnlock()
	b.consumers.mu.Lock()
	for name, g := range b.consumers.groups {
		get(name).Members = len(g.members)
		for t := range g.subs {
			addTopic(name, t)
		}
	}
	b.consumers.mu.Unlock()
	b.offsets.mu.Lock()
	for key := range b.offsets.offsets {
		get(key.group)
		addTopic(key.group, key.topic)
	}
	b.offsets.mu.Unlock()
	out := make([]GroupSummary, 0, len(byName))
	for name, g := range byName {
		if isInternalGroup(name) {
			continue
		}
		g.Topics = slices.Sorted(maps.Keys(topics[name]))
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b GroupSummary) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// GroupInfo is a consumer group in detail, as DescribeGroup returns it.
type GroupInfo struct {
	Name string
	// Config is the subscription group entry; nil when the group has none.
	Config *GroupConfig
	// ConsumeType, MessageModel and ConsumeFromWhere are what the members' heartbeats said;
	// empty without live members.
	ConsumeType, MessageModel, ConsumeFromWhere string
	// Members are the live members, by client id.
	Members []MemberInfo
	// Subscriptions are the members' subscriptions, by topic.
	Subscriptions []Subscription
	// Topics are the topics subscribed to or with committed offsets, by name.
	Topics []GroupTopic
	// Lag is the sum of the queues' lags.
	Lag int64
}

// MemberInfo is one live member of a group.
type MemberInfo struct {
	ClientID string
	// RemoteAddr is the address of the member's connection; empty for a member registered
	// without one.
	RemoteAddr string
	// LastHeartbeat is when the member last heartbeated.
	LastHeartbeat time.Time
	// Allocator is the allocation strategy identity the member reported in its heartbeat
	// (flowd consumers); empty for clients that report none.
	Allocator string
}

// GroupTopic is a group's position in one topic.
type GroupTopic struct {
	Topic  string
	Queues []GroupQueue
	// Lag is the sum of the queues' lags.
	Lag int64
}

// GroupQueue is a group's position in one queue.
type GroupQueue struct {
	QueueID int32
	// Committed is the committed offset; -1 when the group never committed one.
	Committed int64
	// MinOffset and MaxOffset are the queue's stored range (max exclusive).
	MinOffset, MaxOffset int64
	// Lag is MaxOffset minus Committed (minus MinOffset when nothing was committed): the
	// messages the group has still to consume.
	Lag int64
	// Owner is the client id holding the queue's lock (orderly and flowd consumers lock the
	// queues they own); empty when nobody holds it, which is the case for RocketMQ's
	// concurrent consumers, whose allocation the broker does not see.
	Owner string
	// Pop is the group's pop progress in the queue (docs/pop.md); nil when the group never
	// received from it by pop. With it, Lag counts from Pop.ConsumedOffset: unacknowledged
	// messages are lag.
	Pop *PopQueueStats
}

// DescribeGroup returns a group's members, subscriptions and, for every topic it subscribes
// to or has committed offsets of, each queue's committed offset, lag and lock owner. It
// fails with ErrNotFound when the broker knows nothing of the group.
func (b *Broker) DescribeGroup(name string) (GroupInfo, error) {
	info := GroupInfo{Name: name}
	if name == "" || isInternalGroup(name) {
		return info, fmt.Errorf("group %q: %w", name, ErrNotFound)
	}
	known := false
	if gc, ok := b.groups.get(name); ok {
		info.Config, known = &gc, true
	}
	topics := map[string]bool{}
	b.consumers.mu.Lock()
	if g := b.consumers.groups[name]; g != nil {
		known = true
		info.ConsumeType, info.MessageModel, info.ConsumeFromWhere = g.consumeType, g.messageModel, g.consumeFromWhere
		for id, m := range g.members {
			mi := MemberInfo{ClientID: id, LastHeartbeat: m.lastSeen, Allocator: m.allocator}
			if m.conn != nil {
				mi.RemoteAddr = m.conn.RemoteAddr().String()
			}
			info.Members = append(info.Members, mi)
		}
		for t, sub := range g.subs {
			sub.Tags, sub.Codes = slices.Clone(sub.Tags), slices.Clone(sub.Codes)
			info.Subscriptions = append(info.Subscriptions, sub)
			topics[t] = true
		}
	}
	b.consumers.mu.Unlock()
	b.offsets.mu.Lock()
	for key := range b.offsets.offsets {
		if key.group == name {
			known = true
			topics[key.topic] = true
		}
	}
	b.offsets.mu.Unlock()
	pops := map[popKey]PopQueueStats{}
	for _, st := range b.PopStats(name) {
		known = true
		topics[st.Topic] = true
		pops[popKey{name, st.Topic, st.QueueID}] = st
	}
	if !known {
		return info, fmt.Errorf("group %q: %w", name, ErrNotFound)
	}
	slices.SortFunc(info.Members, func(a, b MemberInfo) int { return cmp.Compare(a.ClientID, b.ClientID) })
	slices.SortFunc(info.Subscriptions, func(a, b Subscription) int { return cmp.Compare(a.Topic, b.Topic) })
	locks := b.locks.held(name, time.Now())
	for _, topic := range slices.Sorted(maps.Keys(topics)) {
		gt := GroupTopic{Topic: topic}
		committed := b.offsets.groupOffsets(name, topic)
		queues := 0
		if tc, ok := b.topics.get(topic); ok {
			queues = tc.ReadQueueNums
		}
		for q := range committed {
			queues = max(queues, int(q)+1)
		}
		for q := range int32(queues) {
			gq := GroupQueue{QueueID: q, Committed: -1, MinOffset: b.store.MinOffset(topic, q), MaxOffset: b.store.MaxOffset(topic, q)}
			from := gq.MinOffset
			if off, ok := committed[q]; ok {
				gq.Committed, from = off, off
			}
			if st, ok := pops[popKey{name, topic, q}]; ok {
				gq.Pop, from = &st, st.ConsumedOffset
			}
			gq.Lag = max(gq.MaxOffset-from, 0)
			gq.Owner = locks[protocol.MessageQueue{Topic: topic, BrokerName: b.cfg.BrokerName, QueueID: int(q)}]
			gt.Lag += gq.Lag
			gt.Queues = append(gt.Queues, gq)
		}
		info.Lag += gt.Lag
		info.Topics = append(info.Topics, gt)
	}
	return info, nil
}

// MessageByID returns the message an offset message id (the msgId of a send response, the
// broker's id of a stored message) names. The id must be well formed (else the error wraps
// protocol.ErrBadMsgID) and name a message this broker stored (else ErrNotFound). The body
// is returned as stored, compressed or not.
func (b *Broker) MessageByID(msgID string) (*protocol.MessageExt, error) {
	host, off, err := protocol.ParseOffsetMsgID(msgID)
	if err != nil {
		return nil, fmt.Errorf("message %s: %w", msgID, err)
	}
	raw, err := b.store.MessageAt(off)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("message %s: %w", msgID, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("message %s: %w", msgID, err)
	}
	m, _, err := protocol.DecodeStored(raw)
	if err != nil {
		return nil, fmt.Errorf("message %s: %w", msgID, err)
	}
	if m.StoreHost != host {
		// The offset holds a message, but the id was given by another broker.
		return nil, fmt.Errorf("message %s: stored by %s, not by this broker (%s): %w", msgID, host, m.StoreHost, ErrNotFound)
	}
	return m, nil
}

// Status is a snapshot of the broker's identity, addresses and counters.
type Status struct {
	// Cluster and BrokerName are Config.Cluster and Config.BrokerName.
	Cluster, BrokerName string
	// Addr is the advertised broker address; NamesrvAddr the name service's ("" when off).
	Addr, NamesrvAddr string
	// Started is when the broker was opened.
	Started time.Time
	// Topics counts every topic, the broker's own and retry and dead-letter topics included.
	Topics int
	// Groups counts the consumer groups Groups lists.
	Groups int
	// Clients counts the distinct client ids with live group members; Members counts the
	// memberships (a client in two groups counts twice).
	Clients, Members int
	// LockedQueues counts the queue locks held.
	LockedQueues int
	// WaitingPulls counts long-polling pulls waiting for a message.
	WaitingPulls int64
	// EventsDropped is EventsDropped().
	EventsDropped uint64
	// Store is the store's positions and counters.
	Store store.Stats
}

// Status returns the broker's status.
func (b *Broker) Status() Status {
	st := Status{
		Cluster: b.cfg.Cluster, BrokerName: b.cfg.BrokerName,
		Addr: b.addr, NamesrvAddr: b.NamesrvAddr(),
		Started:       b.started,
		Topics:        len(b.topics.list()),
		Groups:        len(b.Groups()),
		WaitingPulls:  b.poll.waiting.Load(),
		EventsDropped: b.events.dropped.Load(),
		Store:         b.store.Stats(),
	}
	clients := map[string]bool{}
	b.consumers.mu.Lock()
	for _, g := range b.consumers.groups {
		for id := range g.members {
			clients[id] = true
			st.Members++
		}
	}
	b.consumers.mu.Unlock()
	st.Clients = len(clients)
	_, st.LockedQueues = b.locks.size()
	return st
}

// MaxQueues is the most read or write queues a topic may have.
const MaxQueues = maxQueues
