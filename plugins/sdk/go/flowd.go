package flowd

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

	labels []Label // the array Members' labels share, reused from call to call
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
