package protocol

// The headers of client membership, consumer-group and topic administration requests.

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
