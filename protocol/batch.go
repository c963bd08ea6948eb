package protocol

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// batchEntryFixed is the size of a batch entry without its body and properties:
// TOTALSIZE, MAGIC, BODYCRC, FLAG, BODYLEN (4 bytes each) and PROPLEN (2).
const batchEntryFixed = 4 + 4 + 4 + 4 + 4 + 2

// BatchEntrySize is the number of bytes m takes as a batch entry.
func BatchEntrySize(m *Message) int {
	return batchEntryFixed + len(m.Body) + propertiesLen(m.Properties)
}

// AppendBatchEntry appends m as one entry of a SEND_BATCH_MESSAGE body: TOTALSIZE, MAGIC (0),
// BODYCRC (0), FLAG, BODYLEN + body, PROPLEN + properties. The topic is not part of an entry;
// it travels in the request header.
func AppendBatchEntry(dst []byte, m *Message) ([]byte, error) {
	props := propertiesLen(m.Properties)
	if props > MaxPropertiesLength {
		return dst, fmt.Errorf("encode batch entry: properties of %d bytes exceed %d", props, MaxPropertiesLength)
	}
	size := batchEntryFixed + len(m.Body) + props
	if size > MaxFrameSize {
		return dst, fmt.Errorf("encode batch entry: %d bytes exceeds %d: %w", size, MaxFrameSize, ErrFrameTooLarge)
	}
	dst = appendBatchEntryHead(dst, size, m.Flag, m.Body)
	dst = binary.BigEndian.AppendUint16(dst, uint16(props))
	return AppendProperties(dst, m.Properties), nil
}

// appendBatchEntryHead appends an entry of size bytes up to and including its body.
func appendBatchEntryHead(dst []byte, size int, flag int32, body []byte) []byte {
	dst = slices.Grow(dst, size)
	dst = binary.BigEndian.AppendUint32(dst, uint32(size))
	dst = binary.BigEndian.AppendUint32(dst, 0) // MAGIC: writers put 0
	dst = binary.BigEndian.AppendUint32(dst, 0) // BODYCRC: computed by the broker
	dst = binary.BigEndian.AppendUint32(dst, uint32(flag))
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(body)))
	return append(dst, body...)
}

// AppendBatchEntryEncoded is AppendBatchEntry for a message whose properties are already
// encoded (key\x01value\x02…): a producer that encodes them once per message for its send
// header reuses them here rather than encoding a map again.
func AppendBatchEntryEncoded(dst []byte, flag int32, body []byte, props string) ([]byte, error) {
	if len(props) > MaxPropertiesLength {
		return dst, fmt.Errorf("encode batch entry: properties of %d bytes exceed %d", len(props), MaxPropertiesLength)
	}
	size := batchEntryFixed + len(body) + len(props)
	if size > MaxFrameSize {
		return dst, fmt.Errorf("encode batch entry: %d bytes exceeds %d: %w", size, MaxFrameSize, ErrFrameTooLarge)
	}
	dst = appendBatchEntryHead(dst, size, flag, body)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(props)))
	return append(dst, props...), nil
}

// EncodeBatch encodes msgs as a SEND_BATCH_MESSAGE body.
func EncodeBatch(msgs []*Message) ([]byte, error) {
	n := 0
	for _, m := range msgs {
		n += BatchEntrySize(m)
	}
	if n > MaxFrameSize {
		return nil, fmt.Errorf("encode batch: %d bytes exceeds %d: %w", n, MaxFrameSize, ErrFrameTooLarge)
	}
	b := make([]byte, 0, n)
	var err error
	for i, m := range msgs {
		if b, err = AppendBatchEntry(b, m); err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
	}
	return b, nil
}

// DecodeBatchEntry decodes the first batch entry in b and returns it with its size. Topic is
// left empty: the caller takes it from the request header. Body aliases b.
//
// # Notes
//
// MAGIC and BODYCRC are not checked: every known writer puts 0 in both, and the Java broker
// ignores them too. TOTALSIZE must agree exactly with the fields.
func DecodeBatchEntry(b []byte) (*Message, int, error) {
	e, n, err := decodeBatchEntry(b)
	if err != nil {
		return nil, 0, err
	}
	m := &Message{Flag: e.Flag, Body: e.Body}
	if m.Properties, err = DecodeProperties(e.Properties); err != nil {
		return nil, 0, err
	}
	return m, n, nil
}

// BatchEntry is one entry of a SEND_BATCH_MESSAGE body as it came: Body and Properties (the
// raw key\x01value\x02 block) alias the body.
type BatchEntry struct {
	Flag       int32
	Body       []byte
	Properties []byte
}

// DecodeBatchEntries is DecodeBatch without decoding the properties into maps, for a broker
// that stores each entry's block as it came (MessageExt.RawProperties). The blocks are
// checked as DecodeProperties would (CheckProperties).
func DecodeBatchEntries(b []byte) ([]BatchEntry, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: empty batch", ErrMalformedMessage)
	}
	var out []BatchEntry
	for len(b) > 0 {
		e, n, err := decodeBatchEntry(b)
		if err == nil {
			err = CheckProperties(e.Properties)
		}
		if err != nil {
			return nil, fmt.Errorf("batch message %d: %w", len(out), err)
		}
		out = append(out, e)
		b = b[n:]
	}
	return out, nil
}

func decodeBatchEntry(b []byte) (BatchEntry, int, error) {
	var e BatchEntry
	d := decoder{b: b}
	total := d.i32("batch TOTALSIZE")
	if d.err != nil {
		return e, 0, d.err
	}
	if total < batchEntryFixed || int64(total) > int64(len(b)) {
		return e, 0, fmt.Errorf("%w: batch entry TOTALSIZE %d, but %d bytes present and at least %d needed", ErrMalformedMessage, total, len(b), batchEntryFixed)
	}
	d.b = b[:total]
	d.u32("batch MAGIC")
	d.u32("batch BODYCRC")
	e.Flag = d.i32("batch FLAG")
	bodyLen := d.i32("batch BODYLEN")
	e.Body = d.bytes(int(bodyLen), "batch BODY")
	propLen := d.u16("batch PROPLEN")
	e.Properties = d.bytes(int(propLen), "batch PROPERTIES")
	if d.err != nil {
		return e, 0, d.err
	}
	if d.off != int(total) {
		return e, 0, fmt.Errorf("%w: batch entry TOTALSIZE %d disagrees with the fields, which end at %d", ErrMalformedMessage, total, d.off)
	}
	return e, int(total), nil
}

// DecodeBatch decodes every entry of a SEND_BATCH_MESSAGE body. An empty body is an error:
// a batch without messages is a bug in the sender, not a no-op.
func DecodeBatch(b []byte) ([]*Message, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: empty batch", ErrMalformedMessage)
	}
	var out []*Message
	for len(b) > 0 {
		m, n, err := DecodeBatchEntry(b)
		if err != nil {
			return nil, fmt.Errorf("batch message %d: %w", len(out), err)
		}
		out = append(out, m)
		b = b[n:]
	}
	return out, nil
}
