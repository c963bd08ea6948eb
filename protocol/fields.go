package protocol

import (
	"encoding/binary"
	"strconv"
)

// FieldAppender is a header that writes its fields straight into an encoded frame
// (Command.Fields), so that a response a handler builds and nothing reads before it goes out
// costs no ExtFields map: no map to fill, no integers formatted into strings for it, no keys
// to iterate when the frame is encoded.
type FieldAppender interface {
	AppendFields(w *FieldWriter)
}

// FieldWriter appends header fields to a frame being encoded, in the command's serialize
// type: JSON members of "extFields" (every value a JSON string, as RocketMQ's) or binary
// key/value pairs.
type FieldWriter struct {
	dst  []byte
	json bool
	n    int // fields written so far (JSON needs the commas)
}

// String writes the field k with value v.
func (w *FieldWriter) String(k, v string) {
	if w.json {
		w.jsonKey(k)
		w.dst = appendJSONString(w.dst, v)
		return
	}
	w.binaryKey(k)
	w.dst = binary.BigEndian.AppendUint32(w.dst, uint32(len(v)))
	w.dst = append(w.dst, v...)
}

// OptString writes the field k with value v unless v is empty (see putStr).
func (w *FieldWriter) OptString(k, v string) {
	if v != "" {
		w.String(k, v)
	}
}

// Int writes the field k with v in decimal.
func (w *FieldWriter) Int(k string, v int64) {
	var num [20]byte
	digits := strconv.AppendInt(num[:0], v, 10)
	if w.json {
		w.jsonKey(k)
		w.dst = append(w.dst, '"')
		w.dst = append(w.dst, digits...)
		w.dst = append(w.dst, '"')
		return
	}
	w.binaryKey(k)
	w.dst = binary.BigEndian.AppendUint32(w.dst, uint32(len(digits)))
	w.dst = append(w.dst, digits...)
}

// Bool writes the field k as "true" or "false".
func (w *FieldWriter) Bool(k string, v bool) { w.String(k, strconv.FormatBool(v)) }

func (w *FieldWriter) jsonKey(k string) {
	if w.n > 0 {
		w.dst = append(w.dst, ',')
	}
	w.n++
	w.dst = appendJSONString(w.dst, k)
	w.dst = append(w.dst, ':')
}

func (w *FieldWriter) binaryKey(k string) {
	w.n++
	w.dst = binary.BigEndian.AppendUint16(w.dst, uint16(len(k)))
	w.dst = append(w.dst, k...)
}
