package consumer

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// MessageQueue is one queue of a topic on one broker.
type MessageQueue = protocol.MessageQueue

// Message is a message as Poll returns it.
type Message struct {
	// Topic is the topic the message was read from.
	Topic string
	// Queue is the queue it was read from.
	Queue MessageQueue
	// QueueOffset is its position in the queue.
	QueueOffset int64
	// CommitLogOffset is its position in the broker's commit log.
	CommitLogOffset int64
	// MsgID is the producer-assigned unique id (the UNIQ_KEY property), or OffsetMsgID when the
	// producer set none.
	MsgID string
	// OffsetMsgID is the broker-assigned id: store host and commit-log offset.
	OffsetMsgID string
	// Tags is the TAGS property.
	Tags string
	// Keys is the KEYS property, split on spaces.
	Keys []string
	// Body is the message body, decompressed if the producer compressed it.
	Body []byte
	// Flag is the producer's flag, opaque to the broker.
	Flag int32
	// BornTimestamp is when the producer made the message.
	BornTimestamp time.Time
	// StoreTimestamp is when the broker stored it.
	StoreTimestamp time.Time
	// BornHost is the producer's address as the broker saw it.
	BornHost string
	// ReconsumeTimes counts earlier deliveries of a retried message.
	ReconsumeTimes int32

	props *lazyProperties
}

// lazyProperties is a message's property block as it came (key\x01value\x02…), decoded
// into a map on first use. Most consumers read no property beyond the ones Message already
// has as fields (Tags, Keys, MsgID), and building a map for every message was the largest
// cost of decoding a pull after the body CRC.
type lazyProperties struct {
	once sync.Once
	raw  string
	m    map[string]string
}

// Properties returns every property, the well-known ones included. The map is built on the
// first call, from the properties the message came with, and the same map is returned
// afterwards (so changes to it are seen by later calls, as with a field); concurrent first
// calls are safe.
func (m *Message) Properties() map[string]string {
	p := m.props
	if p == nil {
		return nil
	}
	p.once.Do(func() {
		// The block was checked when the pull was decoded: this cannot fail.
		p.m, _ = protocol.DecodeProperties(p.raw)
	})
	return p.m
}

// Property returns the named property, or "".
func (m *Message) Property(name string) string { return m.Properties()[name] }

func (m *Message) String() string {
	return fmt.Sprintf("Message{topic=%s queue=%d offset=%d id=%s tags=%q body=%dB}", m.Topic, m.Queue.QueueID, m.QueueOffset, m.MsgID, m.Tags, len(m.Body))
}

// converter turns the messages of one pull into Messages. It remembers the last born host
// it formatted: the messages of a pull mostly come from a few producers, and formatting the
// address was an allocation per message.
type converter struct {
	dec      protocol.Decompressor
	host     netip.AddrPort
	hostText string
}

// convert fills m from a decoded stored message, inflating a compressed body; what comes
// from its property block and its offset message id is set afterwards (setWellKnown), from
// text shared with the other messages of its pull.
func (cv *converter) convert(m *Message, mq MessageQueue, ext *protocol.MessageExt, props *lazyProperties, limit int) error {
	body := ext.Body
	if ext.SysFlag&protocol.MsgFlagCompressed != 0 {
		var err error
		if body, err = cv.dec.Decompress(nil, ext.Body, limit); err != nil {
			return fmt.Errorf("message at offset %d of %s: %w", ext.QueueOffset, mq, err)
		}
	}
	if cv.hostText == "" || ext.BornHost != cv.host {
		cv.host, cv.hostText = ext.BornHost, ext.BornHost.String()
	}
	*m = Message{
		Topic:           ext.Topic,
		Queue:           mq,
		QueueOffset:     ext.QueueOffset,
		CommitLogOffset: ext.CommitLogOffset,
		props:           props,
		Body:            body,
		Flag:            ext.Flag,
		BornTimestamp:   time.UnixMilli(ext.BornTimestamp),
		StoreTimestamp:  time.UnixMilli(ext.StoreTimestamp),
		BornHost:        cv.hostText,
		ReconsumeTimes:  ext.ReconsumeTimes,
	}
	return nil
}

// setWellKnown sets m's OffsetMsgID to offsetID and the fields read from its property block
// (m.props.raw, set): Tags, Keys, MsgID, and the topic of a message sent back.
func setWellKnown(m *Message, offsetID string) {
	wk := readWellKnown(m.props.raw)
	m.OffsetMsgID = offsetID
	m.Tags = wk.tags
	m.Keys = strings.Fields(wk.keys)
	if isRetryTopic(m.Topic) && wk.retryTopic != "" {
		// A message sent back: the application sees the topic it was first sent to.
		m.Topic = wk.retryTopic
	}
	m.MsgID = wk.uniqKey
	if m.MsgID == "" {
		m.MsgID = m.OffsetMsgID
	}
}

// wellKnown are the properties a Message has as fields.
type wellKnown[S ~string | ~[]byte] struct {
	tags, keys, uniqKey, retryTopic S
}

// readWellKnown reads the well-known properties from a property block in one pass, as a
// decoded map would hold them: the last of duplicate keys wins. It reads a block as bytes
// too, so that a pull's tag check makes no string of it.
func readWellKnown[S ~string | ~[]byte](raw S) wellKnown[S] {
	var wk wellKnown[S]
	for len(raw) > 0 {
		pair := raw
		if i := indexByte(raw, protocol.PropertySeparator); i >= 0 {
			pair, raw = raw[:i], raw[i+1:]
		} else {
			raw = raw[len(raw):]
		}
		i := indexByte(pair, protocol.NameValueSeparator)
		if i < 0 {
			continue
		}
		k, v := pair[:i], pair[i+1:]
		switch string(k) { // no allocation: the conversion is only compared
		case protocol.PropertyTags:
			wk.tags = v
		case protocol.PropertyKeys:
			wk.keys = v
		case protocol.PropertyUniqueKey:
			wk.uniqKey = v
		case protocol.PropertyRetryTopic:
			wk.retryTopic = v
		}
	}
	return wk
}

func indexByte[S ~string | ~[]byte](s S, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// Selector chooses which messages of a topic a subscription takes. The broker filters by it;
// for tag selectors the consumer checks again, since the broker compares only tag hashes.
//
// TagSelector, SQLSelector and WasmSelector are built in; any other expression type the
// broker knows implements the same interface with its own Type.
type Selector interface {
	// Type is the expression type sent to the broker: "TAG", "SQL92", ….
	Type() string
	// Expression is the filter expression.
	Expression() string
}

// TagSelector selects messages by tag: "*" or "" takes every message, "a || b" takes the
// messages tagged a or b.
type TagSelector string

// Type is protocol.ExpressionTag.
func (TagSelector) Type() string { return protocol.ExpressionTag }

// Expression is the tag expression.
func (s TagSelector) Expression() string { return string(s) }

// SQLSelector selects messages by a SQL92 expression over their properties (RocketMQ's
// MessageSelector.bySql), e.g. "region IN ('eu','us') AND amount > 100". TAGS and KEYS are
// properties like any other. The broker evaluates it; a broker that does not support it, or
// an expression that does not parse, fails the pull with SUBSCRIPTION_PARSE_FAILED and a
// remark pointing at the position.
type SQLSelector string

// Type is protocol.ExpressionSQL92.
func (SQLSelector) Type() string { return protocol.ExpressionSQL92 }

// Expression is the SQL92 expression.
func (s SQLSelector) Expression() string { return string(s) }

// WasmSelector selects messages with a Wasm filter plugin deployed on a flowd broker:
// "name" runs the plugin's active version (activating another version takes over at once),
// "name@version" pins one. The broker runs the filter; a broker without the plugin, or a
// RocketMQ broker, fails the pull with SUBSCRIPTION_PARSE_FAILED.
type WasmSelector string

// Type is protocol.ExpressionWasm.
func (WasmSelector) Type() string { return protocol.ExpressionWasm }

// Expression is the plugin name, with an optional @version.
func (s WasmSelector) Expression() string { return string(s) }

// subscription is one topic subscription.
type subscription struct {
	topic    string
	selector Selector
	tags     []string // TAG selectors only; nil takes all
	version  int64
}

func newSubscription(topic string, sel Selector) *subscription {
	s := &subscription{topic: topic, selector: sel, version: time.Now().UnixMilli()}
	if sel.Type() == protocol.ExpressionTag {
		s.tags = protocol.ParseTagExpression(sel.Expression())
	}
	return s
}

// expression is what the heartbeat and pulls carry: "*" for take-all tags.
func (s *subscription) expression() string {
	if s.selector.Type() == protocol.ExpressionTag && s.tags == nil {
		return "*"
	}
	return s.selector.Expression()
}

// data is the heartbeat form.
func (s *subscription) data() protocol.SubscriptionData {
	d := protocol.SubscriptionData{
		Topic:          s.topic,
		SubString:      s.expression(),
		TagsSet:        []string{},
		CodeSet:        protocol.CodeSet{},
		SubVersion:     s.version,
		ExpressionType: s.selector.Type(),
	}
	for _, t := range s.tags {
		d.TagsSet = append(d.TagsSet, t)
		d.CodeSet = append(d.CodeSet, protocol.TagsCode(t))
	}
	return d
}

// matchBytes re-checks a message's tag, read from its property block as bytes, against the
// subscription: the broker matched hash codes only, and two tags can share one.
func (s *subscription) matchBytes(tags []byte) bool {
	if s == nil || s.tags == nil {
		return true
	}
	for _, t := range s.tags {
		if string(tags) == t {
			return true
		}
	}
	return false
}
