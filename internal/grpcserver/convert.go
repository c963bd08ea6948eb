package grpcserver

import (
	"bytes"
	"compress/gzip"
	"crypto/md5"
	"fmt"
	"hash/fnv"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/flowd-io/flowd/broker"
	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
	"github.com/flowd-io/flowd/protocol"
)

// Properties the 5.x protocol carries as system properties, stored as RocketMQ stores them
// so that 4.x clients see the same message.
const (
	// propShardingKey is a FIFO message's message_group, which a FIFO pop group orders by.
	propShardingKey = broker.PropertyShardingKey
	// propTraceContext is the message's trace_context.
	propTraceContext = "TRACE_CONTEXT"
	// propDeliverAt is a delayed message's delivery time (Unix ms), as RocketMQ 5's timer
	// messages carry it; flowd delivers it at the delay level it rounds up to.
	propDeliverAt = "TIMER_DELIVER_MS"
)

// systemKeys are the stored properties that are system properties of the 5.x protocol, or
// the broker's own, never shown as user properties.
var systemKeys = map[string]bool{
	protocol.PropertyTags: true, protocol.PropertyKeys: true, protocol.PropertyUniqueKey: true,
	protocol.PropertyDelayLevel: true, protocol.PropertyRealTopic: true, protocol.PropertyRealQueueID: true,
	protocol.PropertyRetryTopic: true, protocol.PropertyReconsumeTimes: true, protocol.PropertyMaxReconsume: true,
	protocol.PropertyCluster: true, protocol.PropertyTransactionPrepared: true, protocol.PropertyProducerGroup: true,
	protocol.PropertyCheckImmunityTime: true, protocol.PropertyTransactionCheckTimes: true,
	propShardingKey: true, propTraceContext: true, propDeliverAt: true,
	"MIN_OFFSET": true, "MAX_OFFSET": true, "CONSUME_START_TIME": true, "WAIT": true,
}

// grpcProducerPrefix names the producer group of a gRPC client's half messages: the 5.x
// protocol has no producer groups, so a topic's transactional producers share one, and a
// check-back goes to a producer session publishing the topic.
const grpcProducerPrefix = "GRPC_PRODUCER_"

func grpcProducerGroup(topic string) string { return grpcProducerPrefix + topic }

func isGRPCProducerGroup(g string) bool { return strings.HasPrefix(g, grpcProducerPrefix) }

// transactionID names a half message for EndTransaction: its half-queue offset and its
// commit-log offset, which END_TRANSACTION needs too.
func transactionID(halfOffset, commitLogOffset int64) string {
	return strconv.FormatInt(halfOffset, 16) + "-" + strconv.FormatInt(commitLogOffset, 16)
}

func parseTransactionID(id string) (halfOffset, commitLogOffset int64, err error) {
	a, b, found := strings.Cut(id, "-")
	if !found {
		return 0, 0, fmt.Errorf("transaction id %q is not one flowd issued", id)
	}
	if halfOffset, err = strconv.ParseInt(a, 16, 64); err != nil {
		return 0, 0, fmt.Errorf("transaction id %q is not one flowd issued", id)
	}
	if commitLogOffset, err = strconv.ParseInt(b, 16, 64); err != nil {
		return 0, 0, fmt.Errorf("transaction id %q is not one flowd issued", id)
	}
	return halfOffset, commitLogOffset, nil
}

// badMessage is a message the server refuses before the broker sees it, with its status.
type badMessage struct {
	code pb.Code
	msg  string
}

func (e *badMessage) Error() string { return e.msg }

// fromProto maps a 5.x message onto the broker's: tag, keys, message id (UNIQ_KEY, so 4.x
// clients see the id the 5.x producer made), message group, trace context, the user's
// properties; a delivery time becomes the delay level it rounds up to.
func (s *Server) fromProto(m *pb.Message, bornHost netip.AddrPort, now time.Time) (broker.ProduceRequest, *badMessage) {
	sp := m.GetSystemProperties()
	topic := m.GetTopic().GetName()
	if topic == "" {
		return broker.ProduceRequest{}, &badMessage{pb.Code_ILLEGAL_TOPIC, "the message names no topic"}
	}
	props := make(map[string]string, len(m.UserProperties)+4)
	for k, v := range m.UserProperties {
		if systemKeys[k] {
			return broker.ProduceRequest{}, &badMessage{pb.Code_ILLEGAL_MESSAGE_PROPERTY_KEY, fmt.Sprintf("user property %q is a system property", k)}
		}
		props[k] = v
	}
	if sp.Tag != nil {
		if strings.ContainsAny(sp.GetTag(), "|") || strings.TrimSpace(sp.GetTag()) == "" {
			return broker.ProduceRequest{}, &badMessage{pb.Code_ILLEGAL_MESSAGE_TAG, fmt.Sprintf("tag %q is empty or holds '|'", sp.GetTag())}
		}
		props[protocol.PropertyTags] = sp.GetTag()
	}
	if len(sp.GetKeys()) > 0 {
		for _, k := range sp.GetKeys() {
			if strings.TrimSpace(k) == "" || strings.Contains(k, " ") {
				return broker.ProduceRequest{}, &badMessage{pb.Code_ILLEGAL_MESSAGE_KEY, fmt.Sprintf("key %q is empty or holds a space", k)}
			}
		}
		props[protocol.PropertyKeys] = strings.Join(sp.GetKeys(), " ")
	}
	if id := sp.GetMessageId(); id != "" {
		props[protocol.PropertyUniqueKey] = id
	}
	if tc := sp.GetTraceContext(); tc != "" {
		props[propTraceContext] = tc
	}
	body := m.GetBody()
	if sp.GetBodyEncoding() == pb.Encoding_GZIP {
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			return broker.ProduceRequest{}, &badMessage{pb.Code_MESSAGE_CORRUPTED, "gzip body: " + err.Error()}
		}
		if body, err = io.ReadAll(io.LimitReader(zr, int64(s.b.MaxMessageSize())+1)); err != nil {
			return broker.ProduceRequest{}, &badMessage{pb.Code_MESSAGE_CORRUPTED, "gzip body: " + err.Error()}
		}
	}
	if len(body) == 0 {
		return broker.ProduceRequest{}, &badMessage{pb.Code_MESSAGE_BODY_EMPTY, "the message body is empty"}
	}
	if len(body) > s.b.MaxMessageSize() {
		return broker.ProduceRequest{}, &badMessage{pb.Code_MESSAGE_BODY_TOO_LARGE, fmt.Sprintf("a body of %d bytes exceeds the %d-byte limit", len(body), s.b.MaxMessageSize())}
	}
	req := broker.ProduceRequest{
		Message:  protocol.Message{Topic: topic, Body: body, Properties: props},
		QueueID:  -1,
		BornHost: bornHost,
	}
	if bt := sp.GetBornTimestamp(); bt != nil {
		req.BornTimestamp = bt.AsTime().UnixMilli()
	}
	typ := sp.GetMessageType()
	if g := sp.GetMessageGroup(); g != "" {
		if typ != pb.MessageType_FIFO && typ != pb.MessageType_MESSAGE_TYPE_UNSPECIFIED {
			return broker.ProduceRequest{}, &badMessage{pb.Code_MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a message group is for FIFO messages only"}
		}
		props[propShardingKey] = g
		tc, found := s.b.Topic(topic)
		if found && tc.WriteQueueNums > 0 {
			// One queue per message group keeps its messages in order.
			req.QueueID = int32(hashGroup(g) % uint32(tc.WriteQueueNums))
		}
	}
	if dt := sp.GetDeliveryTimestamp(); dt != nil {
		at := dt.AsTime()
		props[propDeliverAt] = strconv.FormatInt(at.UnixMilli(), 10)
		if d := at.Sub(now); d > 0 {
			level, found := delayLevelFor(s.b.DelayLevels(), d)
			if !found {
				return broker.ProduceRequest{}, &badMessage{pb.Code_ILLEGAL_DELIVERY_TIME, fmt.Sprintf("a delivery %s from now is past the longest delay level", d.Round(time.Second))}
			}
			req.DelayLevel = level
		}
	}
	if typ == pb.MessageType_TRANSACTION {
		req.Half = true
		req.ProducerGroup = grpcProducerGroup(topic)
		if d := sp.GetOrphanedTransactionRecoveryDuration(); d != nil && d.AsDuration() >= time.Second {
			props[protocol.PropertyCheckImmunityTime] = strconv.FormatInt(int64(d.AsDuration()/time.Second), 10)
		}
	}
	return req, nil
}

// delayLevelFor is the first delay level at least d (levels count from 1).
func delayLevelFor(levels []time.Duration, d time.Duration) (int, bool) {
	for i, l := range levels {
		if l >= d {
			return i + 1, true
		}
	}
	return 0, false
}

// hashGroup is FNV-1a of a message group, for its queue.
func hashGroup(g string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(g))
	return h.Sum32()
}

// delivery is what a pop delivery adds to a message.
type delivery struct {
	handle         string
	attempt        int
	invisibleUntil time.Time
}

// outMessage is a stored message as the 5.x protocol shows it, the fields worked out once
// for both encodings of it: toProto's generated message and the hand-written wire format of
// a delivery (wire.go).
type outMessage struct {
	m         *protocol.MessageExt
	topic     string
	body      []byte
	digest    [2 * md5.Size]byte // upper-case hex
	messageID string
	msgType   pb.MessageType
	// tag, group and trace are set when hasTag, hasGroup, hasTrace.
	tag, group, trace          string
	hasTag, hasGroup, hasTrace bool
	keys                       string // the KEYS property: the keys, space-separated
	deliverAt                  int64  // Unix ms, when hasDeliverAt
	hasDeliverAt               bool
	p                          *delivery
	invisible                  time.Duration // the delivery's, when p is not nil
}

// outOf works out m's 5.x fields for topic (the consumer's topic, also for a message read
// from its retry topic), with the pop delivery's receipt handle, attempt and invisibility
// when p is not nil, and its body's MD5 (upper-case hex, as RocketMQ's proxy sends: the
// clients check it).
func (s *Server) outOf(m *protocol.MessageExt, topic string, p *delivery) outMessage {
	o := outMessage{m: m, topic: topic, p: p, msgType: pb.MessageType_NORMAL}
	body, err := m.UncompressedBody(s.b.MaxMessageSize() * 4)
	if err != nil {
		body = m.Body // sent as stored: the client's digest check marks it corrupted
	}
	o.body = body
	sum := md5.Sum(body)
	for i, c := range sum {
		o.digest[2*i], o.digest[2*i+1] = upperHex[c>>4], upperHex[c&0xF]
	}
	o.messageID = m.Properties[protocol.PropertyUniqueKey]
	if o.messageID == "" {
		o.messageID = protocol.OffsetMsgID(m.StoreHost, m.CommitLogOffset)
	}
	if t, found := m.Properties[protocol.PropertyTags]; found && t != "" {
		o.tag, o.hasTag = t, true
	}
	o.keys = m.Properties[protocol.PropertyKeys]
	if g := m.Properties[propShardingKey]; g != "" {
		o.group, o.hasGroup = g, true
		o.msgType = pb.MessageType_FIFO
	}
	if tc := m.Properties[propTraceContext]; tc != "" {
		o.trace, o.hasTrace = tc, true
	}
	if v, found := m.Properties[propDeliverAt]; found {
		if at, err := strconv.ParseInt(v, 10, 64); err == nil {
			o.deliverAt, o.hasDeliverAt = at, true
			o.msgType = pb.MessageType_DELAY
		}
	}
	if m.Properties[protocol.PropertyTransactionPrepared] == "true" || m.SysFlag&protocol.MsgTransactionMask == protocol.MsgTransactionCommit {
		o.msgType = pb.MessageType_TRANSACTION
	}
	if p != nil {
		o.invisible = time.Until(p.invisibleUntil).Round(time.Millisecond)
	}
	return o
}

const upperHex = "0123456789ABCDEF"

// toProto maps a stored message onto a 5.x message (outOf says which fields).
func (s *Server) toProto(m *protocol.MessageExt, topic string, p *delivery) *pb.Message {
	o := s.outOf(m, topic, p)
	return o.proto()
}

// proto is o as the generated message.
func (o *outMessage) proto() *pb.Message {
	m := o.m
	sp := &pb.SystemProperties{
		MessageId:      o.messageID,
		BodyDigest:     &pb.Digest{Type: pb.DigestType_MD5, Checksum: string(o.digest[:])},
		BodyEncoding:   pb.Encoding_IDENTITY,
		MessageType:    o.msgType,
		BornTimestamp:  timestamppb.New(time.UnixMilli(m.BornTimestamp)),
		BornHost:       m.BornHost.Addr().String(),
		StoreTimestamp: timestamppb.New(time.UnixMilli(m.StoreTimestamp)),
		StoreHost:      m.StoreHost.String(),
		QueueId:        m.QueueID,
	}
	off := m.QueueOffset
	sp.QueueOffset = &off
	if o.hasTag {
		t := o.tag
		sp.Tag = &t
	}
	sp.Keys = strings.Fields(o.keys)
	if o.hasGroup {
		g := o.group
		sp.MessageGroup = &g
	}
	if o.hasTrace {
		tc := o.trace
		sp.TraceContext = &tc
	}
	if o.hasDeliverAt {
		sp.DeliveryTimestamp = timestamppb.New(time.UnixMilli(o.deliverAt))
	}
	if o.p != nil {
		h := o.p.handle
		sp.ReceiptHandle = &h
		attempt := int32(o.p.attempt)
		sp.DeliveryAttempt = &attempt
		sp.InvisibleDuration = durationpb.New(o.invisible)
	}
	user := make(map[string]string, len(m.Properties))
	for k, v := range m.Properties {
		if !systemKeys[k] {
			user[k] = v
		}
	}
	return &pb.Message{Topic: &pb.Resource{Name: o.topic}, UserProperties: user, SystemProperties: sp, Body: o.body}
}
