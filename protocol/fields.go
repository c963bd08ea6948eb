package protocol

import (
	"encoding/binary"
	"math"
	"strconv"
)

// FieldAppender is a typed header that writes its fields straight into an encoded header,
// without building an ExtFields map first: a client's hot path (one send request per message)
// then costs no map and no string per number. A Command carries one in Fields.
//
// The writer goes in and comes back by value, like a slice given to append: passed by pointer
// through an interface it would escape, one allocation per header.
type FieldAppender interface {
	// AppendFields writes the header's fields with w, in any order, each key at most once,
	// and returns w.
	AppendFields(w FieldWriter) FieldWriter
}

// FieldWriter writes header fields in the encoding of the frame being built: the binary
// ROCKETMQ layout (int16 key length, key, int32 value length, value) or JSON members of
// "extFields". Numbers are formatted in place, as decimal strings, which is what both
// encodings carry.
type FieldWriter struct {
	dst  []byte
	json bool
	n    int // fields written so far, those of ExtFields included: a JSON member after the first takes a comma
	err  error
}

func (w *FieldWriter) key(k string) bool {
	if w.err != nil {
		return false
	}
	if w.json {
		if w.n > 0 {
			w.dst = append(w.dst, ',')
		}
		w.dst = appendJSONString(w.dst, k)
		w.dst = append(w.dst, ':')
	} else {
		if len(k) > math.MaxInt16 {
			w.err = errFieldKeyTooLong(len(k))
			return false
		}
		w.dst = binary.BigEndian.AppendUint16(w.dst, uint16(len(k)))
		w.dst = append(w.dst, k...)
	}
	w.n++
	return true
}

// String writes the field k with value v.
func (w *FieldWriter) String(k, v string) {
	if !w.key(k) {
		return
	}
	if w.json {
		w.dst = appendJSONString(w.dst, v)
		return
	}
	w.dst = binary.BigEndian.AppendUint32(w.dst, uint32(len(v)))
	w.dst = append(w.dst, v...)
}

// OptString writes the field k unless v is empty, so that absent and empty read back the
// same (what putStr does for a map).
func (w *FieldWriter) OptString(k, v string) {
	if v != "" {
		w.String(k, v)
	}
}

// Int writes the field k as a decimal number.
func (w *FieldWriter) Int(k string, v int64) {
	if !w.key(k) {
		return
	}
	if w.json {
		w.dst = append(w.dst, '"')
		w.dst = strconv.AppendInt(w.dst, v, 10)
		w.dst = append(w.dst, '"')
		return
	}
	at := len(w.dst)
	w.dst = append(w.dst, 0, 0, 0, 0)
	w.dst = strconv.AppendInt(w.dst, v, 10)
	binary.BigEndian.PutUint32(w.dst[at:], uint32(len(w.dst)-at-4))
}

// Bool writes the field k as "true" or "false".
func (w *FieldWriter) Bool(k string, v bool) {
	if v {
		w.String(k, "true")
	} else {
		w.String(k, "false")
	}
}

type errFieldKeyTooLong int

func (e errFieldKeyTooLong) Error() string {
	return "encode binary header: ext field key of " + strconv.Itoa(int(e)) + " bytes is too long"
}

// appendFields writes c.Fields after the n fields of ExtFields already written.
func (c *Command) appendFields(dst []byte, json bool, n int) ([]byte, error) {
	w := c.Fields.AppendFields(FieldWriter{dst: dst, json: json, n: n})
	return w.dst, w.err
}

// AppendFieldsV2 writes the header with the one-letter names of SEND_MESSAGE_V2 and
// SEND_BATCH_MESSAGE, the fields EncodeV2 would put in a map; see FieldAppender.
func (h *SendMessageRequestHeader) AppendFieldsV2(w *FieldWriter) {
	n := &sendShortNames
	w.String(n[0], h.ProducerGroup)
	w.String(n[1], h.Topic)
	w.String(n[2], h.DefaultTopic)
	w.Int(n[3], int64(h.DefaultTopicQueueNums))
	w.Int(n[4], int64(h.QueueID))
	w.Int(n[5], int64(h.SysFlag))
	w.Int(n[6], h.BornTimestamp)
	w.Int(n[7], int64(h.Flag))
	w.OptString(n[8], h.Properties)
	w.Int(n[9], int64(h.ReconsumeTimes))
	w.Bool(n[10], h.UnitMode)
	if h.MaxReconsumeTimes >= 0 {
		w.Int(n[11], int64(h.MaxReconsumeTimes))
	}
	w.Bool(n[12], h.Batch)
	w.OptString(n[13], h.BrokerName)
}

// SendV2Fields adapts a SendMessageRequestHeader to FieldAppender with the short (V2) names.
type SendV2Fields SendMessageRequestHeader

// AppendFields writes the header's V2 fields.
func (h *SendV2Fields) AppendFields(w FieldWriter) FieldWriter {
	(*SendMessageRequestHeader)(h).AppendFieldsV2(&w)
	return w
}
