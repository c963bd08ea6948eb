package protocol

import "fmt"

// This file holds one type per request or response header of RocketMQ's remoting protocol. Field names on the wire
// are RocketMQ's (checked against the Java broker's header classes and rocketmq-client-go's
// internal/request.go). Required fields are those the Java broker marks @CFNotNull; a decoder
// reports them missing with ErrMissingField. Optional fields take the default documented on the
// struct field when absent.
//
// Several RocketMQ 5 headers carry "bname" (the broker name, used by proxies). The Go client
// sends it on most requests; it is kept here as BrokerName and is always optional.

var (
	_ Header = (*GetRouteInfoRequestHeader)(nil)
	_ Header = (*SendMessageRequestHeader)(nil)
	_ Header = (*SendMessageResponseHeader)(nil)
	_ Header = (*PullMessageRequestHeader)(nil)
	_ Header = (*PullMessageResponseHeader)(nil)
	_ Header = (*QueryConsumerOffsetRequestHeader)(nil)
	_ Header = (*OffsetResponseHeader)(nil)
	_ Header = (*UpdateConsumerOffsetRequestHeader)(nil)
	_ Header = (*GetMaxOffsetRequestHeader)(nil)
	_ Header = (*GetMinOffsetRequestHeader)(nil)
	_ Header = (*SearchOffsetRequestHeader)(nil)
	_ Header = (*UnregisterClientRequestHeader)(nil)
	_ Header = (*ConsumerSendMsgBackRequestHeader)(nil)
	_ Header = (*GetConsumerListByGroupRequestHeader)(nil)
	_ Header = (*NotifyConsumerIDsChangedRequestHeader)(nil)
	_ Header = (*CreateTopicRequestHeader)(nil)
	_ Header = (*ViewMessageRequestHeader)(nil)
	_ Header = (*DeleteTopicRequestHeader)(nil)
	_ Header = (*ResetOffsetRequestHeader)(nil)
	_ Header = (*GetConsumerRunningInfoRequestHeader)(nil)
)

// Header field names shared by several headers.
const (
	fieldTopic         = "topic"
	fieldQueueID       = "queueId"
	fieldConsumerGroup = "consumerGroup"
	fieldBrokerName    = "bname"
	fieldOffset        = "offset"
)

// GetRouteInfoRequestHeader is GET_ROUTEINFO_BY_TOPIC (105).
type GetRouteInfoRequestHeader struct {
	Topic string
	// AcceptStandardJSONOnly asks a RocketMQ 5 name server for standard JSON instead of
	// fastjson's unquoted integer keys. flowd always answers standard JSON.
	AcceptStandardJSONOnly bool
}

func (h *GetRouteInfoRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 2)
	h.EncodeTo(m)
	return m
}

func (h *GetRouteInfoRequestHeader) EncodeTo(ext map[string]string) {
	ext[fieldTopic] = h.Topic
	if h.AcceptStandardJSONOnly {
		putBool(ext, "acceptStandardJsonOnly", true)
	}
}

func (h *GetRouteInfoRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.Topic = r.str(fieldTopic, true)
	h.AcceptStandardJSONOnly = r.bool("acceptStandardJsonOnly", false)
	return r.err
}

// SendMessageRequestHeader is the header of SEND_MESSAGE (10), and, under the one-letter
// names a…n, of SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320). Encode/EncodeTo/Decode use
// the long names; EncodeV2/EncodeV2To/DecodeV2 the short ones; DecodeSendHeader picks by code.
type SendMessageRequestHeader struct {
	ProducerGroup         string // a
	Topic                 string // b
	DefaultTopic          string // c; usually AutoCreateTopicKey
	DefaultTopicQueueNums int32  // d; usually 4
	QueueID               int32  // e
	SysFlag               int32  // f; MsgFlag* bits
	BornTimestamp         int64  // g; Unix milliseconds
	Flag                  int32  // h
	Properties            string // i; key\x01value\x02 pairs (optional)
	ReconsumeTimes        int32  // j (optional, default 0)
	UnitMode              bool   // k (optional)
	// MaxReconsumeTimes (l) matters only for messages sent to a retry topic. Absent decodes
	// as -1, meaning "the consumer group's setting applies"; a negative value is not encoded.
	MaxReconsumeTimes int32
	Batch             bool   // m (optional)
	BrokerName        string // n, or "bname" in the long form (optional)
}

// Long and short (V2) field names of the send header, in a…n order.
var (
	sendLongNames  = [...]string{"producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag", "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes", "batch", "bname"}
	sendShortNames = [...]string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n"}
)

func (h *SendMessageRequestHeader) Encode() map[string]string {
	m := make(map[string]string, len(sendLongNames))
	h.EncodeTo(m)
	return m
}

// EncodeV2 encodes the header with the one-letter names of SEND_MESSAGE_V2 and
// SEND_BATCH_MESSAGE: about 150 bytes less per send than the long form.
func (h *SendMessageRequestHeader) EncodeV2() map[string]string {
	m := make(map[string]string, len(sendShortNames))
	h.EncodeV2To(m)
	return m
}

func (h *SendMessageRequestHeader) EncodeTo(ext map[string]string) { h.encode(ext, &sendLongNames) }

func (h *SendMessageRequestHeader) EncodeV2To(ext map[string]string) {
	h.encode(ext, &sendShortNames)
}

func (h *SendMessageRequestHeader) encode(ext map[string]string, n *[14]string) {
	ext[n[0]] = h.ProducerGroup
	ext[n[1]] = h.Topic
	ext[n[2]] = h.DefaultTopic
	putInt(ext, n[3], int64(h.DefaultTopicQueueNums))
	putInt(ext, n[4], int64(h.QueueID))
	putInt(ext, n[5], int64(h.SysFlag))
	putInt(ext, n[6], h.BornTimestamp)
	putInt(ext, n[7], int64(h.Flag))
	putStr(ext, n[8], h.Properties)
	putInt(ext, n[9], int64(h.ReconsumeTimes))
	putBool(ext, n[10], h.UnitMode)
	if h.MaxReconsumeTimes >= 0 {
		putInt(ext, n[11], int64(h.MaxReconsumeTimes))
	}
	putBool(ext, n[12], h.Batch)
	putStr(ext, n[13], h.BrokerName)
}

// Decode reads the long-named form of SEND_MESSAGE (10).
func (h *SendMessageRequestHeader) Decode(ext map[string]string) error {
	return h.decode(ext, &sendLongNames)
}

// DecodeV2 reads the one-letter form of SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320).
func (h *SendMessageRequestHeader) DecodeV2(ext map[string]string) error {
	return h.decode(ext, &sendShortNames)
}

func (h *SendMessageRequestHeader) decode(ext map[string]string, n *[14]string) error {
	r := fieldReader{ext: ext}
	h.read(&r, n)
	return r.err
}

// read decodes the fields named n from r; the first error is in r's err (or errp).
func (h *SendMessageRequestHeader) read(r *fieldReader, n *[14]string) {
	h.ProducerGroup = r.str(n[0], true)
	h.Topic = r.str(n[1], true)
	h.DefaultTopic = r.str(n[2], true)
	h.DefaultTopicQueueNums = r.i32(n[3], true)
	h.QueueID = r.i32(n[4], true)
	h.SysFlag = r.i32(n[5], true)
	h.BornTimestamp = r.i64(n[6], true)
	h.Flag = r.i32(n[7], true)
	h.Properties = r.str(n[8], false)
	h.ReconsumeTimes = r.i32(n[9], false)
	h.UnitMode = r.bool(n[10], false)
	h.MaxReconsumeTimes = r.i32Or(n[11], -1)
	h.Batch = r.bool(n[12], false)
	h.BrokerName = r.str(n[13], false)
}

// DecodeSendHeader decodes the send header of cmd in the form its code implies: long names
// for SEND_MESSAGE, one-letter names for SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE. Batch is set
// for SEND_BATCH_MESSAGE even if the sender left "m" out.
func DecodeSendHeader(cmd *Command) (*SendMessageRequestHeader, error) {
	h := new(SendMessageRequestHeader)
	// The fields' buffers stay on the stack: the error comes back in err, not in r.
	var err error
	var buf [len(sendShortNames) + 2]rawField
	switch code := cmd.RequestCode(); code {
	case SendMessage:
		r := readerOf(cmd, buf[:0])
		r.errp = &err
		h.read(&r, &sendLongNames)
	case SendMessageV2, SendBatchMessage:
		var letters [26]string
		r := fieldReader{ext: cmd.ExtFields}
		if cmd.ExtFields == nil && cmd.RawExt != "" {
			if has, ok := readLetters(cmd.RawExt, &letters); ok {
				r = fieldReader{letters: &letters, has: has}
			} else {
				r = readerOf(cmd, buf[:0])
			}
		}
		r.errp = &err
		h.read(&r, &sendShortNames)
		if code == SendBatchMessage {
			h.Batch = true
		}
	default:
		return nil, fmt.Errorf("decode send header: %s is not a send request", code)
	}
	if err != nil {
		return nil, fmt.Errorf("decode %s header: %w", cmd.RequestCode(), err)
	}
	return h, nil
}

// SendMessageResponseHeader answers the three send requests.
type SendMessageResponseHeader struct {
	// MsgID is the stored message's offsetMsgId (OffsetMsgID); for a batch, the ids of all
	// its messages joined with commas.
	MsgID         string
	QueueID       int32
	QueueOffset   int64
	TransactionID string // optional
	// MsgRegion ("MSG_REGION") and TraceOn ("TRACE_ON") are informational fields Java
	// brokers add; the Go client copies them into its SendResult. Optional.
	MsgRegion string
	TraceOn   bool
}

func (h *SendMessageResponseHeader) Encode() map[string]string {
	m := make(map[string]string, 6)
	h.EncodeTo(m)
	return m
}

func (h *SendMessageResponseHeader) EncodeTo(ext map[string]string) {
	ext["msgId"] = h.MsgID
	putInt(ext, fieldQueueID, int64(h.QueueID))
	putInt(ext, "queueOffset", h.QueueOffset)
	putStr(ext, "transactionId", h.TransactionID)
	putStr(ext, "MSG_REGION", h.MsgRegion)
	if h.TraceOn {
		putBool(ext, "TRACE_ON", true)
	}
}

// AppendFields writes the fields EncodeTo would, straight into a frame (Command.Fields).
func (h *SendMessageResponseHeader) AppendFields(w FieldWriter) FieldWriter {
	w.String("msgId", h.MsgID)
	w.Int(fieldQueueID, int64(h.QueueID))
	w.Int("queueOffset", h.QueueOffset)
	w.OptString("transactionId", h.TransactionID)
	w.OptString("MSG_REGION", h.MsgRegion)
	if h.TraceOn {
		w.Bool("TRACE_ON", true)
	}
	return w
}

func (h *SendMessageResponseHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.read(&r)
	return r.err
}

func (h *SendMessageResponseHeader) read(r *fieldReader) {
	h.MsgID = r.str("msgId", true)
	h.QueueID = r.i32(fieldQueueID, true)
	h.QueueOffset = r.i64("queueOffset", true)
	h.TransactionID = r.str("transactionId", false)
	h.MsgRegion = r.str("MSG_REGION", false)
	h.TraceOn = r.bool("TRACE_ON", false)
}

// DecodeSendResponse decodes the header of a send's answer into h, from its ExtFields or,
// when the map was not built (ReadOptions.RawResponses), from its RawExt: a producer reads
// one answer per message, and the map was most of the cost of reading it.
func DecodeSendResponse(cmd *Command, h *SendMessageResponseHeader) error {
	// The fields' buffer stays on the stack: the error comes back in err, not in r.
	var err error
	var buf [8]rawField
	r := readerOf(cmd, buf[:0])
	r.errp = &err
	h.read(&r)
	if err != nil {
		return fmt.Errorf("decode %s header: %w", cmd.ResponseCode(), err)
	}
	return nil
}

// PullMessageRequestHeader is PULL_MESSAGE (11).
type PullMessageRequestHeader struct {
	ConsumerGroup        string
	Topic                string
	QueueID              int32
	QueueOffset          int64
	MaxMsgNums           int32
	SysFlag              int32 // PullFlag* bits
	CommitOffset         int64
	SuspendTimeoutMillis int64
	Subscription         string // optional: the filter expression
	SubVersion           int64
	ExpressionType       string // optional: "TAG" (default) or "SQL92"
	MaxMsgBytes          int32  // optional: 0 (absent) means no client-side byte limit
	BrokerName           string // optional ("bname")
}

func (h *PullMessageRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 13)
	h.EncodeTo(m)
	return m
}

func (h *PullMessageRequestHeader) EncodeTo(ext map[string]string) {
	ext[fieldConsumerGroup] = h.ConsumerGroup
	ext[fieldTopic] = h.Topic
	putInt(ext, fieldQueueID, int64(h.QueueID))
	putInt(ext, "queueOffset", h.QueueOffset)
	putInt(ext, "maxMsgNums", int64(h.MaxMsgNums))
	putInt(ext, "sysFlag", int64(h.SysFlag))
	putInt(ext, "commitOffset", h.CommitOffset)
	putInt(ext, "suspendTimeoutMillis", h.SuspendTimeoutMillis)
	putStr(ext, "subscription", h.Subscription)
	putInt(ext, "subVersion", h.SubVersion)
	putStr(ext, "expressionType", h.ExpressionType)
	if h.MaxMsgBytes > 0 {
		putInt(ext, "maxMsgBytes", int64(h.MaxMsgBytes))
	}
	putStr(ext, fieldBrokerName, h.BrokerName)
}

func (h *PullMessageRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.ConsumerGroup = r.str(fieldConsumerGroup, true)
	h.Topic = r.str(fieldTopic, true)
	h.QueueID = r.i32(fieldQueueID, true)
	h.QueueOffset = r.i64("queueOffset", true)
	h.MaxMsgNums = r.i32("maxMsgNums", true)
	h.SysFlag = r.i32("sysFlag", true)
	h.CommitOffset = r.i64("commitOffset", true)
	h.SuspendTimeoutMillis = r.i64("suspendTimeoutMillis", true)
	h.Subscription = r.str("subscription", false)
	h.SubVersion = r.i64("subVersion", true)
	h.ExpressionType = r.str("expressionType", false)
	h.MaxMsgBytes = r.i32("maxMsgBytes", false)
	h.BrokerName = r.str(fieldBrokerName, false)
	return r.err
}

// PullMessageResponseHeader answers PULL_MESSAGE; the remark carries the status name and the
// body the stored messages.
type PullMessageResponseHeader struct {
	SuggestWhichBrokerID int64
	NextBeginOffset      int64
	MinOffset            int64
	MaxOffset            int64
}

func (h *PullMessageResponseHeader) Encode() map[string]string {
	m := make(map[string]string, 4)
	h.EncodeTo(m)
	return m
}

func (h *PullMessageResponseHeader) EncodeTo(ext map[string]string) {
	putInt(ext, "suggestWhichBrokerId", h.SuggestWhichBrokerID)
	putInt(ext, "nextBeginOffset", h.NextBeginOffset)
	putInt(ext, "minOffset", h.MinOffset)
	putInt(ext, "maxOffset", h.MaxOffset)
}

func (h *PullMessageResponseHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.SuggestWhichBrokerID = r.i64("suggestWhichBrokerId", true)
	h.NextBeginOffset = r.i64("nextBeginOffset", true)
	h.MinOffset = r.i64("minOffset", true)
	h.MaxOffset = r.i64("maxOffset", true)
	return r.err
}

// QueryConsumerOffsetRequestHeader is QUERY_CONSUMER_OFFSET (14).
type QueryConsumerOffsetRequestHeader struct {
	ConsumerGroup string
	Topic         string
	QueueID       int32
	// SetZeroIfNotFound is optional, and its absence is not false: a RocketMQ 5 broker
	// answers 0 for an unknown offset unless the field is present and "false". nil encodes
	// nothing.
	SetZeroIfNotFound *bool
	BrokerName        string // optional ("bname")
}

func (h *QueryConsumerOffsetRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 5)
	h.EncodeTo(m)
	return m
}

func (h *QueryConsumerOffsetRequestHeader) EncodeTo(ext map[string]string) {
	ext[fieldConsumerGroup] = h.ConsumerGroup
	ext[fieldTopic] = h.Topic
	putInt(ext, fieldQueueID, int64(h.QueueID))
	if h.SetZeroIfNotFound != nil {
		putBool(ext, "setZeroIfNotFound", *h.SetZeroIfNotFound)
	}
	putStr(ext, fieldBrokerName, h.BrokerName)
}

func (h *QueryConsumerOffsetRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.ConsumerGroup = r.str(fieldConsumerGroup, true)
	h.Topic = r.str(fieldTopic, true)
	h.QueueID = r.i32(fieldQueueID, true)
	h.SetZeroIfNotFound = nil
	if v, ok := r.optBool("setZeroIfNotFound", false); ok {
		h.SetZeroIfNotFound = &v
	}
	h.BrokerName = r.str(fieldBrokerName, false)
	return r.err
}

// OffsetResponseHeader carries the single "offset" field that answers QUERY_CONSUMER_OFFSET,
// GET_MAX_OFFSET, GET_MIN_OFFSET and SEARCH_OFFSET_BY_TIMESTAMP.
type OffsetResponseHeader struct {
	Offset int64
}

// The response headers of the offset queries: all the same single field.
type (
	QueryConsumerOffsetResponseHeader = OffsetResponseHeader
	GetMaxOffsetResponseHeader        = OffsetResponseHeader
	GetMinOffsetResponseHeader        = OffsetResponseHeader
	SearchOffsetResponseHeader        = OffsetResponseHeader
)

func (h *OffsetResponseHeader) Encode() map[string]string {
	m := make(map[string]string, 1)
	h.EncodeTo(m)
	return m
}

func (h *OffsetResponseHeader) EncodeTo(ext map[string]string) { putInt(ext, fieldOffset, h.Offset) }

func (h *OffsetResponseHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.Offset = r.i64(fieldOffset, true)
	return r.err
}

// UpdateConsumerOffsetRequestHeader is UPDATE_CONSUMER_OFFSET (15).
type UpdateConsumerOffsetRequestHeader struct {
	ConsumerGroup string
	Topic         string
	QueueID       int32
	CommitOffset  int64
	BrokerName    string // optional ("bname")
}

func (h *UpdateConsumerOffsetRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 5)
	h.EncodeTo(m)
	return m
}

func (h *UpdateConsumerOffsetRequestHeader) EncodeTo(ext map[string]string) {
	ext[fieldConsumerGroup] = h.ConsumerGroup
	ext[fieldTopic] = h.Topic
	putInt(ext, fieldQueueID, int64(h.QueueID))
	putInt(ext, "commitOffset", h.CommitOffset)
	putStr(ext, fieldBrokerName, h.BrokerName)
}

func (h *UpdateConsumerOffsetRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.ConsumerGroup = r.str(fieldConsumerGroup, true)
	h.Topic = r.str(fieldTopic, true)
	h.QueueID = r.i32(fieldQueueID, true)
	h.CommitOffset = r.i64("commitOffset", true)
	h.BrokerName = r.str(fieldBrokerName, false)
	return r.err
}

// GetMaxOffsetRequestHeader is GET_MAX_OFFSET (30).
type GetMaxOffsetRequestHeader struct {
	Topic      string
	QueueID    int32
	BrokerName string // optional ("bname")
}

func (h *GetMaxOffsetRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 3)
	h.EncodeTo(m)
	return m
}

func (h *GetMaxOffsetRequestHeader) EncodeTo(ext map[string]string) {
	encodeTopicQueue(ext, h.Topic, h.QueueID, h.BrokerName)
}

func (h *GetMaxOffsetRequestHeader) Decode(ext map[string]string) error {
	return decodeTopicQueue(ext, &h.Topic, &h.QueueID, &h.BrokerName)
}

// GetMinOffsetRequestHeader is GET_MIN_OFFSET (31).
type GetMinOffsetRequestHeader struct {
	Topic      string
	QueueID    int32
	BrokerName string // optional ("bname")
}

func (h *GetMinOffsetRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 3)
	h.EncodeTo(m)
	return m
}

func (h *GetMinOffsetRequestHeader) EncodeTo(ext map[string]string) {
	encodeTopicQueue(ext, h.Topic, h.QueueID, h.BrokerName)
}

func (h *GetMinOffsetRequestHeader) Decode(ext map[string]string) error {
	return decodeTopicQueue(ext, &h.Topic, &h.QueueID, &h.BrokerName)
}

func encodeTopicQueue(ext map[string]string, topic string, queueID int32, brokerName string) {
	ext[fieldTopic] = topic
	putInt(ext, fieldQueueID, int64(queueID))
	putStr(ext, fieldBrokerName, brokerName)
}

func decodeTopicQueue(ext map[string]string, topic *string, queueID *int32, brokerName *string) error {
	r := fieldReader{ext: ext}
	*topic = r.str(fieldTopic, true)
	*queueID = r.i32(fieldQueueID, true)
	*brokerName = r.str(fieldBrokerName, false)
	return r.err
}

// SearchOffsetRequestHeader is SEARCH_OFFSET_BY_TIMESTAMP (29).
type SearchOffsetRequestHeader struct {
	Topic     string
	QueueID   int32
	Timestamp int64 // Unix milliseconds
	// BoundaryType is RocketMQ 5's choice between the first ("LOWER", the default) and the
	// last ("UPPER") message stored at Timestamp. Optional.
	BoundaryType string
	BrokerName   string // optional ("bname")
}

func (h *SearchOffsetRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 5)
	h.EncodeTo(m)
	return m
}

func (h *SearchOffsetRequestHeader) EncodeTo(ext map[string]string) {
	ext[fieldTopic] = h.Topic
	putInt(ext, fieldQueueID, int64(h.QueueID))
	putInt(ext, "timestamp", h.Timestamp)
	putStr(ext, "boundaryType", h.BoundaryType)
	putStr(ext, fieldBrokerName, h.BrokerName)
}

func (h *SearchOffsetRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.Topic = r.str(fieldTopic, true)
	h.QueueID = r.i32(fieldQueueID, true)
	h.Timestamp = r.i64("timestamp", true)
	h.BoundaryType = r.str("boundaryType", false)
	h.BrokerName = r.str(fieldBrokerName, false)
	return r.err
}

// UnregisterClientRequestHeader is UNREGISTER_CLIENT (35). Note the capital D of "clientID",
// unlike "clientId" elsewhere.
type UnregisterClientRequestHeader struct {
	ClientID      string
	ProducerGroup string // optional
	ConsumerGroup string // optional
}

func (h *UnregisterClientRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 3)
	h.EncodeTo(m)
	return m
}

func (h *UnregisterClientRequestHeader) EncodeTo(ext map[string]string) {
	ext["clientID"] = h.ClientID
	putStr(ext, "producerGroup", h.ProducerGroup)
	putStr(ext, fieldConsumerGroup, h.ConsumerGroup)
}

func (h *UnregisterClientRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.ClientID = r.str("clientID", true)
	h.ProducerGroup = r.str("producerGroup", false)
	h.ConsumerGroup = r.str(fieldConsumerGroup, false)
	return r.err
}

// ConsumerSendMsgBackRequestHeader is CONSUMER_SEND_MSG_BACK (36): a consumer hands a message
// it failed to process back to the broker for a later retry.
type ConsumerSendMsgBackRequestHeader struct {
	Offset      int64 // the message's commit-log offset
	Group       string
	DelayLevel  int32
	OriginMsgID string // optional
	OriginTopic string // optional
	UnitMode    bool   // optional
	// MaxReconsumeTimes is optional; absent decodes as -1 ("the group's setting applies")
	// and a negative value is not encoded.
	MaxReconsumeTimes int32
	BrokerName        string // optional ("bname")
}

func (h *ConsumerSendMsgBackRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 8)
	h.EncodeTo(m)
	return m
}

func (h *ConsumerSendMsgBackRequestHeader) EncodeTo(ext map[string]string) {
	putInt(ext, fieldOffset, h.Offset)
	ext["group"] = h.Group
	putInt(ext, "delayLevel", int64(h.DelayLevel))
	putStr(ext, "originMsgId", h.OriginMsgID)
	putStr(ext, "originTopic", h.OriginTopic)
	putBool(ext, "unitMode", h.UnitMode)
	if h.MaxReconsumeTimes >= 0 {
		putInt(ext, "maxReconsumeTimes", int64(h.MaxReconsumeTimes))
	}
	putStr(ext, fieldBrokerName, h.BrokerName)
}

func (h *ConsumerSendMsgBackRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.Offset = r.i64(fieldOffset, true)
	h.Group = r.str("group", true)
	h.DelayLevel = r.i32("delayLevel", true)
	h.OriginMsgID = r.str("originMsgId", false)
	h.OriginTopic = r.str("originTopic", false)
	h.UnitMode = r.bool("unitMode", false)
	h.MaxReconsumeTimes = r.i32Or("maxReconsumeTimes", -1)
	h.BrokerName = r.str(fieldBrokerName, false)
	return r.err
}

// GetConsumerListByGroupRequestHeader is GET_CONSUMER_LIST_BY_GROUP (38); the answer is a
// ConsumerListBody.
type GetConsumerListByGroupRequestHeader struct {
	ConsumerGroup string
}

func (h *GetConsumerListByGroupRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 1)
	h.EncodeTo(m)
	return m
}

func (h *GetConsumerListByGroupRequestHeader) EncodeTo(ext map[string]string) {
	ext[fieldConsumerGroup] = h.ConsumerGroup
}

func (h *GetConsumerListByGroupRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.ConsumerGroup = r.str(fieldConsumerGroup, true)
	return r.err
}

// NotifyConsumerIDsChangedRequestHeader is NOTIFY_CONSUMER_IDS_CHANGED (40), a oneway request
// from broker to client.
type NotifyConsumerIDsChangedRequestHeader struct {
	ConsumerGroup string
}

func (h *NotifyConsumerIDsChangedRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 1)
	h.EncodeTo(m)
	return m
}

func (h *NotifyConsumerIDsChangedRequestHeader) EncodeTo(ext map[string]string) {
	ext[fieldConsumerGroup] = h.ConsumerGroup
}

func (h *NotifyConsumerIDsChangedRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.ConsumerGroup = r.str(fieldConsumerGroup, true)
	return r.err
}

// CreateTopicRequestHeader is UPDATE_AND_CREATE_TOPIC (17).
//
// # Notes
//
// A Java broker also requires defaultTopic, topicFilterType and order. flowd requires only
// what it needs, and EncodeTo always writes all three (with Java's defaults when empty) so that
// a Java broker accepts what flowd sends.
type CreateTopicRequestHeader struct {
	Topic           string
	ReadQueueNums   int32
	WriteQueueNums  int32
	Perm            int32  // Perm* bits
	DefaultTopic    string // optional; encoded as AutoCreateTopicKey when empty
	TopicFilterType string // optional; encoded as "SINGLE_TAG" when empty
	TopicSysFlag    int32  // optional
	Order           bool   // optional
}

func (h *CreateTopicRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 8)
	h.EncodeTo(m)
	return m
}

func (h *CreateTopicRequestHeader) EncodeTo(ext map[string]string) {
	ext[fieldTopic] = h.Topic
	putInt(ext, "readQueueNums", int64(h.ReadQueueNums))
	putInt(ext, "writeQueueNums", int64(h.WriteQueueNums))
	putInt(ext, "perm", int64(h.Perm))
	ext["defaultTopic"] = cmpOr(h.DefaultTopic, AutoCreateTopicKey)
	ext["topicFilterType"] = cmpOr(h.TopicFilterType, "SINGLE_TAG")
	putInt(ext, "topicSysFlag", int64(h.TopicSysFlag))
	putBool(ext, "order", h.Order)
}

func (h *CreateTopicRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.Topic = r.str(fieldTopic, true)
	h.ReadQueueNums = r.i32("readQueueNums", true)
	h.WriteQueueNums = r.i32("writeQueueNums", true)
	h.Perm = r.i32("perm", true)
	h.DefaultTopic = r.str("defaultTopic", false)
	h.TopicFilterType = r.str("topicFilterType", false)
	h.TopicSysFlag = r.i32("topicSysFlag", false)
	h.Order = r.bool("order", false)
	return r.err
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// ViewMessageRequestHeader is VIEW_MESSAGE_BY_ID (33): Offset is the commit-log offset taken
// from an offsetMsgId (ParseOffsetMsgID).
type ViewMessageRequestHeader struct {
	Offset int64
	Topic  string // optional (RocketMQ 5)
}

func (h *ViewMessageRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 2)
	h.EncodeTo(m)
	return m
}

func (h *ViewMessageRequestHeader) EncodeTo(ext map[string]string) {
	putInt(ext, fieldOffset, h.Offset)
	putStr(ext, fieldTopic, h.Topic)
}

func (h *ViewMessageRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.Offset = r.i64(fieldOffset, true)
	h.Topic = r.str(fieldTopic, false)
	return r.err
}

// DeleteTopicRequestHeader is DELETE_TOPIC_IN_BROKER (215) and DELETE_TOPIC_IN_NAMESRV (216).
type DeleteTopicRequestHeader struct {
	Topic       string
	ClusterName string // optional; name servers of RocketMQ 5 may scope the delete to a cluster
}

func (h *DeleteTopicRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 2)
	h.EncodeTo(m)
	return m
}

func (h *DeleteTopicRequestHeader) EncodeTo(ext map[string]string) {
	ext[fieldTopic] = h.Topic
	putStr(ext, "clusterName", h.ClusterName)
}

func (h *DeleteTopicRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.Topic = r.str(fieldTopic, true)
	h.ClusterName = r.str("clusterName", false)
	return r.err
}

// ResetOffsetRequestHeader is RESET_CONSUMER_OFFSET (220), sent by the broker to each client
// of a group; the new offsets travel in a ResetOffsetBody.
type ResetOffsetRequestHeader struct {
	Topic     string
	Group     string
	Timestamp int64 // Unix milliseconds the offsets were searched for
	IsForce   bool
}

func (h *ResetOffsetRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 4)
	h.EncodeTo(m)
	return m
}

func (h *ResetOffsetRequestHeader) EncodeTo(ext map[string]string) {
	ext[fieldTopic] = h.Topic
	ext["group"] = h.Group
	putInt(ext, "timestamp", h.Timestamp)
	putBool(ext, "isForce", h.IsForce)
}

func (h *ResetOffsetRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.Topic = r.str(fieldTopic, true)
	h.Group = r.str("group", true)
	h.Timestamp = r.i64("timestamp", true)
	h.IsForce = r.bool("isForce", true)
	return r.err
}

// GetConsumerRunningInfoRequestHeader is GET_CONSUMER_RUNNING_INFO (307), sent by the broker
// to one client; the answer is a ConsumerRunningInfo body.
type GetConsumerRunningInfoRequestHeader struct {
	ConsumerGroup string
	ClientID      string
	JstackEnable  bool // optional
}

func (h *GetConsumerRunningInfoRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 3)
	h.EncodeTo(m)
	return m
}

func (h *GetConsumerRunningInfoRequestHeader) EncodeTo(ext map[string]string) {
	ext[fieldConsumerGroup] = h.ConsumerGroup
	ext["clientId"] = h.ClientID
	putBool(ext, "jstackEnable", h.JstackEnable)
}

func (h *GetConsumerRunningInfoRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.ConsumerGroup = r.str(fieldConsumerGroup, true)
	h.ClientID = r.str("clientId", true)
	h.JstackEnable = r.bool("jstackEnable", false)
	return r.err
}
