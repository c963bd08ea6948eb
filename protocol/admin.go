package protocol

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Administrative and inspection requests (RocketMQ's numbers). GetBrokerClusterInfo,
// GetAllTopicListFromNamesrv and GetTopicsByCluster are name-server requests; the others go to
// a broker.
const (
	GetAllTopicConfig                RequestCode = 21
	GetBrokerRuntimeInfo             RequestCode = 28
	GetBrokerClusterInfo             RequestCode = 106
	UpdateAndCreateSubscriptionGroup RequestCode = 200
	GetAllSubscriptionGroupConfig    RequestCode = 201
	GetTopicStatsInfo                RequestCode = 202
	GetConsumerConnectionList        RequestCode = 203
	GetAllTopicListFromNamesrv       RequestCode = 206
	DeleteSubscriptionGroup          RequestCode = 207
	GetConsumeStats                  RequestCode = 208
	InvokeBrokerToResetOffset        RequestCode = 222
	GetTopicsByCluster               RequestCode = 224
)

// ConsumerNotOnline answers GET_CONSUMER_CONNECTION_LIST for a group without live members
// (Java's CONSUMER_NOT_ONLINE).
const ConsumerNotOnline ResponseCode = 206

var (
	_ Header = (*TopicRequestHeader)(nil)
	_ Header = (*GetConsumeStatsRequestHeader)(nil)
	_ Header = (*ConsumerGroupRequestHeader)(nil)
	_ Header = (*GetTopicsByClusterRequestHeader)(nil)
	_ Header = (*DeleteSubscriptionGroupRequestHeader)(nil)
)

// TopicRequestHeader names one topic: GET_TOPIC_STATS_INFO (202).
type TopicRequestHeader struct {
	Topic string
}

func (h *TopicRequestHeader) Encode() map[string]string {
	return map[string]string{fieldTopic: h.Topic}
}

func (h *TopicRequestHeader) EncodeTo(ext map[string]string) { ext[fieldTopic] = h.Topic }

func (h *TopicRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.Topic = r.str(fieldTopic, true)
	return r.err
}

// GetConsumeStatsRequestHeader is GET_CONSUME_STATS (208). Topic is optional: without it
// the stats cover every topic the group has committed offsets of.
type GetConsumeStatsRequestHeader struct {
	ConsumerGroup string
	Topic         string
}

func (h *GetConsumeStatsRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 2)
	h.EncodeTo(m)
	return m
}

func (h *GetConsumeStatsRequestHeader) EncodeTo(ext map[string]string) {
	ext["consumerGroup"] = h.ConsumerGroup
	putStr(ext, fieldTopic, h.Topic)
}

func (h *GetConsumeStatsRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.ConsumerGroup = r.str("consumerGroup", true)
	h.Topic = r.str(fieldTopic, false)
	return r.err
}

// ConsumerGroupRequestHeader names one consumer group: GET_CONSUMER_CONNECTION_LIST (203).
type ConsumerGroupRequestHeader struct {
	ConsumerGroup string
}

func (h *ConsumerGroupRequestHeader) Encode() map[string]string {
	return map[string]string{"consumerGroup": h.ConsumerGroup}
}

func (h *ConsumerGroupRequestHeader) EncodeTo(ext map[string]string) {
	ext["consumerGroup"] = h.ConsumerGroup
}

func (h *ConsumerGroupRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.ConsumerGroup = r.str("consumerGroup", true)
	return r.err
}

// GetTopicsByClusterRequestHeader is GET_TOPICS_BY_CLUSTER (224).
type GetTopicsByClusterRequestHeader struct {
	Cluster string
}

func (h *GetTopicsByClusterRequestHeader) Encode() map[string]string {
	return map[string]string{"cluster": h.Cluster}
}

func (h *GetTopicsByClusterRequestHeader) EncodeTo(ext map[string]string) {
	ext["cluster"] = h.Cluster
}

func (h *GetTopicsByClusterRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.Cluster = r.str("cluster", true)
	return r.err
}

// DeleteSubscriptionGroupRequestHeader is DELETE_SUBSCRIPTIONGROUP (207). CleanOffset
// (optional, RocketMQ 4.9.4+) also removes the group's committed offsets.
type DeleteSubscriptionGroupRequestHeader struct {
	GroupName   string
	CleanOffset bool
}

func (h *DeleteSubscriptionGroupRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 2)
	h.EncodeTo(m)
	return m
}

func (h *DeleteSubscriptionGroupRequestHeader) EncodeTo(ext map[string]string) {
	ext["groupName"] = h.GroupName
	if h.CleanOffset {
		putBool(ext, "cleanOffset", true)
	}
}

func (h *DeleteSubscriptionGroupRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.GroupName = r.str("groupName", true)
	h.CleanOffset = r.bool("cleanOffset", false)
	return r.err
}

// TopicList is the body of GET_ALL_TOPIC_LIST_FROM_NAMESERVER and GET_TOPICS_BY_CLUSTER.
type TopicList struct {
	TopicList  []string `json:"topicList"`
	BrokerAddr string   `json:"brokerAddr,omitempty"`
}

// ClusterInfo is the body of GET_BROKER_CLUSTER_INFO: every broker group by name, and the
// broker group names of every cluster.
type ClusterInfo struct {
	BrokerAddrTable  map[string]BrokerData `json:"brokerAddrTable"`
	ClusterAddrTable map[string][]string   `json:"clusterAddrTable"`
}

// DecodeClusterInfo decodes a GET_BROKER_CLUSTER_INFO body, as a Java name server writes it
// too (fastjson's unquoted broker ids).
func DecodeClusterInfo(b []byte) (*ClusterInfo, error) {
	ci := new(ClusterInfo)
	if err := unmarshalTolerant(b, ci); err != nil {
		return nil, fmt.Errorf("decode cluster info: %w", err)
	}
	return ci, nil
}

// DataVersion is the version stamp Java brokers attach to their config tables.
type DataVersion struct {
	Timestamp int64 `json:"timestamp"`
	Counter   int64 `json:"counter"`
}

// TopicConfigBody is one topic as Java's TopicConfig is written.
type TopicConfigBody struct {
	TopicName       string `json:"topicName"`
	ReadQueueNums   int    `json:"readQueueNums"`
	WriteQueueNums  int    `json:"writeQueueNums"`
	Perm            int    `json:"perm"`
	TopicFilterType string `json:"topicFilterType"`
	TopicSysFlag    int    `json:"topicSysFlag"`
	Order           bool   `json:"order"`
}

// TopicConfigWrapper is the body of GET_ALL_TOPIC_CONFIG.
type TopicConfigWrapper struct {
	TopicConfigTable map[string]TopicConfigBody `json:"topicConfigTable"`
	DataVersion      DataVersion                `json:"dataVersion"`
}

// SubscriptionGroupConfig is one consumer group's settings as Java's SubscriptionGroupConfig
// is written: the body of UPDATE_AND_CREATE_SUBSCRIPTIONGROUP and an entry of
// SubscriptionGroupWrapper.
type SubscriptionGroupConfig struct {
	GroupName                      string `json:"groupName"`
	ConsumeEnable                  bool   `json:"consumeEnable"`
	ConsumeFromMinEnable           bool   `json:"consumeFromMinEnable"`
	ConsumeBroadcastEnable         bool   `json:"consumeBroadcastEnable"`
	RetryQueueNums                 int    `json:"retryQueueNums"`
	RetryMaxTimes                  int    `json:"retryMaxTimes"`
	BrokerID                       int64  `json:"brokerId"`
	WhichBrokerWhenConsumeSlowly   int64  `json:"whichBrokerWhenConsumeSlowly"`
	NotifyConsumerIdsChangedEnable bool   `json:"notifyConsumerIdsChangedEnable"`
}

// SubscriptionGroupWrapper is the body of GET_ALL_SUBSCRIPTIONGROUP_CONFIG.
type SubscriptionGroupWrapper struct {
	SubscriptionGroupTable map[string]SubscriptionGroupConfig `json:"subscriptionGroupTable"`
	DataVersion            DataVersion                        `json:"dataVersion"`
}

// KVTable is the body of GET_BROKER_RUNTIME_INFO: named counters, all as strings.
type KVTable struct {
	Table map[string]string `json:"table"`
}

// ConnectionInfo is one live client connection of a consumer group.
type ConnectionInfo struct {
	ClientID   string `json:"clientId"`
	ClientAddr string `json:"clientAddr"`
	Language   string `json:"language"`
	Version    int    `json:"version"`
}

// ConsumerConnection is the body of GET_CONSUMER_CONNECTION_LIST.
type ConsumerConnection struct {
	ConnectionSet     []ConnectionInfo            `json:"connectionSet"`
	SubscriptionTable map[string]SubscriptionData `json:"subscriptionTable"`
	ConsumeType       string                      `json:"consumeType"`
	MessageModel      string                      `json:"messageModel"`
	ConsumeFromWhere  string                      `json:"consumeFromWhere"`
}

// TopicOffset is one queue of GET_TOPIC_STATS_INFO: its stored range (max exclusive) and
// when its last message was stored (Unix milliseconds; 0 when empty).
type TopicOffset struct {
	MinOffset           int64 `json:"minOffset"`
	MaxOffset           int64 `json:"maxOffset"`
	LastUpdateTimestamp int64 `json:"lastUpdateTimestamp"`
}

// TopicStatsTable is the body of GET_TOPIC_STATS_INFO.
type TopicStatsTable struct {
	OffsetTable map[MessageQueue]TopicOffset
}

// OffsetWrapper is one queue of GET_CONSUME_STATS: the queue's max offset, the group's
// committed offset, and when the message at the committed offset was stored (0 when there is
// none: the group is caught up).
type OffsetWrapper struct {
	BrokerOffset   int64 `json:"brokerOffset"`
	ConsumerOffset int64 `json:"consumerOffset"`
	LastTimestamp  int64 `json:"lastTimestamp"`
}

// ConsumeStats is the body of GET_CONSUME_STATS.
type ConsumeStats struct {
	OffsetTable map[MessageQueue]OffsetWrapper
	ConsumeTPS  float64
}

// Lag is the sum over the queues of broker offset minus consumer offset.
func (s *ConsumeStats) Lag() int64 {
	var n int64
	for _, o := range s.OffsetTable {
		n += max(o.BrokerOffset-o.ConsumerOffset, 0)
	}
	return n
}

// Encode writes the table as a Java broker's fastjson does, queues as object keys (see
// ResetOffsetBody.Encode).
func (t *TopicStatsTable) Encode() ([]byte, error) {
	b, err := appendQueueTable(append([]byte(nil), `{"offsetTable":`...), t.OffsetTable)
	if err != nil {
		return nil, fmt.Errorf("encode topic stats: %w", err)
	}
	return append(b, '}'), nil
}

// DecodeTopicStatsTable reads a GET_TOPIC_STATS_INFO body in fastjson's or gson's form.
func DecodeTopicStatsTable(b []byte) (*TopicStatsTable, error) {
	var raw struct {
		OffsetTable json.RawMessage `json:"offsetTable"`
	}
	if err := unmarshalTolerant(b, &raw); err != nil {
		return nil, fmt.Errorf("decode topic stats: %w", err)
	}
	table, err := decodeQueueTable[TopicOffset](raw.OffsetTable)
	if err != nil {
		return nil, fmt.Errorf("decode topic stats: %w", err)
	}
	return &TopicStatsTable{OffsetTable: table}, nil
}

// Encode writes the stats as a Java broker's fastjson does, queues as object keys.
func (s *ConsumeStats) Encode() ([]byte, error) {
	b := append([]byte(nil), `{"consumeTps":`...)
	b = strconv.AppendFloat(b, s.ConsumeTPS, 'f', -1, 64)
	b = append(b, `,"offsetTable":`...)
	b, err := appendQueueTable(b, s.OffsetTable)
	if err != nil {
		return nil, fmt.Errorf("encode consume stats: %w", err)
	}
	return append(b, '}'), nil
}

// DecodeConsumeStats reads a GET_CONSUME_STATS body in fastjson's or gson's form.
func DecodeConsumeStats(b []byte) (*ConsumeStats, error) {
	var raw struct {
		OffsetTable json.RawMessage `json:"offsetTable"`
		ConsumeTPS  float64         `json:"consumeTps"`
	}
	if err := unmarshalTolerant(b, &raw); err != nil {
		return nil, fmt.Errorf("decode consume stats: %w", err)
	}
	table, err := decodeQueueTable[OffsetWrapper](raw.OffsetTable)
	if err != nil {
		return nil, fmt.Errorf("decode consume stats: %w", err)
	}
	return &ConsumeStats{OffsetTable: table, ConsumeTPS: raw.ConsumeTPS}, nil
}

// appendQueueTable writes {queue:value,…} with the queues sorted and written as fastjson
// writes them; names that could break a reader splitting the text are refused.
func appendQueueTable[V any](b []byte, table map[MessageQueue]V) ([]byte, error) {
	b = append(b, '{')
	for i, q := range slices.SortedFunc(maps.Keys(table), MessageQueue.Compare) {
		if strings.ContainsAny(q.Topic, "{},:") || strings.ContainsAny(q.BrokerName, "{},:") {
			return nil, fmt.Errorf("%s: names must not contain '{', '}', ',' or ':'", q)
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = appendQueueJSON(b, q)
		b = append(b, ':')
		v, err := json.Marshal(table[q])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", q, err)
		}
		b = append(b, v...)
	}
	return append(b, '}'), nil
}
