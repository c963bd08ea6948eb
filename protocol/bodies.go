package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// The JSON bodies some commands carry. RocketMQ's Java side writes them with fastjson, which
// departs from JSON in two ways that matter here: maps with integer keys get bare keys
// ({0:"addr"}) and maps keyed by an object get object keys ({{"topic":…}:42}). Every decoder
// below accepts both; encoders write what both the Java and the Go clients read back.

// TopicRouteData is the body answering GET_ROUTEINFO_BY_TOPIC.
type TopicRouteData struct {
	OrderTopicConf string       `json:"orderTopicConf,omitempty"`
	QueueDatas     []QueueData  `json:"queueDatas"`
	BrokerDatas    []BrokerData `json:"brokerDatas"`
	// FilterServerTable is always written (as {} when empty): old Java clients copy it
	// without a nil check.
	FilterServerTable map[string][]string `json:"filterServerTable"`
}

// QueueData describes a topic's queues on one broker.
type QueueData struct {
	BrokerName     string `json:"brokerName"`
	ReadQueueNums  int32  `json:"readQueueNums"`
	WriteQueueNums int32  `json:"writeQueueNums"`
	Perm           int32  `json:"perm"`
	// TopicSysFlag is "topicSysFlag" on the wire. RocketMQ before 4.9.0, and the Go
	// client, spell it "topicSynFlag"; decoding accepts either.
	TopicSysFlag int32 `json:"topicSysFlag"`
}

// UnmarshalJSON accepts the old "topicSynFlag" spelling.
func (q *QueueData) UnmarshalJSON(b []byte) error {
	type plain QueueData
	var v struct {
		plain
		TopicSynFlag *int32 `json:"topicSynFlag"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*q = QueueData(v.plain)
	if v.TopicSynFlag != nil && q.TopicSysFlag == 0 {
		q.TopicSysFlag = *v.TopicSynFlag
	}
	return nil
}

// BrokerData names one broker group: its cluster, name, and the address of each member by
// broker id (MasterID for the master).
type BrokerData struct {
	Cluster     string           `json:"cluster"`
	BrokerName  string           `json:"brokerName"`
	BrokerAddrs map[int64]string `json:"brokerAddrs"`
}

// MasterID is the broker id of a broker group's master.
const MasterID = 0

// Encode writes the route as standard JSON.
//
// # Notes
//
// rocketmq-client-go does not parse brokerAddrs as JSON: it takes the object's text, drops the
// braces, splits on ',' and then on the first ':' and removes all '"'. So the encoding has no
// spaces and no HTML escaping, brokerAddrs is always an object ({} when empty; null makes that
// client slice out of range), and Encode refuses an address JSON would escape or that contains
// ','. queueDatas and brokerDatas are [] when empty: the client's decoder fails on null.
func (r *TopicRouteData) Encode() ([]byte, error) {
	out := *r
	if out.QueueDatas == nil {
		out.QueueDatas = []QueueData{}
	}
	if out.FilterServerTable == nil {
		out.FilterServerTable = map[string][]string{}
	}
	out.BrokerDatas = make([]BrokerData, len(r.BrokerDatas))
	for i, bd := range r.BrokerDatas {
		for id, addr := range bd.BrokerAddrs {
			if !plainAddress(addr) {
				return nil, fmt.Errorf("encode route: broker %q id %d: address %q must be printable ASCII without spaces, ',', '\"' or '\\'", bd.BrokerName, id, addr)
			}
		}
		if bd.BrokerAddrs == nil {
			bd.BrokerAddrs = map[int64]string{}
		}
		out.BrokerDatas[i] = bd
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // "&" must stay "&": the Go client does not unescape addresses
	if err := enc.Encode(&out); err != nil {
		return nil, fmt.Errorf("encode route: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// plainAddress reports whether addr reaches rocketmq-client-go intact through its textual
// parse of brokerAddrs: JSON must write it without escapes, and it must not contain the ','
// the client splits on.
func plainAddress(addr string) bool {
	for i := 0; i < len(addr); i++ {
		if c := addr[i]; c <= ' ' || c >= 0x7F || c == ',' || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// DecodeTopicRouteData decodes a route body, in standard JSON or in fastjson's form with bare
// integer broker ids.
func DecodeTopicRouteData(b []byte) (*TopicRouteData, error) {
	r := new(TopicRouteData)
	if err := unmarshalTolerant(b, r); err != nil {
		return nil, fmt.Errorf("decode route: %w", err)
	}
	return r, nil
}

// HeartbeatData is the body of HEART_BEAT: which producer and consumer groups a client is in,
// and what each consumer group subscribes to.
type HeartbeatData struct {
	ClientID        string         `json:"clientID"`
	ProducerDataSet []ProducerData `json:"producerDataSet"`
	ConsumerDataSet []ConsumerData `json:"consumerDataSet"`
}

// ProducerData names a producer group.
type ProducerData struct {
	GroupName string `json:"groupName"`
}

// Consume types, message models and start positions as clients name them.
const (
	ConsumeActively  = "CONSUME_ACTIVELY"  // pull and lite-pull consumers
	ConsumePassively = "CONSUME_PASSIVELY" // push consumers

	Clustering   = "CLUSTERING"
	Broadcasting = "BROADCASTING"

	ConsumeFromLastOffset  = "CONSUME_FROM_LAST_OFFSET"
	ConsumeFromFirstOffset = "CONSUME_FROM_FIRST_OFFSET"
	ConsumeFromTimestamp   = "CONSUME_FROM_TIMESTAMP"
)

// ConsumerData describes one consumer group of a client.
type ConsumerData struct {
	GroupName           string             `json:"groupName"`
	ConsumeType         string             `json:"consumeType"`
	MessageModel        string             `json:"messageModel"`
	ConsumeFromWhere    string             `json:"consumeFromWhere"`
	SubscriptionDataSet []SubscriptionData `json:"subscriptionDataSet"`
	UnitMode            bool               `json:"unitMode"`
	// Allocator is a flowd extension: the identity of the allocation strategy the member
	// runs (allocate.Identity: a built-in's name, or a Wasm allocator's name, version and
	// module digest), so that the broker can tell the group whether its members agree. It is
	// left out when empty, and RocketMQ brokers ignore it (fastjson skips unknown fields), as
	// flowd's broker takes a heartbeat without it (a RocketMQ client's) as "not reported".
	Allocator string `json:"flowdAllocator,omitempty"`
}

// Expression types of a subscription.
const (
	ExpressionTag   = "TAG"
	ExpressionSQL92 = "SQL92"
	// ExpressionWasm is flowd's: the expression names a Wasm filter plugin deployed on the
	// broker, "name" (its active version) or "name@version".
	ExpressionWasm = "WASM"
)

// SubscriptionData is one topic subscription of a consumer group.
type SubscriptionData struct {
	ClassFilterMode bool     `json:"classFilterMode"`
	Topic           string   `json:"topic"`
	SubString       string   `json:"subString"`
	TagsSet         []string `json:"tagsSet"`
	// CodeSet holds the TagsCode of each tag. Java sends numbers; the Go client sends
	// numeric strings, and computes them over UTF-8 bytes rather than UTF-16 (see TagsCode),
	// so a broker should recompute them from TagsSet.
	CodeSet        CodeSet `json:"codeSet"`
	SubVersion     int64   `json:"subVersion"`
	ExpressionType string  `json:"expressionType"`
}

// CodeSet is a set of tag codes. It decodes from numbers or numeric strings and encodes as
// numbers.
type CodeSet []int64

// UnmarshalJSON accepts [1,-2] as well as the Go client's ["1","-2"].
func (c *CodeSet) UnmarshalJSON(b []byte) error {
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	if raw == nil {
		*c = nil
		return nil
	}
	out := make(CodeSet, 0, len(raw))
	for _, r := range raw {
		s := string(r)
		if len(s) >= 2 && s[0] == '"' {
			if err := json.Unmarshal(r, &s); err != nil {
				return err
			}
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("codeSet: %s is not a tag code", truncateForError(string(r)))
		}
		out = append(out, n)
	}
	*c = out
	return nil
}

// Encode writes the heartbeat as JSON, with [] for empty sets.
func (h *HeartbeatData) Encode() ([]byte, error) {
	out := *h
	if out.ProducerDataSet == nil {
		out.ProducerDataSet = []ProducerData{}
	}
	if out.ConsumerDataSet == nil {
		out.ConsumerDataSet = []ConsumerData{}
	}
	b, err := json.Marshal(&out)
	if err != nil {
		return nil, fmt.Errorf("encode heartbeat: %w", err)
	}
	return b, nil
}

// DecodeHeartbeatData decodes a HEART_BEAT body.
func DecodeHeartbeatData(b []byte) (*HeartbeatData, error) {
	h := new(HeartbeatData)
	if err := unmarshalTolerant(b, h); err != nil {
		return nil, fmt.Errorf("decode heartbeat: %w", err)
	}
	return h, nil
}

// ConsumerListBody answers GET_CONSUMER_LIST_BY_GROUP.
type ConsumerListBody struct {
	ConsumerIDList []string `json:"consumerIdList"`
}

// LockBatchRequestBody is the body of LOCK_BATCH_MQ and UNLOCK_BATCH_MQ.
type LockBatchRequestBody struct {
	ConsumerGroup string         `json:"consumerGroup"`
	ClientID      string         `json:"clientId"`
	MQSet         []MessageQueue `json:"mqSet"`
}

// LockBatchResponseBody answers LOCK_BATCH_MQ with the queues the client now holds.
type LockBatchResponseBody struct {
	LockOKMQSet []MessageQueue `json:"lockOKMQSet"`
}

// MarshalBody encodes one of the plain JSON bodies (ConsumerListBody, LockBatchRequestBody,
// LockBatchResponseBody, …), writing [] rather than null for empty lists.
func MarshalBody(v any) ([]byte, error) {
	switch b := v.(type) {
	case *ConsumerListBody:
		if b.ConsumerIDList == nil {
			v = &ConsumerListBody{ConsumerIDList: []string{}}
		}
	case *LockBatchRequestBody:
		if b.MQSet == nil {
			c := *b
			c.MQSet = []MessageQueue{}
			v = &c
		}
	case *LockBatchResponseBody:
		if b.LockOKMQSet == nil {
			v = &LockBatchResponseBody{LockOKMQSet: []MessageQueue{}}
		}
	}
	out, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %T: %w", v, err)
	}
	return out, nil
}

// UnmarshalBody decodes a JSON body into v, accepting fastjson's non-string object keys.
func UnmarshalBody(b []byte, v any) error {
	if err := unmarshalTolerant(b, v); err != nil {
		return fmt.Errorf("decode %T: %w", v, err)
	}
	return nil
}

// ResetOffsetBody carries the new offset of each queue in RESET_CONSUMER_OFFSET.
type ResetOffsetBody struct {
	OffsetTable map[MessageQueue]int64
}

// Encode writes the table the way a Java broker's fastjson does, queues as object keys with
// their fields in alphabetical order, sorted, without spaces:
//
//	{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"t"}:42,…}}
//
// # Notes
//
// This is not JSON, and that is the point: rocketmq-client-go tells the fastjson form from
// gson's ([[queue, offset], …]) by whether the body is valid JSON, and then splits the text on
// ",{" and "}:" rather than parsing it. Topic and broker names cannot contain those sequences
// (RocketMQ allows letters, digits, '%', '|', '-' and '_'), and Encode refuses names with '{',
// '}', ',' or ':' so that the split cannot go wrong.
func (r *ResetOffsetBody) Encode() ([]byte, error) {
	queues := make([]MessageQueue, 0, len(r.OffsetTable))
	for q := range r.OffsetTable {
		if strings.ContainsAny(q.Topic, "{},:") || strings.ContainsAny(q.BrokerName, "{},:") {
			return nil, fmt.Errorf("encode reset offsets: %s: names must not contain '{', '}', ',' or ':'", q)
		}
		queues = append(queues, q)
	}
	slices.SortFunc(queues, MessageQueue.Compare)
	b := append(make([]byte, 0, 32+64*len(queues)), `{"offsetTable":{`...)
	for i, q := range queues {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendQueueJSON(b, q)
		b = append(b, ':')
		b = strconv.AppendInt(b, r.OffsetTable[q], 10)
	}
	return append(b, "}}"...), nil
}

// appendQueueJSON writes q as fastjson does: fields in alphabetical order.
func appendQueueJSON(b []byte, q MessageQueue) []byte {
	b = append(b, `{"brokerName":`...)
	b = appendJSONString(b, q.BrokerName)
	b = append(b, `,"queueId":`...)
	b = strconv.AppendInt(b, int64(q.QueueID), 10)
	b = append(b, `,"topic":`...)
	b = appendJSONString(b, q.Topic)
	return append(b, '}')
}

// DecodeResetOffsetBody reads the offset table in any of the forms clients meet: fastjson's
// object keys, gson's array of [queue, offset] pairs, or a JSON object whose keys are the
// queues' JSON text.
func DecodeResetOffsetBody(b []byte) (*ResetOffsetBody, error) {
	var raw struct {
		OffsetTable json.RawMessage `json:"offsetTable"`
	}
	if err := unmarshalTolerant(b, &raw); err != nil {
		return nil, fmt.Errorf("decode reset offsets: %w", err)
	}
	table, err := decodeQueueTable[int64](raw.OffsetTable)
	if err != nil {
		return nil, fmt.Errorf("decode reset offsets: %w", err)
	}
	return &ResetOffsetBody{OffsetTable: table}, nil
}

// decodeQueueTable reads a map keyed by MessageQueue from either a (normalized) object whose
// keys hold a queue's JSON, or gson's [[queue, value], …].
func decodeQueueTable[V any](raw json.RawMessage) (map[MessageQueue]V, error) {
	table := make(map[MessageQueue]V)
	s := strings.TrimLeft(string(raw), " \t\r\n")
	switch {
	case s == "" || s == "null":
		return table, nil
	case s[0] == '[':
		var pairs [][2]json.RawMessage
		if err := json.Unmarshal(raw, &pairs); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrMalformedJSON, err)
		}
		for i, p := range pairs {
			var q MessageQueue
			var v V
			if err := json.Unmarshal(p[0], &q); err != nil {
				return nil, fmt.Errorf("%w: entry %d: queue: %w", ErrMalformedJSON, i, err)
			}
			if err := json.Unmarshal(p[1], &v); err != nil {
				return nil, fmt.Errorf("%w: entry %d: value: %w", ErrMalformedJSON, i, err)
			}
			table[q] = v
		}
		return table, nil
	}
	var byKey map[string]V
	if err := json.Unmarshal(raw, &byKey); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformedJSON, err)
	}
	for k, v := range byKey {
		var q MessageQueue
		if err := json.Unmarshal([]byte(k), &q); err != nil {
			return nil, fmt.Errorf("%w: key %q is not a message queue: %w", ErrMalformedJSON, truncateForError(k), err)
		}
		table[q] = v
	}
	return table, nil
}

// ConsumerRunningInfo is the body a client answers GET_CONSUMER_RUNNING_INFO with. flowd reads
// and writes the parts operators look at; other fields are ignored.
type ConsumerRunningInfo struct {
	Properties      map[string]string
	SubscriptionSet []SubscriptionData
	MQTable         map[MessageQueue]ProcessQueueInfo
	StatusTable     map[string]ConsumeStatus
	JStack          string
}

// ProcessQueueInfo is a client's view of one queue it consumes.
type ProcessQueueInfo struct {
	CommitOffset         int64 `json:"commitOffset"`
	CachedMsgMinOffset   int64 `json:"cachedMsgMinOffset"`
	CachedMsgMaxOffset   int64 `json:"cachedMsgMaxOffset"`
	CachedMsgCount       int64 `json:"cachedMsgCount"`
	CachedMsgSizeInMiB   int64 `json:"cachedMsgSizeInMiB"`
	Locked               bool  `json:"locked"`
	Dropped              bool  `json:"dropped"`
	LastPullTimestamp    int64 `json:"lastPullTimestamp"`
	LastConsumeTimestamp int64 `json:"lastConsumeTimestamp"`
}

// ConsumeStatus is a client's consumption statistics for one topic.
type ConsumeStatus struct {
	PullRT            float64 `json:"pullRT"`
	PullTPS           float64 `json:"pullTPS"`
	ConsumeRT         float64 `json:"consumeRT"`
	ConsumeOKTPS      float64 `json:"consumeOKTPS"`
	ConsumeFailedTPS  float64 `json:"consumeFailedTPS"`
	ConsumeFailedMsgs int64   `json:"consumeFailedMsgs"`
}

// Encode writes the running info with mqTable in fastjson's object-key form, as Java and Go
// clients do.
func (c *ConsumerRunningInfo) Encode() ([]byte, error) {
	props, err := json.Marshal(orEmpty(c.Properties))
	if err != nil {
		return nil, fmt.Errorf("encode running info: %w", err)
	}
	subs := c.SubscriptionSet
	if subs == nil {
		subs = []SubscriptionData{}
	}
	subsJSON, err := json.Marshal(subs)
	if err != nil {
		return nil, fmt.Errorf("encode running info: %w", err)
	}
	status, err := json.Marshal(orEmpty(c.StatusTable))
	if err != nil {
		return nil, fmt.Errorf("encode running info: %w", err)
	}
	b := append([]byte(`{"properties":`), props...)
	b = append(b, `,"subscriptionSet":`...)
	b = append(b, subsJSON...)
	b = append(b, `,"mqTable":{`...)
	queues := make([]MessageQueue, 0, len(c.MQTable))
	for q := range c.MQTable {
		queues = append(queues, q)
	}
	slices.SortFunc(queues, MessageQueue.Compare)
	for i, q := range queues {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendQueueJSON(b, q)
		b = append(b, ':')
		v, err := json.Marshal(c.MQTable[q])
		if err != nil {
			return nil, fmt.Errorf("encode running info: %w", err)
		}
		b = append(b, v...)
	}
	b = append(b, `},"statusTable":`...)
	b = append(b, status...)
	b = append(b, `,"jstack":`...)
	b = appendJSONString(b, c.JStack)
	return append(b, '}'), nil
}

func orEmpty[K comparable, V any](m map[K]V) map[K]V {
	if m == nil {
		return map[K]V{}
	}
	return m
}

// DecodeConsumerRunningInfo reads a running-info body.
func DecodeConsumerRunningInfo(b []byte) (*ConsumerRunningInfo, error) {
	var raw struct {
		Properties      map[string]string        `json:"properties"`
		SubscriptionSet []SubscriptionData       `json:"subscriptionSet"`
		MQTable         json.RawMessage          `json:"mqTable"`
		StatusTable     map[string]ConsumeStatus `json:"statusTable"`
		JStack          string                   `json:"jstack"`
	}
	if err := unmarshalTolerant(b, &raw); err != nil {
		return nil, fmt.Errorf("decode running info: %w", err)
	}
	mq, err := decodeQueueTable[ProcessQueueInfo](raw.MQTable)
	if err != nil {
		return nil, fmt.Errorf("decode running info: mqTable: %w", err)
	}
	return &ConsumerRunningInfo{
		Properties:      raw.Properties,
		SubscriptionSet: raw.SubscriptionSet,
		MQTable:         mq,
		StatusTable:     raw.StatusTable,
		JStack:          raw.JStack,
	}, nil
}
