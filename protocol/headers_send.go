package protocol

import "fmt"

// The headers of the three send requests and of their answer.

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
