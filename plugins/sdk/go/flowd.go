package flowd

import (
	"encoding/binary"
)

// ABIVersion is the plugin ABI this SDK implements.
const ABIVersion = 1

// Code is an ABI error code. An allocator returning a Code as its error makes the call
// return that code; any other error returns CodeGeneric.
type Code int32

// Error codes of ABI version 1.
const (
	CodeGeneric     Code = -1
	CodeInput       Code = -2
	CodeNoMemory    Code = -3
	CodeParams      Code = -4
	CodeUnsupported Code = -5
)

func (c Code) Error() string {
	switch c {
	case CodeInput:
		return "flowd: bad input"
	case CodeNoMemory:
		return "flowd: out of memory"
	case CodeParams:
		return "flowd: bad parameters"
	case CodeUnsupported:
		return "flowd: unsupported"
	}
	return "flowd: plugin error"
}

// Message is one message record. Its byte slices are views into the SDK's input buffer,
// valid during the call only: copy what must outlive it.
type Message struct {
	QueueID        int32
	QueueOffset    int64
	StoreTimestamp int64 // milliseconds since the Unix epoch
	Topic          []byte
	Tags           []byte
	Keys           []byte // keys separated by one space
	Properties     []byte // RocketMQ encoding: key 0x01 value 0x02, repeated
	Body           []byte // empty for a filter unless its manifest sets wants_body
}

// Property returns the value of the property key, without allocating.
func (m *Message) Property(key string) ([]byte, bool) {
	p := m.Properties
	for len(p) > 0 {
		k := indexByte(p, 1)
		if k < 0 {
			return nil, false
		}
		rest := p[k+1:]
		v := indexByte(rest, 2)
		if v < 0 {
			v = len(rest)
		}
		if string(p[:k]) == key {
			return rest[:v], true
		}
		if v == len(rest) {
			return nil, false
		}
		p = rest[v+1:]
	}
	return nil, false
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// Output is one message a transform produces. The SDK copies it as soon as the transform
// returns, so its slices may point into buffers the plugin reuses.
type Output struct {
	Tags, Keys       []byte
	Properties, Body []byte
}

// Queue is a message queue of an allocator's input.
type Queue struct {
	Topic, Broker []byte
	QueueID       int32
}

// Label is a key and value attached to a member.
type Label struct{ Key, Value []byte }

// Member is a consumer group member of an allocator's input.
type Member struct {
	ID     []byte
	Weight uint32
	Room   []byte
	Labels []Label
}

// Input is an allocator's input: the whole group. Slices are valid during the call only.
type Input struct {
	Group   []byte
	Queues  []Queue  // sorted by topic, broker, queue id
	Members []Member // sorted by id
	// Previous is the index of the member that owned each queue before (-1: none), or
	// empty when there is no previous assignment.
	Previous []int32
}

var (
	filterFn    func(Message) bool
	allocFn     func(Input) ([]int32, error)
	transformFn func(Message) []Output
	initFn      func() error

	params = map[string]string{}

	inbuf  []byte // owned by the host between flowd_alloc calls
	outbuf []byte
	msgs   []Message
	in     Input
	labels []Label
)

// RegisterFilter makes f the plugin's filter: true keeps the message.
func RegisterFilter(f func(Message) bool) { filterFn = f }

// RegisterAllocator makes f the plugin's allocator: it returns, for each queue of the input,
// the index of the member that owns it.
func RegisterAllocator(f func(Input) ([]int32, error)) { allocFn = f }

// RegisterTransform makes f the plugin's transform: it returns the messages to produce in
// place of m (none drops it).
func RegisterTransform(f func(Message) []Output) { transformFn = f }

// OnInit registers f to run after the parameters are known, once per instance; an error
// refuses the instance (a [Code] error returns that code, others CodeParams).
func OnInit(f func() error) { initFn = f }

// Param returns the manifest parameter key.
func Param(key string) (string, bool) {
	v, ok := params[key]
	return v, ok
}

// Params returns all manifest parameters. Do not modify the map.
func Params() map[string]string { return params }

// decodeMessages decodes n records into the reused msgs slice.
//
// It is written out by hand, without the reader's methods: in Go compiled to Wasm every
// call that is not inlined costs tens of nanoseconds, and a record has nine fields.
func decodeMessages(b []byte, n int32) bool {
	if n < 0 {
		return false
	}
	if cap(msgs) < int(n) {
		msgs = make([]Message, n)
	}
	msgs = msgs[:n]
	le := binary.LittleEndian
	off := 0
	for i := range msgs {
		if len(b)-off < 4 {
			return false
		}
		size := int(le.Uint32(b[off:]))
		off += 4
		if size < recordFixed || len(b)-off < size {
			return false
		}
		rec := b[off : off+size : off+size]
		off += size
		m := &msgs[i]
		m.QueueID = int32(le.Uint32(rec))
		m.QueueOffset = int64(le.Uint64(rec[4:]))
		m.StoreTimestamp = int64(le.Uint64(rec[12:]))
		p := 20
		var ok bool
		if m.Topic, p, ok = field16(rec, p); !ok {
			return false
		}
		if m.Tags, p, ok = field16(rec, p); !ok {
			return false
		}
		if m.Keys, p, ok = field16(rec, p); !ok {
			return false
		}
		if m.Properties, p, ok = field32(rec, p); !ok {
			return false
		}
		if m.Body, p, ok = field32(rec, p); !ok {
			return false
		}
	}
	return off == len(b)
}

// recordFixed is the size of a record's fixed fields after its length.
const recordFixed = 4 + 8 + 8 + 2 + 2 + 2 + 4 + 4

// field16 reads a u16-prefixed field at b[p:]; small enough to be inlined.
func field16(b []byte, p int) ([]byte, int, bool) {
	if len(b)-p < 2 {
		return nil, p, false
	}
	n := int(b[p]) | int(b[p+1])<<8
	p += 2
	if len(b)-p < n {
		return nil, p, false
	}
	return b[p : p+n : p+n], p + n, true
}

// field32 reads a u32-prefixed field at b[p:].
func field32(b []byte, p int) ([]byte, int, bool) {
	if len(b)-p < 4 {
		return nil, p, false
	}
	n := int(uint32(b[p]) | uint32(b[p+1])<<8 | uint32(b[p+2])<<16 | uint32(b[p+3])<<24)
	p += 4
	if len(b)-p < n {
		return nil, p, false
	}
	return b[p : p+n : p+n], p + n, true
}

func decodeInput(b []byte) bool {
	r := reader{b: b}
	in.Group = r.str16()
	nq := int(r.u32())
	if r.bad || nq > len(b)/8 {
		return false
	}
	if cap(in.Queues) < nq {
		in.Queues = make([]Queue, nq)
	}
	in.Queues = in.Queues[:nq]
	for i := range in.Queues {
		q := &in.Queues[i]
		q.Topic = r.str16()
		q.Broker = r.str16()
		q.QueueID = int32(r.u32())
	}
	nm := int(r.u32())
	if r.bad || nm > len(b)/12 {
		return false
	}
	if cap(in.Members) < nm {
		in.Members = make([]Member, nm)
	}
	in.Members = in.Members[:nm]
	labels = labels[:0]
	for i := range in.Members {
		m := &in.Members[i]
		m.ID = r.str16()
		m.Weight = r.u32()
		m.Room = r.str16()
		nl := int(r.u32())
		if r.bad || nl > len(b)/4 {
			return false
		}
		from := len(labels)
		for range nl {
			k := r.str16()
			v := r.str16()
			labels = append(labels, Label{Key: k, Value: v})
		}
		m.Labels = labels[from:len(labels):len(labels)]
	}
	// labels may have been reallocated while growing: point members at the final array.
	off := 0
	for i := range in.Members {
		nl := len(in.Members[i].Labels)
		in.Members[i].Labels = labels[off : off+nl : off+nl]
		off += nl
	}
	np := int(r.u32())
	if r.bad || (np != 0 && np != nq) {
		return false
	}
	if cap(in.Previous) < np {
		in.Previous = make([]int32, np)
	}
	in.Previous = in.Previous[:np]
	for k := range in.Previous {
		in.Previous[k] = int32(r.u32())
	}
	return !r.bad && r.off == len(b)
}

// reader decodes little-endian fields; bad records the first overrun.
type reader struct {
	b   []byte
	off int
	bad bool
}

func (r *reader) need(n int) bool {
	if r.bad || n < 0 || len(r.b)-r.off < n {
		r.bad = true
		return false
	}
	return true
}

func (r *reader) u32() uint32 {
	if !r.need(4) {
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b[r.off:])
	r.off += 4
	return v
}

func (r *reader) u64() uint64 {
	if !r.need(8) {
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b[r.off:])
	r.off += 8
	return v
}

func (r *reader) str16() []byte {
	if !r.need(2) {
		return nil
	}
	n := int(binary.LittleEndian.Uint16(r.b[r.off:]))
	r.off += 2
	if !r.need(n) {
		return nil
	}
	r.off += n
	return r.b[r.off-n : r.off : r.off]
}

func (r *reader) bytes32() []byte {
	n := int(r.u32())
	if !r.need(n) {
		return nil
	}
	r.off += n
	return r.b[r.off-n : r.off : r.off]
}
