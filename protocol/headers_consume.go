package protocol

// The headers of pulls and of the consumer-offset and queue-offset queries.

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
