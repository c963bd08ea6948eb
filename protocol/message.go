package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"net/netip"
	"slices"
	"strings"
)

// Stored message magic codes and the blank-tail marker of a commit-log segment.
const (
	MagicV1    = 0xDAA320A7
	MagicV2    = 0xDAA320AB
	MagicBlank = 0xCBD43194
)

// Well-known property keys.
const (
	PropertyTags           = "TAGS"
	PropertyKeys           = "KEYS"
	PropertyUniqueKey      = "UNIQ_KEY"
	PropertyWaitStoreOK    = "WAIT"
	PropertyDelayLevel     = "DELAY"
	PropertyRetryTopic     = "RETRY_TOPIC"
	PropertyReconsumeTimes = "RECONSUME_TIME"
	PropertyMaxReconsume   = "MAX_RECONSUME_TIMES"
	PropertyOriginMsgID    = "ORIGIN_MESSAGE_ID"
	PropertyRealTopic      = "REAL_TOPIC"
	PropertyRealQueueID    = "REAL_QID"
	// PropertyTransactionPrepared is "true" on a transactional (half) message.
	PropertyTransactionPrepared = "TRAN_MSG"
)

// Property separators: key NameValueSeparator value PropertySeparator, repeated.
const (
	NameValueSeparator = '\x01'
	PropertySeparator  = '\x02'
)

// Field positions in the v1 stored layout that do not depend on the host address widths.
const (
	StoredTotalSizeAt      = 0
	StoredMagicAt          = 4
	StoredBodyCRCAt        = 8
	StoredQueueIDAt        = 12
	StoredFlagAt           = 16
	StoredQueueOffsetAt    = 20
	StoredPhysicalOffsetAt = 28
	StoredSysFlagAt        = 36
	StoredBornTimestampAt  = 40
	StoredBornHostAt       = 48
)

// Limits of the stored layout.
const (
	MaxTopicLength      = 127 // a one-byte length; RocketMQ's rule keeps it to 127
	MaxPropertiesLength = math.MaxInt16
)

// ErrMalformedMessage is wrapped by every stored-message decoding error.
var ErrMalformedMessage = errors.New("malformed message")

// Message is what a producer sends: a topic, a body, a flag and properties.
type Message struct {
	Topic      string
	Flag       int32
	Properties map[string]string
	Body       []byte
}

// Tags returns the TAGS property.
func (m *Message) Tags() string { return m.Properties[PropertyTags] }

// Keys returns the KEYS property split on spaces.
func (m *Message) Keys() []string { return strings.Fields(m.Properties[PropertyKeys]) }

// MessageExt is a stored message: a Message plus everything the broker assigned.
type MessageExt struct {
	Message
	QueueID                   int32
	StoreSize                 int32
	QueueOffset               int64
	CommitLogOffset           int64
	SysFlag                   int32
	BornTimestamp             int64 // Unix milliseconds
	BornHost                  netip.AddrPort
	StoreTimestamp            int64 // Unix milliseconds
	StoreHost                 netip.AddrPort
	BodyCRC                   uint32
	ReconsumeTimes            int32
	PreparedTransactionOffset int64

	// RawProperties, when not empty, is the encoded property block (key\x01value\x02…)
	// AppendStored and StoredSize use instead of encoding Properties, which they then ignore.
	// A broker storing what a producer sent keeps the producer's block as it came and appends
	// its own properties (SetProperty), instead of decoding it into a map and encoding the
	// map again for every message. Only DecodeStoredTo with DecodeOptions.RawProperties sets
	// it when decoding.
	RawProperties []byte
}

// BodyCRC is the checksum stored with a body: CRC-32 (IEEE), masked to 31 bits as Java's
// UtilAll.crc32 does, so that values match a Java broker's.
func BodyCRC(body []byte) uint32 { return crc32.ChecksumIEEE(body) & 0x7FFFFFFF }

func hostLen(sysFlag int32, v6 int32) int {
	if sysFlag&v6 != 0 {
		return 20
	}
	return 8
}

// StoredSize is the number of bytes m takes in the stored layout.
func (m *MessageExt) StoredSize() int {
	props := len(m.RawProperties)
	if props == 0 {
		props = propertiesLen(m.Properties)
	}
	return 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + hostLen(m.SysFlag, MsgFlagBornHostV6) + 8 +
		hostLen(m.SysFlag, MsgFlagStoreHostV6) + 4 + 8 + 4 + len(m.Body) + 1 + len(m.Topic) + 2 + props
}

// AppendStored appends m in the v1 stored layout to dst. It fills StoreSize and BodyCRC in m.
// The host address widths follow m.SysFlag's BORNHOST_V6 / STOREHOST_V6 bits, which are set
// from the addresses.
func AppendStored(dst []byte, m *MessageExt) ([]byte, error) {
	if len(m.Topic) == 0 || len(m.Topic) > MaxTopicLength {
		return dst, fmt.Errorf("encode message: topic length %d is outside 1..%d", len(m.Topic), MaxTopicLength)
	}
	m.SysFlag = setV6Flag(m.SysFlag, m.BornHost, MsgFlagBornHostV6)
	m.SysFlag = setV6Flag(m.SysFlag, m.StoreHost, MsgFlagStoreHostV6)
	start := len(dst)
	size := m.StoredSize()
	if size > MaxFrameSize {
		return dst, fmt.Errorf("encode message to %q: %d bytes exceeds %d", m.Topic, size, MaxFrameSize)
	}
	m.StoreSize = int32(size)
	m.BodyCRC = BodyCRC(m.Body)
	dst = slices.Grow(dst, size)
	dst = binary.BigEndian.AppendUint32(dst, uint32(size))
	dst = binary.BigEndian.AppendUint32(dst, MagicV1)
	dst = binary.BigEndian.AppendUint32(dst, m.BodyCRC)
	dst = binary.BigEndian.AppendUint32(dst, uint32(m.QueueID))
	dst = binary.BigEndian.AppendUint32(dst, uint32(m.Flag))
	dst = binary.BigEndian.AppendUint64(dst, uint64(m.QueueOffset))
	dst = binary.BigEndian.AppendUint64(dst, uint64(m.CommitLogOffset))
	dst = binary.BigEndian.AppendUint32(dst, uint32(m.SysFlag))
	dst = binary.BigEndian.AppendUint64(dst, uint64(m.BornTimestamp))
	dst = appendHost(dst, m.BornHost)
	dst = binary.BigEndian.AppendUint64(dst, uint64(m.StoreTimestamp))
	dst = appendHost(dst, m.StoreHost)
	dst = binary.BigEndian.AppendUint32(dst, uint32(m.ReconsumeTimes))
	dst = binary.BigEndian.AppendUint64(dst, uint64(m.PreparedTransactionOffset))
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(m.Body)))
	dst = append(dst, m.Body...)
	dst = append(dst, byte(len(m.Topic)))
	dst = append(dst, m.Topic...)
	propsAt := len(dst)
	dst = append(dst, 0, 0)
	if len(m.RawProperties) > 0 {
		dst = append(dst, m.RawProperties...)
	} else {
		dst = AppendProperties(dst, m.Properties)
	}
	n := len(dst) - propsAt - 2
	if n > MaxPropertiesLength {
		return dst[:start], fmt.Errorf("encode message to %q: properties of %d bytes exceed %d", m.Topic, n, MaxPropertiesLength)
	}
	binary.BigEndian.PutUint16(dst[propsAt:], uint16(n))
	return dst, nil
}

func setV6Flag(sysFlag int32, ap netip.AddrPort, bit int32) int32 {
	if ap.Addr().Is6() && !ap.Addr().Is4In6() {
		return sysFlag | bit
	}
	return sysFlag &^ bit
}

func appendHost(dst []byte, ap netip.AddrPort) []byte {
	a := ap.Addr().Unmap()
	switch {
	case a.Is4():
		b := a.As4()
		dst = append(dst, b[:]...)
	case a.Is6():
		b := a.As16()
		dst = append(dst, b[:]...)
	default:
		dst = append(dst, 0, 0, 0, 0)
	}
	return binary.BigEndian.AppendUint32(dst, uint32(ap.Port()))
}

// StoreTimestampAt is the position of STORETIMESTAMP in an encoded message with this sysFlag.
func StoreTimestampAt(sysFlag int32) int {
	return StoredBornHostAt + hostLen(sysFlag, MsgFlagBornHostV6)
}

// PatchStored rewrites, in an already encoded message, the fields a store assigns at append
// time. It lets a store encode outside its append lock and stamp positions inside it.
//
// b must start with a message AppendStored produced; like binary.BigEndian.PutUint64, it
// panics when b is too short.
func PatchStored(b []byte, queueOffset, physicalOffset, storeTimestamp int64) {
	binary.BigEndian.PutUint64(b[StoredQueueOffsetAt:], uint64(queueOffset))
	binary.BigEndian.PutUint64(b[StoredPhysicalOffsetAt:], uint64(physicalOffset))
	sysFlag := int32(binary.BigEndian.Uint32(b[StoredSysFlagAt:]))
	binary.BigEndian.PutUint64(b[StoreTimestampAt(sysFlag):], uint64(storeTimestamp))
}

// DecodeStored decodes the first stored message in b and returns it with its size. It checks
// the magic code, that TOTALSIZE agrees with the fields, and the body CRC. Body aliases b; the
// topic and properties are copied. A compressed body is returned as stored (see
// MessageExt.UncompressedBody).
func DecodeStored(b []byte) (*MessageExt, int, error) {
	m := new(MessageExt)
	n, err := DecodeStoredTo(m, b, DecodeOptions{VerifyCRC: true})
	if err != nil {
		return nil, 0, err
	}
	return m, n, nil
}

// DecodeOptions tune DecodeStoredTo for a reader of many messages, such as a consumer
// decoding a pull.
type DecodeOptions struct {
	// VerifyCRC checks the body against its stored CRC. Without it the CRC is read but not
	// checked; the layout checks (magic code, TOTALSIZE against the fields) apply regardless.
	VerifyCRC bool
	// RawProperties leaves Properties nil and sets RawProperties to the property block,
	// aliasing b, for a reader that decodes the properties later or never. The block is
	// still checked as DecodeProperties would check it.
	RawProperties bool
	// Topic, when the message's topic has the same bytes, is used as its Topic instead of a
	// copy: the messages of a pull share their topic.
	Topic string
}

// DecodeStoredTo decodes the first stored message in b into m, overwriting all of m, and
// returns its size: DecodeStored without an allocation of its own, for a caller that decodes
// many messages and keeps fields, not MessageExts. On error m is left in an unspecified state.
func DecodeStoredTo(m *MessageExt, b []byte, o DecodeOptions) (int, error) {
	d := decoder{b: b}
	total := d.i32("TOTALSIZE")
	magic := d.u32("MAGICCODE")
	if d.err != nil {
		return 0, d.err
	}
	if total < 4 || int(total) > len(b) {
		return 0, fmt.Errorf("%w: TOTALSIZE %d but %d bytes present", ErrMalformedMessage, total, len(b))
	}
	switch magic {
	case MagicV1:
	case MagicV2:
		return 0, fmt.Errorf("%w: v2 magic code 0x%08X is not supported", ErrMalformedMessage, magic)
	default:
		return 0, fmt.Errorf("%w: bad magic code 0x%08X", ErrMalformedMessage, magic)
	}
	d.b = b[:total]
	*m = MessageExt{StoreSize: total}
	m.BodyCRC = d.u32("BODYCRC")
	m.QueueID = d.i32("QUEUEID")
	m.Flag = d.i32("FLAG")
	m.QueueOffset = d.i64("QUEUEOFFSET")
	m.CommitLogOffset = d.i64("PHYSICALOFFSET")
	m.SysFlag = d.i32("SYSFLAG")
	m.BornTimestamp = d.i64("BORNTIMESTAMP")
	m.BornHost = d.host(m.SysFlag&MsgFlagBornHostV6 != 0, "BORNHOST", "BORNHOST port")
	m.StoreTimestamp = d.i64("STORETIMESTAMP")
	m.StoreHost = d.host(m.SysFlag&MsgFlagStoreHostV6 != 0, "STOREHOST", "STOREHOST port")
	m.ReconsumeTimes = d.i32("RECONSUMETIMES")
	m.PreparedTransactionOffset = d.i64("PREPARED_TX_OFFSET")
	bodyLen := d.i32("BODYLEN")
	m.Body = d.bytes(int(bodyLen), "BODY")
	topicLen := d.u8("TOPICLEN")
	topicAt := d.off
	d.bytes(int(topicLen), "TOPIC")
	propLen := d.u16("PROPLEN")
	d.bytes(int(propLen), "PROPERTIES")
	if d.err != nil {
		return 0, d.err
	}
	if d.off != int(total) {
		return 0, fmt.Errorf("%w: TOTALSIZE %d disagrees with the fields, which end at %d", ErrMalformedMessage, total, d.off)
	}
	if o.VerifyCRC {
		if crc := BodyCRC(m.Body); crc != m.BodyCRC {
			return 0, fmt.Errorf("%w: body CRC 0x%08X, stored 0x%08X (queue offset %d, physical offset %d)", ErrMalformedMessage, crc, m.BodyCRC, m.QueueOffset, m.CommitLogOffset)
		}
	}
	if o.RawProperties {
		topic := b[topicAt : topicAt+int(topicLen)]
		if string(topic) == o.Topic {
			m.Topic = o.Topic
		} else {
			m.Topic = string(topic)
		}
		m.RawProperties = b[topicAt+int(topicLen)+2 : total : total]
		if err := checkPropertyBytes(m.RawProperties); err != nil {
			return 0, err
		}
		return int(total), nil
	}
	// Topic and properties are adjacent: one string holds both.
	tail := string(b[topicAt:total])
	m.Topic = tail[:topicLen]
	var err error
	if m.Properties, err = decodeProperties(tail[int(topicLen)+2:]); err != nil {
		return 0, err
	}
	return int(total), nil
}

// DecodeStoredAll decodes every message of a pull response body or a stretch of commit log.
func DecodeStoredAll(b []byte) ([]*MessageExt, error) {
	var out []*MessageExt
	for len(b) > 0 {
		m, n, err := DecodeStored(b)
		if err != nil {
			return out, fmt.Errorf("message %d: %w", len(out), err)
		}
		out = append(out, m)
		b = b[n:]
	}
	return out, nil
}

// AppendProperties appends props in the key\x01value\x02 form, keys sorted so the encoding is
// deterministic.
func AppendProperties(dst []byte, props map[string]string) []byte {
	if len(props) == 0 {
		return dst
	}
	var stack [16]string
	for _, k := range sortedKeys(props, stack[:0]) {
		dst = append(dst, k...)
		dst = append(dst, NameValueSeparator)
		dst = append(dst, props[k]...)
		dst = append(dst, PropertySeparator)
	}
	return dst
}

func propertiesLen(props map[string]string) int {
	n := 0
	for k, v := range props {
		n += len(k) + len(v) + 2
	}
	return n
}

// FindProperty returns the value of key in a raw property block (key\x01value\x02…, as
// stored), without decoding the block.
func FindProperty(props []byte, key string) ([]byte, bool) {
	for len(props) > 0 {
		pair := props
		if i := bytes.IndexByte(props, PropertySeparator); i >= 0 {
			pair, props = props[:i], props[i+1:]
		} else {
			props = nil
		}
		if len(pair) > len(key) && pair[len(key)] == NameValueSeparator && string(pair[:len(key)]) == key {
			return pair[len(key)+1:], true
		}
	}
	return nil, false
}

// PropertyIn returns the value of key in a raw property block, as DecodeProperties would
// read it: the last of duplicate keys wins, empty pairs are skipped. (FindProperty returns the
// first.)
func PropertyIn[P ~string | ~[]byte](props P, key string) (P, bool) {
	var val P
	found := false
	for len(props) > 0 {
		pair, rest := cutPair(props)
		props = rest
		if isPairOf(pair, key) {
			val, found = pair[len(key)+1:], true
		}
	}
	return val, found
}

// CheckProperties reports the error DecodeProperties would return for props (a pair without
// its name/value separator), without building the map.
func CheckProperties[P ~string | ~[]byte](props P) error {
	for len(props) > 0 {
		pair, rest := cutPair(props)
		props = rest
		if len(pair) > 0 && indexByte(pair, NameValueSeparator) < 0 {
			return fmt.Errorf("%w: property %q has no name/value separator", ErrMalformedMessage, truncateForError(string(pair)))
		}
	}
	return nil
}

// checkPropertyBytes is CheckProperties for a []byte block, with bytes.IndexByte's
// vectorised search instead of the generic byte loop: it runs for every pulled message.
func checkPropertyBytes(props []byte) error {
	for len(props) > 0 {
		pair := props
		if i := bytes.IndexByte(props, PropertySeparator); i >= 0 {
			pair, props = props[:i], props[i+1:]
		} else {
			props = nil
		}
		if len(pair) > 0 && bytes.IndexByte(pair, NameValueSeparator) < 0 {
			return fmt.Errorf("%w: property %q has no name/value separator", ErrMalformedMessage, truncateForError(string(pair)))
		}
	}
	return nil
}

// AppendSetProperty appends to dst the raw property block props with key set to value: every
// pair of key is left out and key\x01value\x02 appended; the other pairs keep their bytes and
// order (the order of properties carries no meaning: RocketMQ's own broker writes them in hash
// order). A block without the trailing separator some clients omit gets it; empty pairs are
// kept, decoders skip them.
func AppendSetProperty[P ~string | ~[]byte](dst []byte, props P, key, value string) []byte {
	if _, ok := PropertyIn(props, key); !ok {
		dst = append(dst, props...)
		if len(props) > 0 && props[len(props)-1] != PropertySeparator {
			dst = append(dst, PropertySeparator)
		}
	} else {
		for len(props) > 0 {
			pair, rest := cutPair(props)
			props = rest
			if isPairOf(pair, key) {
				continue
			}
			dst = append(dst, pair...)
			dst = append(dst, PropertySeparator)
		}
	}
	dst = append(dst, key...)
	dst = append(dst, NameValueSeparator)
	dst = append(dst, value...)
	return append(dst, PropertySeparator)
}

// cutPair splits props at its first PropertySeparator.
func cutPair[P ~string | ~[]byte](props P) (pair, rest P) {
	if i := indexByte(props, PropertySeparator); i >= 0 {
		return props[:i], props[i+1:]
	}
	return props, props[len(props):]
}

func isPairOf[P ~string | ~[]byte](pair P, key string) bool {
	return len(pair) > len(key) && pair[len(key)] == NameValueSeparator && string(pair[:len(key)]) == key
}

func indexByte[P ~string | ~[]byte](s P, c byte) int {
	// The vectorised searches for the two shapes every caller uses (a property block is
	// scanned several times per send); the byte loop for named types.
	switch v := any(s).(type) {
	case string:
		return strings.IndexByte(v, c)
	case []byte:
		return bytes.IndexByte(v, c)
	}
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// EncodeProperties is AppendProperties to a new slice, as a string.
func EncodeProperties(props map[string]string) string {
	return string(AppendProperties(nil, props))
}

// DecodeProperties parses key\x01value\x02 pairs. A trailing pair without its \x02 is
// accepted (some clients omit the last separator); a pair without \x01 is an error.
// A string block is not copied: the keys and values share its memory.
func DecodeProperties[P ~string | ~[]byte](b P) (map[string]string, error) {
	return decodeProperties(string(b))
}

// decodeProperties parses properties out of s; keys and values share s's memory, so a
// message's properties cost one string allocation and the map.
func decodeProperties(s string) (map[string]string, error) {
	props := make(map[string]string, strings.Count(s, string(PropertySeparator))+1)
	for len(s) > 0 {
		pair, rest, _ := strings.Cut(s, string(PropertySeparator))
		s = rest
		if len(pair) == 0 {
			continue
		}
		k, v, ok := strings.Cut(pair, string(NameValueSeparator))
		if !ok {
			return nil, fmt.Errorf("%w: property %q has no name/value separator", ErrMalformedMessage, truncateForError(pair))
		}
		props[k] = v
	}
	return props, nil
}

type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) need(n int, what string) bool {
	if d.err != nil {
		return false
	}
	if n < 0 || n > len(d.b)-d.off {
		d.err = fmt.Errorf("%w: truncated at %s (needs %d bytes at %d of %d)", ErrMalformedMessage, what, n, d.off, len(d.b))
		return false
	}
	return true
}

func (d *decoder) u8(what string) uint8 {
	if !d.need(1, what) {
		return 0
	}
	v := d.b[d.off]
	d.off++
	return v
}

func (d *decoder) u16(what string) uint16 {
	if !d.need(2, what) {
		return 0
	}
	v := binary.BigEndian.Uint16(d.b[d.off:])
	d.off += 2
	return v
}

func (d *decoder) u32(what string) uint32 {
	if !d.need(4, what) {
		return 0
	}
	v := binary.BigEndian.Uint32(d.b[d.off:])
	d.off += 4
	return v
}

func (d *decoder) i32(what string) int32 { return int32(d.u32(what)) }

func (d *decoder) i64(what string) int64 {
	if !d.need(8, what) {
		return 0
	}
	v := binary.BigEndian.Uint64(d.b[d.off:])
	d.off += 8
	return int64(v)
}

func (d *decoder) bytes(n int, what string) []byte {
	if !d.need(n, what) {
		return nil
	}
	v := d.b[d.off : d.off+n : d.off+n]
	d.off += n
	return v
}

// host decodes an address and port; what and whatPort name them in errors (two constants:
// a name made here, what + " port", was two allocations per decoded message).
func (d *decoder) host(v6 bool, what, whatPort string) netip.AddrPort {
	var a netip.Addr
	if v6 {
		b := d.bytes(16, what)
		if b == nil {
			return netip.AddrPort{}
		}
		a = netip.AddrFrom16([16]byte(b))
	} else {
		b := d.bytes(4, what)
		if b == nil {
			return netip.AddrPort{}
		}
		a = netip.AddrFrom4([4]byte(b))
	}
	port := d.u32(whatPort)
	if port > 0xFFFF && d.err == nil {
		d.err = fmt.Errorf("%w: %s %d is out of range", ErrMalformedMessage, whatPort, port)
	}
	return netip.AddrPortFrom(a, uint16(port))
}
