package protocol

import "strings"

// QueryMessage is QUERY_MESSAGE: look messages of a topic up by key in the broker's key
// index. The header is a [QueryMessageRequestHeader]; the response header a
// [QueryMessageResponseHeader] and its body the matching stored messages, concatenated (as
// a pull response's). A broker answers QUERY_NOT_FOUND when nothing matches.
const QueryMessage RequestCode = 12

// UniqueKeyQueryField is the extField that makes a QUERY_MESSAGE a unique-key lookup when
// it is "true" (Java's MixAll.UNIQUE_MSG_QUERY_FLAG): Key is then a message's UNIQ_KEY (the
// msgId a producer's send result carries), not one of its KEYS.
const UniqueKeyQueryField = "_UNIQUE_KEY_QUERY"

var (
	_ Header = (*QueryMessageRequestHeader)(nil)
	_ Header = (*QueryMessageResponseHeader)(nil)
)

// QueryMessageRequestHeader is QUERY_MESSAGE (12). Every field but Unique is required
// (the Java broker's @CFNotNull). Timestamps are Unix milliseconds, both bounds inclusive.
type QueryMessageRequestHeader struct {
	Topic          string
	Key            string
	MaxNum         int32
	BeginTimestamp int64
	EndTimestamp   int64
	// Unique travels as the extField UniqueKeyQueryField. Only "true" (any case) sets it,
	// as Java compares the value with "true"; anything else, or no field, means a key query.
	Unique bool
}

func (h *QueryMessageRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 6)
	h.EncodeTo(m)
	return m
}

func (h *QueryMessageRequestHeader) EncodeTo(ext map[string]string) {
	ext[fieldTopic] = h.Topic
	ext["key"] = h.Key
	putInt(ext, "maxNum", int64(h.MaxNum))
	putInt(ext, "beginTimestamp", h.BeginTimestamp)
	putInt(ext, "endTimestamp", h.EndTimestamp)
	if h.Unique {
		ext[UniqueKeyQueryField] = "true"
	}
}

func (h *QueryMessageRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.Topic = r.str(fieldTopic, true)
	h.Key = r.str("key", true)
	h.MaxNum = r.i32("maxNum", true)
	h.BeginTimestamp = r.i64("beginTimestamp", true)
	h.EndTimestamp = r.i64("endTimestamp", true)
	h.Unique = strings.EqualFold(ext[UniqueKeyQueryField], "true")
	return r.err
}

// QueryMessageResponseHeader answers QUERY_MESSAGE: the store timestamp and commit-log
// offset of the last message the broker's index holds (RocketMQ's names, "Phyoffset"
// included), which tell a client how current the index was.
type QueryMessageResponseHeader struct {
	IndexLastUpdateTimestamp int64
	IndexLastUpdatePhyoffset int64
}

func (h *QueryMessageResponseHeader) Encode() map[string]string {
	m := make(map[string]string, 2)
	h.EncodeTo(m)
	return m
}

func (h *QueryMessageResponseHeader) EncodeTo(ext map[string]string) {
	putInt(ext, "indexLastUpdateTimestamp", h.IndexLastUpdateTimestamp)
	putInt(ext, "indexLastUpdatePhyoffset", h.IndexLastUpdatePhyoffset)
}

func (h *QueryMessageResponseHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.IndexLastUpdateTimestamp = r.i64("indexLastUpdateTimestamp", true)
	h.IndexLastUpdatePhyoffset = r.i64("indexLastUpdatePhyoffset", true)
	return r.err
}
