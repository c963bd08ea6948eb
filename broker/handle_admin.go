package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// The administrative and inspection requests RocketMQ's admin tools (mqadmin, the dashboard,
// rocketmq-client-go's admin package) send. They answer from the broker's own administrative
// methods (admin.go), in the JSON bodies Java's tools parse. flowd is its own name server, so
// the name-server requests answer with this broker and the rest of the cluster as
// Config.Peers reports it: cluster info adds its brokers, the topic lists its shared topics.

// processClusterInfo answers GET_BROKER_CLUSTER_INFO (106): this broker group and those
// Config.Peers reports, by cluster.
func (b *Broker) processClusterInfo(req *protocol.Command) *protocol.Command {
	info := protocol.ClusterInfo{
		BrokerAddrTable: map[string]protocol.BrokerData{b.cfg.BrokerName: {
			Cluster: b.cfg.Cluster, BrokerName: b.cfg.BrokerName,
			BrokerAddrs: map[int64]string{protocol.MasterID: b.addr},
		}},
		ClusterAddrTable: map[string][]string{b.cfg.Cluster: {b.cfg.BrokerName}},
	}
	if b.cfg.Peers != nil {
		for _, bd := range b.cfg.Peers.Brokers() {
			if _, dup := info.BrokerAddrTable[bd.BrokerName]; dup {
				continue
			}
			info.BrokerAddrTable[bd.BrokerName] = bd
			info.ClusterAddrTable[bd.Cluster] = append(info.ClusterAddrTable[bd.Cluster], bd.BrokerName)
		}
		for _, names := range info.ClusterAddrTable {
			slices.Sort(names)
		}
	}
	return jsonResponse(req, &info)
}

// processAllTopicList answers GET_ALL_TOPIC_LIST_FROM_NAMESERVER (206) with every topic of
// the cluster: this broker's, its own included (a Java name server lists those too), and
// the shared topics Config.Peers reports.
func (b *Broker) processAllTopicList(req *protocol.Command) *protocol.Command {
	return jsonResponse(req, &protocol.TopicList{TopicList: b.topicNames(true, b.peerTopics())})
}

// processTopicsByCluster answers GET_TOPICS_BY_CLUSTER (224): for this broker's cluster
// every topic, as GET_ALL_TOPIC_LIST_FROM_NAMESERVER; for a cluster of a peer the shared
// topics, which every live broker has; none for another (a name server answers an unknown
// cluster with an empty list).
func (b *Broker) processTopicsByCluster(req *protocol.Command) *protocol.Command {
	var h protocol.GetTopicsByClusterRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	list := protocol.TopicList{TopicList: []string{}}
	switch {
	case h.Cluster == b.cfg.Cluster:
		list.TopicList = b.topicNames(true, b.peerTopics())
	case b.cfg.Peers != nil && slices.ContainsFunc(b.cfg.Peers.Brokers(), func(bd protocol.BrokerData) bool { return bd.Cluster == h.Cluster }):
		list.TopicList = b.topicNames(false, b.peerTopics())
	}
	return jsonResponse(req, &list)
}

// peerTopics is the cluster's shared topics as Config.Peers reports them (none alone).
func (b *Broker) peerTopics() []string {
	if b.cfg.Peers == nil {
		return nil
	}
	return b.cfg.Peers.Topics()
}

// topicNames lists, sorted and each once, this broker's topics (with own) and extra.
func (b *Broker) topicNames(own bool, extra []string) []string {
	names := slices.Clone(extra)
	if own {
		for _, tc := range b.topics.list() {
			names = append(names, tc.Name)
		}
	}
	if names == nil {
		return []string{}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// processTopicStats answers GET_TOPIC_STATS_INFO (202): every queue's stored range and when
// its last message was stored.
func (b *Broker) processTopicStats(req *protocol.Command) *protocol.Command {
	var h protocol.TopicRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	queues, err := b.TopicQueues(h.Topic)
	if errors.Is(err, ErrNotFound) {
		return errorResponse(req, protocol.TopicNotExist, fmt.Errorf("topic[%s] not exist", h.Topic))
	}
	if err != nil {
		return errorResponse(req, protocol.SystemError, err)
	}
	stats := protocol.TopicStatsTable{OffsetTable: make(map[protocol.MessageQueue]protocol.TopicOffset, len(queues))}
	for _, q := range queues {
		to := protocol.TopicOffset{MinOffset: q.MinOffset, MaxOffset: q.MaxOffset}
		if q.MaxOffset > q.MinOffset {
			to.LastUpdateTimestamp, _ = b.store.StoreTimeAt(h.Topic, q.QueueID, q.MaxOffset-1)
		}
		stats.OffsetTable[b.queueOf(h.Topic, q.QueueID)] = to
	}
	return encodedResponse(req, stats.Encode)
}

func (b *Broker) queueOf(topic string, queueID int32) protocol.MessageQueue {
	return protocol.MessageQueue{Topic: topic, BrokerName: b.cfg.BrokerName, QueueID: int(queueID)}
}

// processConsumeStats answers GET_CONSUME_STATS (208): for one topic, or every topic the
// group subscribes to or has committed offsets of, each read queue's max offset, the group's
// committed offset (0 when it has none, as Java reports it) and the store time of the last
// message it consumed. consumeTps is the group's commit rate over the last minute.
func (b *Broker) processConsumeStats(req *protocol.Command) *protocol.Command {
	var h protocol.GetConsumeStatsRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	info, err := b.DescribeGroup(h.ConsumerGroup)
	if errors.Is(err, ErrNotFound) {
		return errorResponse(req, protocol.SubscriptionGroupNotExist, fmt.Errorf("subscription group [%s] does not exist", h.ConsumerGroup))
	}
	if err != nil {
		return errorResponse(req, protocol.SystemError, err)
	}
	topics := info.Topics
	if h.Topic != "" {
		if _, ok := b.topics.get(h.Topic); !ok {
			return errorResponse(req, protocol.TopicNotExist, fmt.Errorf("topic[%s] not exist", h.Topic))
		}
		i := slices.IndexFunc(topics, func(t GroupTopic) bool { return t.Topic == h.Topic })
		if i < 0 {
			// Nothing committed nor subscribed: every queue at 0, as Java reports it.
			queues, err := b.TopicQueues(h.Topic)
			if err != nil {
				return errorResponse(req, protocol.SystemError, err)
			}
			gt := GroupTopic{Topic: h.Topic}
			for _, q := range queues {
				gt.Queues = append(gt.Queues, GroupQueue{QueueID: q.QueueID, Committed: -1, MinOffset: q.MinOffset, MaxOffset: q.MaxOffset})
			}
			topics = []GroupTopic{gt}
		} else {
			topics = topics[i : i+1]
		}
	}
	stats := protocol.ConsumeStats{OffsetTable: map[protocol.MessageQueue]protocol.OffsetWrapper{}}
	for _, gt := range topics {
		tc, ok := b.topics.get(gt.Topic)
		if !ok {
			continue // offsets left of a topic deleted meanwhile
		}
		for _, q := range gt.Queues {
			if int(q.QueueID) >= tc.ReadQueueNums {
				continue
			}
			ow := protocol.OffsetWrapper{BrokerOffset: q.MaxOffset, ConsumerOffset: max(q.Committed, 0)}
			if ow.ConsumerOffset > 0 {
				ow.LastTimestamp, _ = b.store.StoreTimeAt(gt.Topic, q.QueueID, ow.ConsumerOffset-1)
			}
			stats.OffsetTable[b.queueOf(gt.Topic, q.QueueID)] = ow
		}
	}
	stats.ConsumeTPS = b.consumeTPS(h.ConsumerGroup)
	return encodedResponse(req, stats.Encode)
}

// processConsumerConnectionList answers GET_CONSUMER_CONNECTION_LIST (203) with a group's
// live members and what they subscribe to; CONSUMER_NOT_ONLINE without live members, as
// Java answers.
func (b *Broker) processConsumerConnectionList(req *protocol.Command) *protocol.Command {
	var h protocol.ConsumerGroupRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	info, err := b.DescribeGroup(h.ConsumerGroup)
	if err != nil || len(info.Members) == 0 {
		return errorResponse(req, protocol.ConsumerNotOnline, fmt.Errorf("the consumer group[%s] not online", h.ConsumerGroup))
	}
	cc := protocol.ConsumerConnection{
		ConnectionSet:     make([]protocol.ConnectionInfo, 0, len(info.Members)),
		SubscriptionTable: make(map[string]protocol.SubscriptionData, len(info.Subscriptions)),
		ConsumeType:       info.ConsumeType, MessageModel: info.MessageModel, ConsumeFromWhere: info.ConsumeFromWhere,
	}
	for _, m := range info.Members {
		cc.ConnectionSet = append(cc.ConnectionSet, protocol.ConnectionInfo{ClientID: m.ClientID, ClientAddr: m.RemoteAddr})
	}
	for _, s := range info.Subscriptions {
		tags := s.Tags
		if tags == nil {
			tags = []string{}
		}
		cc.SubscriptionTable[s.Topic] = protocol.SubscriptionData{
			Topic: s.Topic, SubString: s.Expression, ExpressionType: s.ExpressionType,
			TagsSet: tags, CodeSet: protocol.CodeSet(orEmptySlice(s.Codes)), SubVersion: s.Version,
		}
	}
	return jsonResponse(req, &cc)
}

func orEmptySlice[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// processRuntimeInfo answers GET_BROKER_RUNTIME_INFO (28) with the counters of Status,
// under Java's key names where Java has one.
func (b *Broker) processRuntimeInfo(req *protocol.Command) *protocol.Command {
	st := b.Status()
	up := time.Since(st.Started)
	table := map[string]string{
		"brokerName":          st.BrokerName,
		"clusterName":         st.Cluster,
		"bootTimestamp":       strconv.FormatInt(st.Started.UnixMilli(), 10),
		"runtime":             fmt.Sprintf("[ %d days, %d hours, %d minutes, %d seconds ]", int(up.Hours())/24, int(up.Hours())%24, int(up.Minutes())%60, int(up.Seconds())%60),
		"commitLogMinOffset":  strconv.FormatInt(st.Store.CommitLogMinOffset, 10),
		"commitLogMaxOffset":  strconv.FormatInt(st.Store.CommitLogMaxOffset, 10),
		"dispatchBehindBytes": strconv.FormatInt(st.Store.CommitLogMaxOffset-st.Store.DispatchedOffset, 10),
		"flushedOffset":       strconv.FormatInt(st.Store.FlushedOffset, 10),
		"commitLogSegments":   strconv.Itoa(st.Store.Segments),
		"consumeQueues":       strconv.Itoa(st.Store.ConsumeQueues),
		"fsyncs":              strconv.FormatInt(st.Store.Fsyncs, 10),
		"topics":              strconv.Itoa(st.Topics),
		"groups":              strconv.Itoa(st.Groups),
		"clients":             strconv.Itoa(st.Clients),
		"members":             strconv.Itoa(st.Members),
		"lockedQueues":        strconv.Itoa(st.LockedQueues),
		"waitingPulls":        strconv.FormatInt(st.WaitingPulls, 10),
		"eventsDropped":       strconv.FormatUint(st.EventsDropped, 10),
	}
	if st.Store.WriteFailure != nil {
		table["writeFailure"] = st.Store.WriteFailure.Error()
	}
	return jsonResponse(req, &protocol.KVTable{Table: table})
}

// processAllTopicConfig answers GET_ALL_TOPIC_CONFIG (21) with every topic's configuration.
func (b *Broker) processAllTopicConfig(req *protocol.Command) *protocol.Command {
	w := protocol.TopicConfigWrapper{
		TopicConfigTable: map[string]protocol.TopicConfigBody{},
		DataVersion:      protocol.DataVersion{Timestamp: time.Now().UnixMilli()},
	}
	for _, tc := range b.topics.list() {
		w.TopicConfigTable[tc.Name] = protocol.TopicConfigBody{
			TopicName: tc.Name, ReadQueueNums: tc.ReadQueueNums, WriteQueueNums: tc.WriteQueueNums,
			Perm: tc.Perm, TopicFilterType: "SINGLE_TAG", TopicSysFlag: tc.TopicSysFlag, Order: tc.Order,
		}
	}
	return jsonResponse(req, &w)
}

// processAllGroupConfig answers GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201) with every
// subscription group entry; the settings flowd does not keep carry Java's defaults.
func (b *Broker) processAllGroupConfig(req *protocol.Command) *protocol.Command {
	w := protocol.SubscriptionGroupWrapper{
		SubscriptionGroupTable: map[string]protocol.SubscriptionGroupConfig{},
		DataVersion:            protocol.DataVersion{Timestamp: time.Now().UnixMilli()},
	}
	b.groups.mu.RLock()
	for name, g := range b.groups.groups {
		w.SubscriptionGroupTable[name] = protocol.SubscriptionGroupConfig{
			GroupName: g.Name, ConsumeEnable: g.ConsumeEnable, ConsumeFromMinEnable: true, ConsumeBroadcastEnable: true,
			RetryQueueNums: g.RetryQueueNums, RetryMaxTimes: g.RetryMaxTimes, WhichBrokerWhenConsumeSlowly: 1,
			NotifyConsumerIdsChangedEnable: true,
		}
	}
	b.groups.mu.RUnlock()
	return jsonResponse(req, &w)
}

// processPutGroup answers UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200): the body, a
// SubscriptionGroupConfig, creates the group or replaces its settings (PutGroup).
func (b *Broker) processPutGroup(req *protocol.Command) *protocol.Command {
	var sg protocol.SubscriptionGroupConfig
	if err := protocol.UnmarshalBody(req.Body, &sg); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	g := GroupConfig{Name: sg.GroupName, ConsumeEnable: sg.ConsumeEnable, RetryQueueNums: sg.RetryQueueNums, RetryMaxTimes: sg.RetryMaxTimes}
	_, err := b.PutGroup(g)
	switch {
	case err == nil:
		return protocol.NewResponse(req, protocol.Success, "")
	case errors.Is(err, ErrReserved):
		return errorResponse(req, protocol.NoPermission, err)
	case errors.Is(err, ErrLimit): // the table is full
		return errorResponse(req, protocol.SystemError, err)
	}
	return errorResponse(req, protocol.InvalidParameter, err)
}

// put creates or replaces a group's settings; a creation counts against the table's cap as
// createIfAbsent's does. A change of an existing group is emitted as GroupUpdated under the
// table's lock. The next flushIfDirty writes the table.
func (t *groupTable) put(g GroupConfig, now time.Time, events *eventBus) (created bool, err error) {
	_, created, err = t.createIfAbsent(g, now, events)
	if err != nil || created {
		return created, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.groups[g.Name]; ok && old == g {
		return false, nil
	}
	t.groups[g.Name] = g
	t.gen++
	if events != nil {
		events.emit(Event{Type: GroupUpdated, Time: now, Group: g.Name})
	}
	return false, nil
}

// processDeleteGroup answers DELETE_SUBSCRIPTIONGROUP (207): forget the group's entry and,
// with cleanOffset, its committed offsets (DeleteGroup). SUBSCRIPTION_GROUP_NOT_EXIST for a
// group without an entry.
func (b *Broker) processDeleteGroup(req *protocol.Command) *protocol.Command {
	var h protocol.DeleteSubscriptionGroupRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	err := b.DeleteGroup(h.GroupName, h.CleanOffset)
	switch {
	case err == nil:
		return protocol.NewResponse(req, protocol.Success, "")
	case errors.Is(err, ErrReserved):
		return errorResponse(req, protocol.NoPermission, err)
	}
	return errorResponse(req, protocol.SubscriptionGroupNotExist, fmt.Errorf("subscription group [%s] does not exist", h.GroupName))
}

// processInvokeReset answers INVOKE_BROKER_TO_RESET_OFFSET (222): ResetOffsets to the
// header's timestamp, answered with the new offsets (a ResetOffsetBody). A member that could
// not be told is logged; the offsets are committed all the same and it reads them on its next
// rebalance.
func (b *Broker) processInvokeReset(ctx context.Context, req *protocol.Command) *protocol.Command {
	var h protocol.ResetOffsetRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	if _, ok := b.topics.get(h.Topic); !ok {
		return errorResponse(req, protocol.TopicNotExist, fmt.Errorf("topic[%s] not exist", h.Topic))
	}
	if _, err := b.DescribeGroup(h.Group); errors.Is(err, ErrNotFound) {
		return errorResponse(req, protocol.SubscriptionGroupNotExist, fmt.Errorf("subscription group [%s] does not exist", h.Group))
	}
	table, err := b.ResetOffsets(ctx, h.Group, h.Topic, max(h.Timestamp, 0))
	if table == nil {
		if errors.Is(err, ErrReserved) {
			return errorResponse(req, protocol.NoPermission, err)
		}
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	if err != nil {
		b.log.Warn("reset offsets: members not told", "group", h.Group, "topic", h.Topic, "err", err)
	}
	return encodedResponse(req, (&protocol.ResetOffsetBody{OffsetTable: table}).Encode)
}

// consumeTPS is the group's consumption rate: offsets committed over the last minute, per
// second, from the samples consumeRate keeps.
func (b *Broker) consumeTPS(group string) float64 {
	return b.consumeRate.rate(group, b.groupCommitted(group), time.Now())
}

// groupCommitted is the sum of a group's committed offsets.
func (b *Broker) groupCommitted(group string) int64 {
	b.offsets.mu.Lock()
	defer b.offsets.mu.Unlock()
	var n int64
	for key, queues := range b.offsets.offsets {
		if key.group != group {
			continue
		}
		for _, off := range queues {
			n += off
		}
	}
	return n
}

// consumeRates keeps, per group, samples of the sum of its committed offsets taken at each
// GET_CONSUME_STATS, from which the group's consumption rate is derived: the broker keeps no
// per-commit counters on the commit path, and admin tools poll. The zero value is ready. Its
// lock is a leaf.
type consumeRates struct {
	mu      sync.Mutex
	samples map[string][]rateSample
}

type rateSample struct {
	at  time.Time
	sum int64
}

// rateWindow is how far back consumeRates looks.
const rateWindow = time.Minute

// maxRateSamples bounds the samples kept per group.
const maxRateSamples = 64

// rate records sum for group at now and returns the rate since the oldest sample within
// rateWindow (0 for the first sample, or when offsets moved back).
func (r *consumeRates) rate(group string, sum int64, now time.Time) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.samples == nil {
		r.samples = map[string][]rateSample{}
	}
	for g, ss := range r.samples { // forget groups nobody asked about for a while
		if now.Sub(ss[len(ss)-1].at) > 10*rateWindow {
			delete(r.samples, g)
		}
	}
	ss := r.samples[group]
	i := 0
	for i < len(ss)-1 && now.Sub(ss[i+1].at) >= rateWindow {
		i++ // the base is the newest sample at least a window old, else the oldest
	}
	ss = append(ss[i:], rateSample{at: now, sum: sum})
	if len(ss) > maxRateSamples { // a tool polling very often: a coarser base is as good
		ss = ss[len(ss)-maxRateSamples:]
	}
	r.samples[group] = ss
	base := ss[0]
	dt := now.Sub(base.at).Seconds()
	if dt <= 0 || sum <= base.sum {
		return 0
	}
	return float64(sum-base.sum) / dt
}

func jsonResponse(req *protocol.Command, v any) *protocol.Command {
	body, err := json.Marshal(v)
	if err != nil {
		return errorResponse(req, protocol.SystemError, fmt.Errorf("encode %T: %w", v, err))
	}
	resp := protocol.NewResponse(req, protocol.Success, "")
	resp.Body = body
	return resp
}

func encodedResponse(req *protocol.Command, encode func() ([]byte, error)) *protocol.Command {
	body, err := encode()
	if err != nil {
		return errorResponse(req, protocol.SystemError, err)
	}
	resp := protocol.NewResponse(req, protocol.Success, "")
	resp.Body = body
	return resp
}
