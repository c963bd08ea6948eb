package protocol

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// The headers and bodies of pop consumption: POP_MESSAGE, ACK_MESSAGE, BATCH_ACK_MESSAGE and
// CHANGE_MESSAGE_INVISIBLETIME, with RocketMQ's field names.

// Properties of a popped message.
const (
	// PropertyPopCK is the receipt of a popped message: its extra info (ExtraInfo), which an
	// acknowledgement or a change of invisibility sends back.
	PropertyPopCK = "POP_CK"
	// PropertyFirstPopTime is the Unix ms the message was first popped at.
	PropertyFirstPopTime = "1ST_POP_TIME"
)

// PopOrderReviveQueue is the revive queue id of an extra info from an ordered pop: RocketMQ's
// clients read an extra info with it as one of an ordered pop.
const PopOrderReviveQueue = 999

// ErrBadExtraInfo: an extra info (a POP_CK receipt) that does not parse.
var ErrBadExtraInfo = errors.New("malformed extra info")

// PopMessageRequestHeader is POP_MESSAGE (200050).
type PopMessageRequestHeader struct {
	ConsumerGroup string
	Topic         string
	QueueID       int32 // -1: any queue
	MaxMsgNums    int32
	InvisibleTime int64 // ms
	PollTime      int64 // ms to long-poll when nothing is available
	BornTime      int64 // Unix ms the request was made
	InitMode      int32 // where a group's first pop of a queue starts (0 last, 1 first)
	ExpType       string
	Exp           string
	Order         bool
	AttemptID     string // optional
}

func (h *PopMessageRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 12)
	h.EncodeTo(m)
	return m
}

func (h *PopMessageRequestHeader) EncodeTo(ext map[string]string) {
	ext[fieldConsumerGroup] = h.ConsumerGroup
	ext[fieldTopic] = h.Topic
	putInt(ext, fieldQueueID, int64(h.QueueID))
	putInt(ext, "maxMsgNums", int64(h.MaxMsgNums))
	putInt(ext, "invisibleTime", h.InvisibleTime)
	putInt(ext, "pollTime", h.PollTime)
	putInt(ext, "bornTime", h.BornTime)
	putInt(ext, "initMode", int64(h.InitMode))
	putStr(ext, "expType", h.ExpType)
	putStr(ext, "exp", h.Exp)
	putBool(ext, "order", h.Order)
	putStr(ext, "attemptId", h.AttemptID)
}

func (h *PopMessageRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.ConsumerGroup = r.str(fieldConsumerGroup, true)
	h.Topic = r.str(fieldTopic, true)
	h.QueueID = r.i32(fieldQueueID, true)
	h.MaxMsgNums = r.i32("maxMsgNums", true)
	h.InvisibleTime = r.i64("invisibleTime", true)
	h.PollTime = r.i64("pollTime", true)
	h.BornTime = r.i64("bornTime", true)
	h.InitMode = r.i32("initMode", true)
	h.ExpType = r.str("expType", false)
	h.Exp = r.str("exp", false)
	h.Order = r.bool("order", false)
	h.AttemptID = r.str("attemptId", false)
	return r.err
}

// PopMessageResponseHeader answers POP_MESSAGE; the body carries the messages, stored
// layout one after another, each with its PropertyPopCK.
type PopMessageResponseHeader struct {
	PopTime       int64 // Unix ms
	InvisibleTime int64 // ms
	ReviveQid     int32
	RestNum       int64 // messages left in the queues read
	// StartOffsetInfo, MsgOffsetInfo and OrderCountInfo: per queue, the first offset, the
	// offsets and the delivery count (see AppendStartOffsetInfo, AppendMsgOffsetInfo).
	StartOffsetInfo string
	MsgOffsetInfo   string
	OrderCountInfo  string
}

func (h *PopMessageResponseHeader) Encode() map[string]string {
	m := make(map[string]string, 7)
	h.EncodeTo(m)
	return m
}

func (h *PopMessageResponseHeader) EncodeTo(ext map[string]string) {
	putInt(ext, "popTime", h.PopTime)
	putInt(ext, "invisibleTime", h.InvisibleTime)
	putInt(ext, "reviveQid", int64(h.ReviveQid))
	putInt(ext, "restNum", h.RestNum)
	putStr(ext, "startOffsetInfo", h.StartOffsetInfo)
	putStr(ext, "msgOffsetInfo", h.MsgOffsetInfo)
	putStr(ext, "orderCountInfo", h.OrderCountInfo)
}

func (h *PopMessageResponseHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.PopTime = r.i64("popTime", true)
	h.InvisibleTime = r.i64("invisibleTime", true)
	h.ReviveQid = r.i32("reviveQid", true)
	h.RestNum = r.i64("restNum", true)
	h.StartOffsetInfo = r.str("startOffsetInfo", false)
	h.MsgOffsetInfo = r.str("msgOffsetInfo", false)
	h.OrderCountInfo = r.str("orderCountInfo", false)
	return r.err
}

// AckMessageRequestHeader is ACK_MESSAGE (200051).
type AckMessageRequestHeader struct {
	ConsumerGroup string
	Topic         string
	QueueID       int32
	ExtraInfo     string // the message's PropertyPopCK
	Offset        int64  // the message's queue offset
}

func (h *AckMessageRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 5)
	h.EncodeTo(m)
	return m
}

func (h *AckMessageRequestHeader) EncodeTo(ext map[string]string) {
	ext[fieldConsumerGroup] = h.ConsumerGroup
	ext[fieldTopic] = h.Topic
	putInt(ext, fieldQueueID, int64(h.QueueID))
	ext["extraInfo"] = h.ExtraInfo
	putInt(ext, fieldOffset, h.Offset)
}

func (h *AckMessageRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.ConsumerGroup = r.str(fieldConsumerGroup, true)
	h.Topic = r.str(fieldTopic, true)
	h.QueueID = r.i32(fieldQueueID, true)
	h.ExtraInfo = r.str("extraInfo", true)
	h.Offset = r.i64(fieldOffset, true)
	return r.err
}

// ChangeInvisibleTimeRequestHeader is CHANGE_MESSAGE_INVISIBLETIME (200053).
type ChangeInvisibleTimeRequestHeader struct {
	ConsumerGroup string
	Topic         string
	QueueID       int32
	ExtraInfo     string
	Offset        int64
	InvisibleTime int64 // ms from now
}

func (h *ChangeInvisibleTimeRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 6)
	h.EncodeTo(m)
	return m
}

func (h *ChangeInvisibleTimeRequestHeader) EncodeTo(ext map[string]string) {
	ext[fieldConsumerGroup] = h.ConsumerGroup
	ext[fieldTopic] = h.Topic
	putInt(ext, fieldQueueID, int64(h.QueueID))
	ext["extraInfo"] = h.ExtraInfo
	putInt(ext, fieldOffset, h.Offset)
	putInt(ext, "invisibleTime", h.InvisibleTime)
}

func (h *ChangeInvisibleTimeRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.ConsumerGroup = r.str(fieldConsumerGroup, true)
	h.Topic = r.str(fieldTopic, true)
	h.QueueID = r.i32(fieldQueueID, true)
	h.ExtraInfo = r.str("extraInfo", true)
	h.Offset = r.i64(fieldOffset, true)
	h.InvisibleTime = r.i64("invisibleTime", true)
	return r.err
}

// ChangeInvisibleTimeResponseHeader answers CHANGE_MESSAGE_INVISIBLETIME: the new receipt is
// the old extra info with these pop time, invisible time and revive queue.
type ChangeInvisibleTimeResponseHeader struct {
	PopTime       int64
	InvisibleTime int64
	ReviveQid     int32
}

func (h *ChangeInvisibleTimeResponseHeader) Encode() map[string]string {
	m := make(map[string]string, 3)
	h.EncodeTo(m)
	return m
}

func (h *ChangeInvisibleTimeResponseHeader) EncodeTo(ext map[string]string) {
	putInt(ext, "popTime", h.PopTime)
	putInt(ext, "invisibleTime", h.InvisibleTime)
	putInt(ext, "reviveQid", int64(h.ReviveQid))
}

func (h *ChangeInvisibleTimeResponseHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.PopTime = r.i64("popTime", true)
	h.InvisibleTime = r.i64("invisibleTime", true)
	h.ReviveQid = r.i32("reviveQid", true)
	return r.err
}

// ExtraInfo is a popped message's receipt, RocketMQ's extra info: eight fields separated by
// spaces, "ckQueueOffset popTime invisibleTime reviveQid retry brokerName queueId
// queueOffset", travelling as the message's PropertyPopCK.
type ExtraInfo struct {
	CkQueueOffset int64 // the first offset the pop took from the queue
	PopTime       int64 // Unix ms of the hand-out
	InvisibleTime int64 // ms
	ReviveQid     int32
	Retry         string // "0": the topic itself; "1", "2": its pop retry topic
	BrokerName    string
	QueueID       int32
	QueueOffset   int64
}

// String is the extra info's text.
func (e ExtraInfo) String() string { return string(e.Append(nil)) }

// Append appends the extra info's text to dst.
func (e ExtraInfo) Append(dst []byte) []byte {
	dst = strconv.AppendInt(dst, e.CkQueueOffset, 10)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, e.PopTime, 10)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, e.InvisibleTime, 10)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, int64(e.ReviveQid), 10)
	dst = append(dst, ' ')
	retry := e.Retry
	if retry == "" {
		retry = "0"
	}
	dst = append(dst, retry...)
	dst = append(dst, ' ')
	dst = append(dst, e.BrokerName...)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, int64(e.QueueID), 10)
	dst = append(dst, ' ')
	return strconv.AppendInt(dst, e.QueueOffset, 10)
}

// ParseExtraInfo parses an extra info. Seven fields (no queue offset, as RocketMQ 4.9's
// clients send with the offset in the request) leave QueueOffset -1.
func ParseExtraInfo(s string) (ExtraInfo, error) {
	var f [8]string
	n, rest := 0, s
	for n < len(f) {
		i := strings.IndexByte(rest, ' ')
		if i < 0 {
			f[n], rest = rest, ""
			n++
			break
		}
		f[n], rest = rest[:i], rest[i+1:]
		n++
	}
	if (n != 7 && n != 8) || rest != "" {
		return ExtraInfo{}, fmt.Errorf("%w: %q has %d fields, want 8", ErrBadExtraInfo, truncateForError(s), strings.Count(s, " ")+1)
	}
	e := ExtraInfo{Retry: f[4], BrokerName: f[5], QueueOffset: -1}
	var errs [7]error
	e.CkQueueOffset, errs[0] = strconv.ParseInt(f[0], 10, 64)
	e.PopTime, errs[1] = strconv.ParseInt(f[1], 10, 64)
	e.InvisibleTime, errs[2] = strconv.ParseInt(f[2], 10, 64)
	var v int64
	v, errs[3] = strconv.ParseInt(f[3], 10, 32)
	e.ReviveQid = int32(v)
	v, errs[4] = strconv.ParseInt(f[6], 10, 32)
	e.QueueID = int32(v)
	if n == 8 {
		e.QueueOffset, errs[5] = strconv.ParseInt(f[7], 10, 64)
	}
	if e.Retry != "0" && e.Retry != "1" && e.Retry != "2" {
		errs[6] = fmt.Errorf("retry mark %q", e.Retry)
	}
	if errs != [7]error{} {
		return ExtraInfo{}, fmt.Errorf("%w: %q: %w", ErrBadExtraInfo, truncateForError(s), errors.Join(errs[:]...))
	}
	return e, nil
}

// AppendStartOffsetInfo appends one queue's entry of PopMessageResponseHeader.StartOffsetInfo,
// "retry queueId startOffset", entries separated by ';'.
func AppendStartOffsetInfo(dst []byte, queueID int32, start int64) []byte {
	if len(dst) > 0 {
		dst = append(dst, ';')
	}
	dst = append(dst, "0 "...)
	dst = strconv.AppendInt(dst, int64(queueID), 10)
	dst = append(dst, ' ')
	return strconv.AppendInt(dst, start, 10)
}

// AppendMsgOffsetInfo appends one queue's entry of PopMessageResponseHeader.MsgOffsetInfo,
// "retry queueId offset,offset,…", entries separated by ';'.
func AppendMsgOffsetInfo(dst []byte, queueID int32, offsets []int64) []byte {
	if len(dst) > 0 {
		dst = append(dst, ';')
	}
	dst = append(dst, "0 "...)
	dst = strconv.AppendInt(dst, int64(queueID), 10)
	dst = append(dst, ' ')
	for i, o := range offsets {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendInt(dst, o, 10)
	}
	return dst
}

// BatchAck is one entry of a BATCH_ACK_MESSAGE body: the messages of one pop of one queue,
// each an offset StartOffset+i for every bit i set in Offsets.
type BatchAck struct {
	ConsumerGroup string
	Topic         string
	Retry         string
	StartOffset   int64
	QueueID       int32
	ReviveQueueID int32
	PopTime       int64
	InvisibleTime int64
	// Bits is RocketMQ's java.util.BitSet as bytes: bit i is Bits[i/8]&(1<<(i%8)).
	Bits []byte
}

// Set marks offset (at or after StartOffset) acknowledged.
func (b *BatchAck) Set(offset int64) {
	i := offset - b.StartOffset
	if i < 0 {
		return
	}
	for int64(len(b.Bits)) <= i/8 {
		b.Bits = append(b.Bits, 0)
	}
	b.Bits[i/8] |= 1 << (i % 8)
}

// Count is how many offsets the entry acknowledges, counted without listing them.
func (b *BatchAck) Count() int {
	n := 0
	for _, by := range b.Bits {
		n += bits.OnesCount8(by)
	}
	return n
}

// Offsets lists the acknowledged offsets, ascending.
func (b *BatchAck) Offsets() []int64 {
	var out []int64
	for i, by := range b.Bits {
		for j := 0; j < 8; j++ {
			if by&(1<<j) != 0 {
				out = append(out, b.StartOffset+int64(i*8+j))
			}
		}
	}
	return out
}

// batchAckJSON has RocketMQ's short names; the long ones are read too.
type batchAckJSON struct {
	C  string `json:"c"`
	T  string `json:"t"`
	R  string `json:"r"`
	SO int64  `json:"so"`
	Q  int32  `json:"q"`
	RQ int32  `json:"rq"`
	PT int64  `json:"pt"`
	IT int64  `json:"it"`
	B  string `json:"b"`

	ConsumerGroup string `json:"consumerGroup,omitempty"`
	Topic         string `json:"topic,omitempty"`
	Retry         string `json:"retry,omitempty"`
	StartOffset   *int64 `json:"startOffset,omitempty"`
	QueueID       *int32 `json:"queueId,omitempty"`
	ReviveQueueID *int32 `json:"reviveQueueId,omitempty"`
	PopTime       *int64 `json:"popTime,omitempty"`
	InvisibleTime *int64 `json:"invisibleTime,omitempty"`
	BitSet        string `json:"bitSet,omitempty"`
}

// MarshalJSON writes RocketMQ's short field names, the bit set base64 as fastjson writes a
// byte array.
func (b BatchAck) MarshalJSON() ([]byte, error) { return b.appendJSON(nil), nil }

func (b *BatchAck) appendJSON(dst []byte) []byte {
	retry := b.Retry
	if retry == "" {
		retry = "0"
	}
	dst = append(dst, `{"b":"`...)
	dst = base64.StdEncoding.AppendEncode(dst, b.Bits)
	dst = append(dst, `","c":`...)
	dst = appendJSONString(dst, b.ConsumerGroup)
	dst = append(dst, `,"it":`...)
	dst = strconv.AppendInt(dst, b.InvisibleTime, 10)
	dst = append(dst, `,"pt":`...)
	dst = strconv.AppendInt(dst, b.PopTime, 10)
	dst = append(dst, `,"q":`...)
	dst = strconv.AppendInt(dst, int64(b.QueueID), 10)
	dst = append(dst, `,"r":`...)
	dst = appendJSONString(dst, retry)
	dst = append(dst, `,"rq":`...)
	dst = strconv.AppendInt(dst, int64(b.ReviveQueueID), 10)
	dst = append(dst, `,"so":`...)
	dst = strconv.AppendInt(dst, b.StartOffset, 10)
	dst = append(dst, `,"t":`...)
	dst = appendJSONString(dst, b.Topic)
	return append(dst, '}')
}

// MarshalJSON writes the body in one pass (a client sends one per batch).
func (b BatchAckMessageRequestBody) MarshalJSON() ([]byte, error) {
	dst := make([]byte, 0, 64+128*len(b.Acks))
	dst = append(dst, `{"acks":[`...)
	for i := range b.Acks {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = b.Acks[i].appendJSON(dst)
	}
	dst = append(dst, `],"brokerName":`...)
	dst = appendJSONString(dst, b.BrokerName)
	return append(dst, '}'), nil
}

// UnmarshalJSON reads the body in one pass of encoding/json.
func (b *BatchAckMessageRequestBody) UnmarshalJSON(data []byte) error {
	var j struct {
		BrokerName string         `json:"brokerName"`
		Acks       []batchAckJSON `json:"acks"`
	}
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	*b = BatchAckMessageRequestBody{BrokerName: j.BrokerName, Acks: make([]BatchAck, len(j.Acks))}
	for i := range j.Acks {
		if err := b.Acks[i].from(&j.Acks[i]); err != nil {
			return err
		}
	}
	return nil
}

func (b *BatchAck) UnmarshalJSON(data []byte) error {
	var j batchAckJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	return b.from(&j)
}

func (b *BatchAck) from(j *batchAckJSON) error {
	pick := func(short, long string) string {
		if short != "" {
			return short
		}
		return long
	}
	*b = BatchAck{ConsumerGroup: pick(j.C, j.ConsumerGroup), Topic: pick(j.T, j.Topic), Retry: pick(j.R, j.Retry),
		StartOffset: j.SO, QueueID: j.Q, ReviveQueueID: j.RQ, PopTime: j.PT, InvisibleTime: j.IT}
	for _, o := range []struct {
		p   *int64
		dst *int64
	}{{j.StartOffset, &b.StartOffset}, {j.PopTime, &b.PopTime}, {j.InvisibleTime, &b.InvisibleTime}} {
		if o.p != nil {
			*o.dst = *o.p
		}
	}
	if j.QueueID != nil {
		b.QueueID = *j.QueueID
	}
	if j.ReviveQueueID != nil {
		b.ReviveQueueID = *j.ReviveQueueID
	}
	bits, err := base64.StdEncoding.DecodeString(pick(j.B, j.BitSet))
	if err != nil {
		return fmt.Errorf("batch ack bit set: %w", err)
	}
	b.Bits = bits
	return nil
}

// BatchAckMessageRequestBody is the body of BATCH_ACK_MESSAGE (200151), which has no header.
type BatchAckMessageRequestBody struct {
	BrokerName string
	Acks       []BatchAck
}
