package protocol

import "strings"

// Request–reply (RocketMQ 4.6+). A requester sends a message carrying PropertyCorrelationID,
// PropertyReplyToClient (its client id) and PropertyMessageTTL; the broker stamps
// PropertyCluster on it as on every message it stores. The responder sends its reply with
// SEND_REPLY_MESSAGE (or V2) to ReplyTopic(cluster), and the broker stores it there and
// pushes it to the requesting client with PUSH_REPLY_MESSAGE_TO_CLIENT.
const (
	// SendReplyMessage carries a SendMessageRequestHeader, SendReplyMessageV2 the compact
	// V2 form; the body is the reply's.
	SendReplyMessage   RequestCode = 324
	SendReplyMessageV2 RequestCode = 325
	// PushReplyMessageToClient is sent by the broker on the requester's connection with a
	// [ReplyMessageRequestHeader] and the reply's body.
	PushReplyMessageToClient RequestCode = 326
)

// Properties of request–reply messages (Java's MessageConst).
const (
	PropertyCluster       = "CLUSTER"
	PropertyReplyToClient = "REPLY_TO_CLIENT"
	PropertyCorrelationID = "CORRELATION_ID"
	// PropertyMessageTTL is the requester's timeout in milliseconds.
	PropertyMessageTTL = "TTL"
	// PropertyMessageType is "reply" on a reply (ReplyMessageType).
	PropertyMessageType = "MSG_TYPE"
	// PropertyReplyArriveTime is when a requester received a reply (Unix milliseconds).
	PropertyReplyArriveTime = "ARRIVE_TIME"
)

// ReplyMessageType is the value of PropertyMessageType on a reply.
const ReplyMessageType = "reply"

// ReplyTopicSuffix ends the name of a cluster's reply topic.
const ReplyTopicSuffix = "_REPLY_TOPIC"

// ReplyTopic is the topic replies to requests are stored in: "<cluster>_REPLY_TOPIC".
func ReplyTopic(cluster string) string { return cluster + ReplyTopicSuffix }

// IsReplyTopic reports whether topic is some cluster's reply topic.
func IsReplyTopic(topic string) bool {
	return strings.HasSuffix(topic, ReplyTopicSuffix) && len(topic) > len(ReplyTopicSuffix)
}

var _ Header = (*ReplyMessageRequestHeader)(nil)

// ReplyMessageRequestHeader is PUSH_REPLY_MESSAGE_TO_CLIENT (326): the stored reply's
// metadata; the body is the reply's body (compressed when SysFlag says so). Hosts are
// "ip:port".
type ReplyMessageRequestHeader struct {
	ProducerGroup         string
	Topic                 string
	DefaultTopic          string
	DefaultTopicQueueNums int32
	QueueID               int32
	SysFlag               int32
	BornTimestamp         int64
	Flag                  int32
	Properties            string // optional
	ReconsumeTimes        int32  // optional
	UnitMode              bool   // optional
	BornHost              string
	StoreHost             string
	StoreTimestamp        int64
}

func (h *ReplyMessageRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 14)
	h.EncodeTo(m)
	return m
}

func (h *ReplyMessageRequestHeader) EncodeTo(ext map[string]string) {
	ext["producerGroup"] = h.ProducerGroup
	ext[fieldTopic] = h.Topic
	ext["defaultTopic"] = h.DefaultTopic
	putInt(ext, "defaultTopicQueueNums", int64(h.DefaultTopicQueueNums))
	putInt(ext, fieldQueueID, int64(h.QueueID))
	putInt(ext, "sysFlag", int64(h.SysFlag))
	putInt(ext, "bornTimestamp", h.BornTimestamp)
	putInt(ext, "flag", int64(h.Flag))
	putStr(ext, "properties", h.Properties)
	putInt(ext, "reconsumeTimes", int64(h.ReconsumeTimes))
	putBool(ext, "unitMode", h.UnitMode)
	ext["bornHost"] = h.BornHost
	ext["storeHost"] = h.StoreHost
	putInt(ext, "storeTimestamp", h.StoreTimestamp)
}

func (h *ReplyMessageRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.ProducerGroup = r.str("producerGroup", true)
	h.Topic = r.str(fieldTopic, true)
	h.DefaultTopic = r.str("defaultTopic", false)
	h.DefaultTopicQueueNums = r.i32Or("defaultTopicQueueNums", 0)
	h.QueueID = r.i32(fieldQueueID, true)
	h.SysFlag = r.i32Or("sysFlag", 0)
	h.BornTimestamp = r.i64("bornTimestamp", false)
	h.Flag = r.i32Or("flag", 0)
	h.Properties = r.str("properties", false)
	h.ReconsumeTimes = r.i32Or("reconsumeTimes", 0)
	h.UnitMode = r.bool("unitMode", false)
	h.BornHost = r.str("bornHost", false)
	h.StoreHost = r.str("storeHost", false)
	h.StoreTimestamp = r.i64("storeTimestamp", false)
	return r.err
}
