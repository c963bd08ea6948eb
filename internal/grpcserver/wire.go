package grpcserver

import (
	"fmt"
	"net/netip"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

// A receive streams one ReceiveMessageResponse per message, the hottest thing the endpoint
// writes. Building a pb.Message for it (a dozen allocations) and marshalling it through
// protobuf's reflection cost more than the message's own bytes; so a delivery is written
// here in protobuf's wire format, straight into a pooled buffer, and the server's codec
// sends those bytes as they are. TestEncodedDeliveryMatchesToProto holds it to toProto's
// output, field for field.

// Field numbers of the messages written by hand (internal/rocketmqv2/proto).
const (
	fieldResponseMessage = 2 // ReceiveMessageResponse.message

	fieldMessageTopic      = 1 // Message.topic
	fieldMessageUserProps  = 2 // Message.user_properties
	fieldMessageSystemProp = 3 // Message.system_properties
	fieldMessageBody       = 4 // Message.body

	fieldResourceName = 2 // Resource.name
	fieldMapKey       = 1
	fieldMapValue     = 2

	fieldDigestType     = 1
	fieldDigestChecksum = 2

	fieldTimeSeconds = 1 // Timestamp.seconds, Duration.seconds
	fieldTimeNanos   = 2 // Timestamp.nanos, Duration.nanos

	fieldSPTag               = 1
	fieldSPKeys              = 2
	fieldSPMessageID         = 3
	fieldSPBodyDigest        = 4
	fieldSPBodyEncoding      = 5
	fieldSPMessageType       = 6
	fieldSPBornTimestamp     = 7
	fieldSPBornHost          = 8
	fieldSPStoreTimestamp    = 9
	fieldSPStoreHost         = 10
	fieldSPDeliveryTimestamp = 11
	fieldSPReceiptHandle     = 12
	fieldSPQueueID           = 13
	fieldSPQueueOffset       = 14
	fieldSPInvisibleDuration = 15
	fieldSPDeliveryAttempt   = 16
	fieldSPMessageGroup      = 17
	fieldSPTraceContext      = 18
)

// encodedResponse is a ReceiveMessageResponse already in wire format, in a buffer of
// mem.DefaultBufferPool: serverCodec sends it as it is and the transport returns the buffer
// to the pool once written. Send it once.
type encodedResponse []byte

// serverCodec is grpc's proto codec, except that an *encodedResponse goes out untouched.
type serverCodec struct {
	proto encoding.CodecV2
}

func newServerCodec() serverCodec {
	return serverCodec{proto: encoding.GetCodecV2(grpcproto.Name)}
}

func (c serverCodec) Marshal(v any) (mem.BufferSlice, error) {
	if e, ok := v.(*encodedResponse); ok {
		return mem.BufferSlice{mem.NewBuffer((*[]byte)(e), mem.DefaultBufferPool())}, nil
	}
	return c.proto.Marshal(v)
}

func (c serverCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }

// Name is the proto codec's: on the wire nothing differs.
func (c serverCodec) Name() string { return grpcproto.Name }

// hostBuf holds a host as text: an IPv6 address with a zone and a port fits.
type hostBuf [96]byte

// wireHosts are the born and store hosts as their text, made once for the sizing and the
// writing of a delivery.
type wireHosts struct {
	born, store []byte
}

func (o *outMessage) hosts(born, store *hostBuf) wireHosts {
	return wireHosts{born: appendAddr(born[:0], o.m.BornHost.Addr()), store: appendAddrPort(store[:0], o.m.StoreHost)}
}

// appendAddr appends a.String().
func appendAddr(b []byte, a netip.Addr) []byte {
	if !a.IsValid() {
		return append(b, "invalid IP"...)
	}
	return a.AppendTo(b)
}

// appendAddrPort appends p.String().
func appendAddrPort(b []byte, p netip.AddrPort) []byte {
	if !p.Addr().IsValid() {
		return append(b, "invalid AddrPort"...)
	}
	return p.AppendTo(b)
}

// wireSafe reports whether every string the delivery carries is valid UTF-8, which protobuf
// requires of a proto3 string: a message that is not goes through toProto and proto's
// marshalling, which refuses it as it always did.
func (o *outMessage) wireSafe() bool {
	if !utf8.ValidString(o.topic) || !utf8.ValidString(o.messageID) || !utf8.ValidString(o.tag) ||
		!utf8.ValidString(o.keys) || !utf8.ValidString(o.group) || !utf8.ValidString(o.trace) ||
		(o.p != nil && !utf8.ValidString(o.p.handle)) {
		return false
	}
	for k, v := range o.m.Properties {
		if !systemKeys[k] && (!utf8.ValidString(k) || !utf8.ValidString(v)) {
			return false
		}
	}
	return true
}

// encodeDelivery writes ReceiveMessageResponse{message: o.proto()} in wire format into a
// pooled buffer.
func (o *outMessage) encodeDelivery() (*encodedResponse, error) {
	var bornBuf, storeBuf hostBuf
	h := o.hosts(&bornBuf, &storeBuf)
	spSize := o.systemSize(h)
	msgSize := o.messageSize(spSize)
	size := protowire.SizeTag(fieldResponseMessage) + protowire.SizeBytes(msgSize)
	buf := mem.DefaultBufferPool().Get(size)
	b := (*buf)[:0]
	b = protowire.AppendTag(b, fieldResponseMessage, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(msgSize))
	b = o.appendMessage(b, h, spSize)
	if len(b) != size {
		mem.DefaultBufferPool().Put(buf)
		return nil, fmt.Errorf("grpc: a delivery encoded to %d bytes, sized %d", len(b), size)
	}
	*buf = b
	return (*encodedResponse)(buf), nil
}

func sizeString(num protowire.Number, n int) int {
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

// sizeVarintField is a varint field's size; proto3 leaves a zero out unless the field is
// optional (always).
func sizeVarintField(num protowire.Number, v uint64, always bool) int {
	if v == 0 && !always {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func appendVarintField(b []byte, num protowire.Number, v uint64, always bool) []byte {
	if v == 0 && !always {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// secondsNanos is a Timestamp's or Duration's fields.
type secondsNanos struct {
	seconds int64
	nanos   int32
}

// timestampOf is timestamppb.New(time.UnixMilli(ms)): nanos in [0, 1e9).
func timestampOf(ms int64) secondsNanos {
	t := time.UnixMilli(ms)
	return secondsNanos{seconds: t.Unix(), nanos: int32(t.Nanosecond())}
}

// durationOf is durationpb.New(d): nanos of the seconds' sign.
func durationOf(d time.Duration) secondsNanos {
	ns := d.Nanoseconds()
	secs := ns / 1e9
	return secondsNanos{seconds: secs, nanos: int32(ns - secs*1e9)}
}

func (t secondsNanos) size() int {
	// int32 and int64 fields are varints of the value as 64 bits: a negative one is ten bytes.
	return sizeVarintField(fieldTimeSeconds, uint64(t.seconds), false) + sizeVarintField(fieldTimeNanos, uint64(int64(t.nanos)), false)
}

func appendTime(b []byte, num protowire.Number, t secondsNanos) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(t.size()))
	b = appendVarintField(b, fieldTimeSeconds, uint64(t.seconds), false)
	return appendVarintField(b, fieldTimeNanos, uint64(int64(t.nanos)), false)
}

func sizeTime(num protowire.Number, t secondsNanos) int {
	return protowire.SizeTag(num) + protowire.SizeBytes(t.size())
}

// digestSize is the Digest{MD5, checksum} message's size.
func (o *outMessage) digestSize() int {
	return sizeVarintField(fieldDigestType, uint64(pb.DigestType_MD5), false) + sizeString(fieldDigestChecksum, len(o.digest))
}

// systemSize is the SystemProperties message's size.
func (o *outMessage) systemSize(h wireHosts) int {
	m := o.m
	n := 0
	if o.hasTag {
		n += sizeString(fieldSPTag, len(o.tag))
	}
	for k := range strings.FieldsSeq(o.keys) {
		n += sizeString(fieldSPKeys, len(k))
	}
	if o.messageID != "" {
		n += sizeString(fieldSPMessageID, len(o.messageID))
	}
	n += protowire.SizeTag(fieldSPBodyDigest) + protowire.SizeBytes(o.digestSize())
	n += sizeVarintField(fieldSPBodyEncoding, uint64(pb.Encoding_IDENTITY), false)
	n += sizeVarintField(fieldSPMessageType, uint64(o.msgType), false)
	n += sizeTime(fieldSPBornTimestamp, timestampOf(m.BornTimestamp))
	if len(h.born) > 0 {
		n += sizeString(fieldSPBornHost, len(h.born))
	}
	n += sizeTime(fieldSPStoreTimestamp, timestampOf(m.StoreTimestamp))
	if len(h.store) > 0 {
		n += sizeString(fieldSPStoreHost, len(h.store))
	}
	if o.hasDeliverAt {
		n += sizeTime(fieldSPDeliveryTimestamp, timestampOf(o.deliverAt))
	}
	if o.p != nil {
		n += sizeString(fieldSPReceiptHandle, len(o.p.handle))
	}
	n += sizeVarintField(fieldSPQueueID, uint64(int64(m.QueueID)), false)
	n += sizeVarintField(fieldSPQueueOffset, uint64(m.QueueOffset), true)
	if o.p != nil {
		n += sizeTime(fieldSPInvisibleDuration, durationOf(o.invisible))
		n += sizeVarintField(fieldSPDeliveryAttempt, uint64(int64(int32(o.p.attempt))), true)
	}
	if o.hasGroup {
		n += sizeString(fieldSPMessageGroup, len(o.group))
	}
	if o.hasTrace {
		n += sizeString(fieldSPTraceContext, len(o.trace))
	}
	return n
}

// messageSize is the Message's size, its system properties spSize long.
func (o *outMessage) messageSize(spSize int) int {
	n := protowire.SizeTag(fieldMessageTopic) + protowire.SizeBytes(o.resourceSize())
	for k, v := range o.m.Properties {
		if !systemKeys[k] {
			n += protowire.SizeTag(fieldMessageUserProps) + protowire.SizeBytes(mapEntrySize(k, v))
		}
	}
	n += protowire.SizeTag(fieldMessageSystemProp) + protowire.SizeBytes(spSize)
	if len(o.body) > 0 {
		n += sizeString(fieldMessageBody, len(o.body))
	}
	return n
}

func (o *outMessage) resourceSize() int {
	if o.topic == "" {
		return 0
	}
	return sizeString(fieldResourceName, len(o.topic))
}

// mapEntrySize is a map<string, string> entry's size: key and value, even empty (as
// protobuf-go writes them).
func mapEntrySize(k, v string) int {
	return sizeString(fieldMapKey, len(k)) + sizeString(fieldMapValue, len(v))
}

func (o *outMessage) appendMessage(b []byte, h wireHosts, spSize int) []byte {
	b = protowire.AppendTag(b, fieldMessageTopic, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(o.resourceSize()))
	if o.topic != "" {
		b = appendString(b, fieldResourceName, o.topic)
	}
	for k, v := range o.m.Properties {
		if systemKeys[k] {
			continue
		}
		b = protowire.AppendTag(b, fieldMessageUserProps, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(mapEntrySize(k, v)))
		b = appendString(b, fieldMapKey, k)
		b = appendString(b, fieldMapValue, v)
	}
	b = protowire.AppendTag(b, fieldMessageSystemProp, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(spSize))
	b = o.appendSystem(b, h)
	if len(o.body) > 0 {
		b = appendBytes(b, fieldMessageBody, o.body)
	}
	return b
}

func (o *outMessage) appendSystem(b []byte, h wireHosts) []byte {
	m := o.m
	if o.hasTag {
		b = appendString(b, fieldSPTag, o.tag)
	}
	for k := range strings.FieldsSeq(o.keys) {
		b = appendString(b, fieldSPKeys, k)
	}
	if o.messageID != "" {
		b = appendString(b, fieldSPMessageID, o.messageID)
	}
	b = protowire.AppendTag(b, fieldSPBodyDigest, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(o.digestSize()))
	b = appendVarintField(b, fieldDigestType, uint64(pb.DigestType_MD5), false)
	b = appendBytes(b, fieldDigestChecksum, o.digest[:])
	b = appendVarintField(b, fieldSPBodyEncoding, uint64(pb.Encoding_IDENTITY), false)
	b = appendVarintField(b, fieldSPMessageType, uint64(o.msgType), false)
	b = appendTime(b, fieldSPBornTimestamp, timestampOf(m.BornTimestamp))
	if len(h.born) > 0 {
		b = appendBytes(b, fieldSPBornHost, h.born)
	}
	b = appendTime(b, fieldSPStoreTimestamp, timestampOf(m.StoreTimestamp))
	if len(h.store) > 0 {
		b = appendBytes(b, fieldSPStoreHost, h.store)
	}
	if o.hasDeliverAt {
		b = appendTime(b, fieldSPDeliveryTimestamp, timestampOf(o.deliverAt))
	}
	if o.p != nil {
		b = appendString(b, fieldSPReceiptHandle, o.p.handle)
	}
	b = appendVarintField(b, fieldSPQueueID, uint64(int64(m.QueueID)), false)
	b = appendVarintField(b, fieldSPQueueOffset, uint64(m.QueueOffset), true)
	if o.p != nil {
		b = appendTime(b, fieldSPInvisibleDuration, durationOf(o.invisible))
		b = appendVarintField(b, fieldSPDeliveryAttempt, uint64(int64(int32(o.p.attempt))), true)
	}
	if o.hasGroup {
		b = appendString(b, fieldSPMessageGroup, o.group)
	}
	if o.hasTrace {
		b = appendString(b, fieldSPTraceContext, o.trace)
	}
	return b
}
