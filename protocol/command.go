package protocol

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// MaxFrameSize is the largest frame flowd reads or writes: 16 MiB, RocketMQ's own limit.
const MaxFrameSize = 16 << 20

// Errors a frame decoder returns; each is wrapped with the detail of what was wrong.
//
// ErrFrameTooLarge and ErrMalformedFrame mean the frame itself is broken (its length prefix or
// header length does not add up): the stream cannot be trusted past it. ErrMalformedHeader
// (always in a *HeaderError) means the frame arrived whole but its header cannot be read: the
// next frame starts where it should, so a connection can answer and go on.
var (
	ErrFrameTooLarge    = errors.New("frame too large")
	ErrMalformedFrame   = errors.New("malformed frame")
	ErrMalformedHeader  = errors.New("malformed header")
	ErrUnknownSerialize = errors.New("unknown serialize type")
)

// HeaderError reports an intact frame whose header could not be read: invalid JSON, a header
// field of the wrong type, a binary header whose inner lengths do not add up, or an unknown
// serialize type. It wraps ErrMalformedHeader and the cause (ErrUnknownSerialize, for one).
//
// Code, Opaque and Flag are what could be read of the header anyway, so that the sender can be
// answered: OpaqueKnown reports whether Opaque is the one the sender wrote. It is false when
// the header broke off before its opaque or the opaque itself was bad; a response with a made
// up opaque could be taken as the answer to some other request.
type HeaderError struct {
	Serialize   SerializeType
	Code        int32
	Opaque      int32
	Flag        int32
	OpaqueKnown bool
	Err         error
}

func (e *HeaderError) Error() string { return e.Err.Error() }

func (e *HeaderError) Unwrap() []error { return []error{ErrMalformedHeader, e.Err} }

// IsResponse reports whether the header, as far as it was read, is a response's.
func (e *HeaderError) IsResponse() bool { return e.Flag&FlagResponse != 0 }

// IsOneway reports whether the header, as far as it was read, is a oneway request's.
func (e *HeaderError) IsOneway() bool { return e.Flag&FlagOneway != 0 }

// Command is one remoting frame: a request, a response or a oneway notification.
//
// Custom header fields travel as strings in ExtFields; the typed headers in headers.go read and
// write them.
type Command struct {
	Code      int32
	Language  LanguageCode
	Version   int16
	Opaque    int32
	Flag      int32
	Remark    string
	ExtFields map[string]string
	// Fields, when set, writes more header fields, after those of ExtFields, straight into
	// the encoded header (see FieldAppender): a sender's way to skip the map. A key must not
	// be in both. Decoding never sets it: a decoded command has all its fields in ExtFields.
	Fields FieldAppender
	Body   []byte
	// RawExt is set instead of ExtFields (then nil) on a request decoded by ReadFrameRawExt
	// whose code its caller asked for: the binary header's ext-fields block, checked whole,
	// as it arrived (a 2-byte key length, the key, a 4-byte value length, the value, and so
	// on). Ext and the typed header decoders read it without building a map, which is the
	// largest cost of decoding a send's header.
	RawExt string
	// Serialize is the header encoding the command came in with, or will go out with.
	Serialize SerializeType
}

// IsResponse reports whether the response flag is set.
func (c *Command) IsResponse() bool { return c.Flag&FlagResponse != 0 }

// IsOneway reports whether the sender expects no response.
func (c *Command) IsOneway() bool { return c.Flag&FlagOneway != 0 }

// RequestCode is the command's code read as a request code.
func (c *Command) RequestCode() RequestCode { return RequestCode(c.Code) }

// ResponseCode is the command's code read as a response code.
func (c *Command) ResponseCode() ResponseCode { return ResponseCode(c.Code) }

// NewRequest makes a request command with the given header fields (which may be nil).
func NewRequest(code RequestCode, ext map[string]string, body []byte) *Command {
	if ext == nil {
		ext = map[string]string{}
	}
	return &Command{Code: int32(code), Language: LangGo, Version: Version, ExtFields: ext, Body: body}
}

// NewResponse makes the response to req: it echoes req's opaque and serialize type.
func NewResponse(req *Command, code ResponseCode, remark string) *Command {
	c := NewResponseWith(req, code, remark, nil)
	c.ExtFields = map[string]string{}
	return c
}

// NewResponseWith is NewResponse with its header given as Fields, written straight into the
// frame, and no ExtFields map: for an answer nothing reads before it is sent.
func NewResponseWith(req *Command, code ResponseCode, remark string, h FieldAppender) *Command {
	return &Command{
		Code:      int32(code),
		Language:  LangGo,
		Version:   Version,
		Opaque:    req.Opaque,
		Flag:      FlagResponse,
		Remark:    remark,
		Fields:    h,
		Serialize: req.Serialize,
	}
}

// Version is the protocol version flowd announces (RocketMQ 4.9.x's V4_9_4).
const Version = 317

func (c *Command) String() string {
	kind := "request"
	code := RequestCode(c.Code).String()
	if c.IsResponse() {
		kind = "response"
		code = ResponseCode(c.Code).String()
	}
	return fmt.Sprintf("%s %s opaque=%d remark=%q ext=%v body=%dB", kind, code, c.Opaque, c.Remark, c.ExtFields, len(c.Body))
}

// AppendFrame appends c's whole frame, length prefix included, to dst.
func (c *Command) AppendFrame(dst []byte) ([]byte, error) {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, 0, 0, 0, 0) // length and header mark, filled in below
	var err error
	st := c.Serialize
	if st == RocketMQ && (c.Code > math.MaxInt16 || c.Code < math.MinInt16) {
		// The binary header has 16 bits for the code; RocketMQ 5's pop codes (200050 and
		// on) need more. Such a command goes out with a JSON header, which any peer reads
		// by the header mark, rather than with its code cut short as RocketMQ's own
		// encoder does.
		st = JSON
	}
	switch st {
	case JSON:
		dst, err = c.appendJSONHeader(dst)
	case RocketMQ:
		dst, err = c.appendBinaryHeader(dst)
	default:
		return dst[:start], fmt.Errorf("encode %s: %w %d", c, ErrUnknownSerialize, c.Serialize)
	}
	if err != nil {
		return dst[:start], err
	}
	headerLen := len(dst) - start - 8
	total := 4 + headerLen + len(c.Body)
	if total > MaxFrameSize {
		return dst[:start], fmt.Errorf("encode %s: frame of %d bytes (header %d) exceeds %d: %w", c, total, headerLen, MaxFrameSize, ErrFrameTooLarge)
	}
	dst = append(dst, c.Body...)
	binary.BigEndian.PutUint32(dst[start:], uint32(total))
	binary.BigEndian.PutUint32(dst[start+4:], uint32(st)<<24|uint32(headerLen))
	return dst, nil
}

func (c *Command) appendBinaryHeader(dst []byte) ([]byte, error) {
	dst = binary.BigEndian.AppendUint16(dst, uint16(c.Code))
	dst = append(dst, byte(c.Language))
	dst = binary.BigEndian.AppendUint16(dst, uint16(c.Version))
	dst = binary.BigEndian.AppendUint32(dst, uint32(c.Opaque))
	dst = binary.BigEndian.AppendUint32(dst, uint32(c.Flag))
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(c.Remark)))
	dst = append(dst, c.Remark...)
	lenAt := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	if len(c.ExtFields) > 0 {
		// Apart: a command whose header is all Fields (a send, its answer) skips the map's
		// iteration and the zeroing of the keys' buffer.
		var err error
		if dst, err = c.appendBinaryExtFields(dst); err != nil {
			return dst, err
		}
	}
	if c.Fields != nil {
		var err error
		if dst, err = c.appendFields(dst, false, len(c.ExtFields)); err != nil {
			return dst, err
		}
	}
	binary.BigEndian.PutUint32(dst[lenAt:], uint32(len(dst)-lenAt-4))
	return dst, nil
}

// appendBinaryExtFields writes ExtFields, sorted by key, in the binary layout.
func (c *Command) appendBinaryExtFields(dst []byte) ([]byte, error) {
	var stack [24]string
	for _, k := range sortedKeys(c.ExtFields, stack[:0]) {
		if len(k) > math.MaxInt16 {
			return dst, fmt.Errorf("encode binary header: ext field key of %d bytes is too long", len(k))
		}
		v := c.ExtFields[k]
		dst = binary.BigEndian.AppendUint16(dst, uint16(len(k)))
		dst = append(dst, k...)
		dst = binary.BigEndian.AppendUint32(dst, uint32(len(v)))
		dst = append(dst, v...)
	}
	return dst, nil
}

// DecodeFrame decodes one frame given without its 4-byte length prefix (so len(frame) is the
// length the prefix announced). The returned command's Body aliases frame. A frame whose
// lengths add up but whose header cannot be read gives a *HeaderError.
func DecodeFrame(frame []byte) (*Command, error) {
	return decodeFrame(frame, false, ReadOptions{})
}

// decodeFrame is DecodeFrame; with copyBody the body is copied out of frame, which may then
// be reused.
func decodeFrame(frame []byte, copyBody bool, o ReadOptions) (*Command, error) {
	if len(frame) > MaxFrameSize {
		return nil, fmt.Errorf("decode frame: %d bytes exceeds %d: %w", len(frame), MaxFrameSize, ErrFrameTooLarge)
	}
	if len(frame) < 4 {
		return nil, fmt.Errorf("decode frame: %d bytes is too short for a header mark: %w", len(frame), ErrMalformedFrame)
	}
	mark := binary.BigEndian.Uint32(frame)
	st := SerializeType(mark >> 24)
	headerLen := int(mark & 0xFFFFFF)
	if headerLen > len(frame)-4 {
		return nil, fmt.Errorf("decode frame: header length %d exceeds the %d bytes after the mark: %w", headerLen, len(frame)-4, ErrMalformedFrame)
	}
	header := frame[4 : 4+headerLen]
	var c *Command
	var err error
	switch st {
	case JSON:
		c, err = decodeJSONHeader(header)
	case RocketMQ:
		c, err = decodeBinaryHeader(header, o)
	default:
		return nil, &HeaderError{Serialize: st, Err: fmt.Errorf("decode frame: %w %d", ErrUnknownSerialize, st)}
	}
	if err != nil {
		return nil, err
	}
	c.Serialize = st
	if body := frame[4+headerLen:]; len(body) > 0 {
		if copyBody {
			body = append([]byte(nil), body...)
		}
		c.Body = body[:len(body):len(body)] // an append to it cannot run into what follows
	}
	return c, nil
}

// decodeBinaryHeader decodes a ROCKETMQ binary header; an error is a *HeaderError, which
// carries the code, opaque and flag when the fixed part is there.
func decodeBinaryHeader(b []byte, o ReadOptions) (*Command, error) {
	c, err := parseBinaryHeader(b, o.RawExt, o.RawResponses, o.Into)
	if err != nil {
		he := &HeaderError{Serialize: RocketMQ, Err: err}
		if len(b) >= 13 {
			he.Code = int32(int16(binary.BigEndian.Uint16(b)))
			he.Opaque = int32(binary.BigEndian.Uint32(b[5:]))
			he.Flag = int32(binary.BigEndian.Uint32(b[9:]))
			he.OpaqueKnown = true
		}
		return nil, he
	}
	return c, nil
}

func parseBinaryHeader(b []byte, rawExt func(RequestCode) bool, rawResponses bool, into *Command) (*Command, error) {
	const fixed = 2 + 1 + 2 + 4 + 4 + 4
	if len(b) < fixed {
		return nil, fmt.Errorf("decode binary header: %d bytes is shorter than the fixed %d", len(b), fixed)
	}
	c := into
	if c == nil {
		c = new(Command)
	}
	*c = Command{
		Code:     int32(int16(binary.BigEndian.Uint16(b))),
		Language: LanguageCode(b[2]),
		Version:  int16(binary.BigEndian.Uint16(b[3:])),
		Opaque:   int32(binary.BigEndian.Uint32(b[5:])),
		Flag:     int32(binary.BigEndian.Uint32(b[9:])),
	}
	// One string holds the remark and every key and value: a header costs one allocation
	// for its strings rather than two per field.
	whole := string(b[13:])
	r := b[13:]
	remark, r, err := takeBytes32(r, "remark")
	if err != nil {
		return nil, err
	}
	c.Remark = substringOf(whole, b[13:], remark)
	if c.Flag&FlagResponse != 0 && rawResponses || rawExt != nil && c.Flag&FlagResponse == 0 && rawExt(RequestCode(c.Code)) {
		if err := parseRawExt(c, whole, b[13:], r); err != nil {
			return nil, err
		}
		return c, nil
	}
	var ext map[string]string
	if len(r) > 4 {
		// Sized to the fields there are: a map of up to 8 costs one small allocation, one
		// made for 16 several.
		ext = make(map[string]string, countBinaryFields(r[4:]))
	} else {
		ext = make(map[string]string)
	}
	if len(r) > 0 {
		extBytes, rest, err := takeBytes32(r, "ext fields")
		if err != nil {
			return nil, err
		}
		if len(rest) != 0 {
			return nil, fmt.Errorf("decode binary header: %d bytes after the ext fields", len(rest))
		}
		for len(extBytes) > 0 {
			if len(extBytes) < 2 {
				return nil, errors.New("decode binary header: truncated ext field key length")
			}
			kl := int(binary.BigEndian.Uint16(extBytes))
			extBytes = extBytes[2:]
			if kl > len(extBytes) {
				return nil, fmt.Errorf("decode binary header: ext field key length %d exceeds the %d bytes left", kl, len(extBytes))
			}
			k := substringOf(whole, b[13:], extBytes[:kl])
			var v []byte
			v, extBytes, err = takeBytes32(extBytes[kl:], "ext field value")
			if err != nil {
				return nil, fmt.Errorf("%w (key %q)", err, truncateForError(k))
			}
			ext[k] = substringOf(whole, b[13:], v)
		}
	}
	c.ExtFields = ext
	return c, nil
}

// parseRawExt checks the ext-fields block that follows the remark (r, within base, whose
// string is whole) and sets it as c.RawExt, as parseBinaryHeader would have built the map.
func parseRawExt(c *Command, whole string, base, r []byte) error {
	if len(r) == 0 {
		return nil
	}
	extBytes, rest, err := takeBytes32(r, "ext fields")
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("decode binary header: %d bytes after the ext fields", len(rest))
	}
	for b := extBytes; len(b) > 0; {
		if len(b) < 2 {
			return errors.New("decode binary header: truncated ext field key length")
		}
		kl := int(binary.BigEndian.Uint16(b))
		b = b[2:]
		if kl > len(b) {
			return fmt.Errorf("decode binary header: ext field key length %d exceeds the %d bytes left", kl, len(b))
		}
		k := b[:kl]
		if _, b, err = takeBytes32(b[kl:], "ext field value"); err != nil {
			return fmt.Errorf("%w (key %q)", err, truncateForError(string(k)))
		}
	}
	c.RawExt = substringOf(whole, base, extBytes)
	return nil
}

// nextRawField splits the first field off a RawExt block checked by parseRawExt.
func nextRawField(raw string) (key, value, rest string) {
	kl := int(raw[0])<<8 | int(raw[1])
	key, raw = raw[2:2+kl], raw[2+kl:]
	vl := int(raw[0])<<24 | int(raw[1])<<16 | int(raw[2])<<8 | int(raw[3])
	return key, raw[4 : 4+vl], raw[4+vl:]
}

// Ext returns the header field key, from ExtFields or, when the map was not built, RawExt.
func (c *Command) Ext(key string) string {
	if c.ExtFields != nil || c.RawExt == "" {
		return c.ExtFields[key]
	}
	var found string
	for raw := c.RawExt; raw != ""; {
		k, v, rest := nextRawField(raw)
		if k == key {
			found = v // the last one, as in the map
		}
		raw = rest
	}
	return found
}

// Ext2 is Ext for two distinct keys, with one pass over RawExt.
func (c *Command) Ext2(key1, key2 string) (v1, v2 string) {
	if c.ExtFields != nil || c.RawExt == "" {
		return c.ExtFields[key1], c.ExtFields[key2]
	}
	for raw := c.RawExt; raw != ""; {
		k, v, rest := nextRawField(raw)
		switch k {
		case key1:
			v1 = v // the last one, as in the map
		case key2:
			v2 = v
		}
		raw = rest
	}
	return v1, v2
}

// BuildExtFields makes ExtFields out of RawExt, for a command read with its ext fields raw
// (ReadOptions) that is handed to code reading the map; RawExt is then cleared. A command
// that has its map already keeps it.
func (c *Command) BuildExtFields() {
	if c.ExtFields != nil {
		return
	}
	n := 0
	for raw := c.RawExt; raw != ""; n++ {
		_, _, raw = nextRawField(raw)
	}
	ext := make(map[string]string, n)
	for raw := c.RawExt; raw != ""; {
		var k, v string
		k, v, raw = nextRawField(raw)
		ext[k] = v // the last of a repeated key wins, as when the map is built on reading
	}
	c.ExtFields, c.RawExt = ext, ""
}

// countBinaryFields counts the fields of a binary ext-fields block, as far as their lengths
// add up (the decoder reports what does not).
func countBinaryFields(b []byte) int {
	n := 0
	for len(b) >= 2 {
		kl := int(binary.BigEndian.Uint16(b))
		if len(b) < 2+kl+4 {
			break
		}
		vl := int64(binary.BigEndian.Uint32(b[2+kl:]))
		if vl > int64(len(b)-2-kl-4) {
			break
		}
		b = b[2+kl+4+int(vl):]
		n++
	}
	return n
}

// substringOf returns the part of whole that corresponds to sub, a subslice of base (whole's
// bytes), without copying.
func substringOf(whole string, base, sub []byte) string {
	if len(sub) == 0 {
		return ""
	}
	off := cap(base) - cap(sub)
	return whole[off : off+len(sub)]
}

// takeBytes32 splits an int32-length-prefixed field off b.
func takeBytes32(b []byte, what string) (field, rest []byte, err error) {
	if len(b) < 4 {
		return nil, nil, fmt.Errorf("decode binary header: truncated %s length", what)
	}
	n := int64(int32(binary.BigEndian.Uint32(b)))
	if n < 0 || n > int64(len(b)-4) {
		return nil, nil, fmt.Errorf("decode binary header: %s length %d exceeds the %d bytes left", what, n, len(b)-4)
	}
	return b[4 : 4+n], b[4+n:], nil
}

// frameChunk is the first allocation for a frame larger than it; the buffer then doubles as
// the frame's bytes arrive. A peer that announces 16 MiB and sends a few bytes holds this
// much, not 16 MiB: memory follows what was received (at most twice it), not what was promised.
// It is 64 KiB so that the common large frame, a pull of 32 messages of 1 KiB (about 40 KiB),
// is read into one allocation rather than into 32 KiB, copied into a second one.
const frameChunk = 64 << 10

// ReadFrame reads one length-prefixed frame from r and decodes it. It refuses a length over
// max (MaxFrameSize when max <= 0) before allocating anything, and allocates the frame as its
// bytes arrive rather than all at once.
//
// An error wrapping ErrMalformedFrame or ErrFrameTooLarge, or a read error, leaves r at an
// unknown place in the stream. A *HeaderError leaves it at the start of the next frame.
func ReadFrame(r *bufio.Reader, max int) (*Command, error) {
	return ReadFrameRawExt(r, max, nil)
}

// ReadFrameRawExt is ReadFrame that, for a request with a binary header whose code rawExt
// reports true, leaves ExtFields nil and sets RawExt: for a reader whose handler decodes
// those requests' headers itself (see Command.RawExt). JSON headers always build the map.
func ReadFrameRawExt(r *bufio.Reader, max int, rawExt func(RequestCode) bool) (*Command, error) {
	c, _, err := readFrame(r, ReadOptions{Max: max, RawExt: rawExt}, true)
	return c, err
}

// ReadFrameLent is ReadFrameRawExt that does not copy the body of a frame that fits r's
// buffer: lent reports that c.Body points into r's buffer, valid only until the next call
// that reads from r (which may move or overwrite the buffered bytes). The header's strings
// are copies either way. A reader that serves a request before it reads the next frame
// saves a copy and an allocation per frame; it must copy the body of anything it hands on.
func ReadFrameLent(r *bufio.Reader, max int, rawExt func(RequestCode) bool) (c *Command, lent bool, err error) {
	return readFrame(r, ReadOptions{Max: max, RawExt: rawExt}, false)
}

// ReadOptions says how ReadFrameWith reads a frame.
type ReadOptions struct {
	// Max is the largest frame accepted, length prefix excluded; <= 0: MaxFrameSize.
	Max int
	// RawExt, if set, names the requests whose binary ext fields stay raw: ExtFields nil,
	// RawExt set (see ReadFrameRawExt).
	RawExt func(RequestCode) bool
	// RawResponses leaves the ext fields of every response with a binary header raw: for a
	// reader that hands responses to callers that read them with Ext or the typed decoders
	// (DecodeSendResponse), and builds the map (BuildExtFields) for the others.
	RawResponses bool
	// Lend leaves the body of a frame that fits the reader's buffer in the buffer, as
	// ReadFrameLent does.
	Lend bool
	// Into, if set, is overwritten with a frame whose header is binary and returned, rather
	// than a new Command: a reader that knows its caller is done with the previous one (a
	// response read raw and handed to a receiver that keeps nothing of it) saves an
	// allocation per frame. Strings read from the header stay valid; the Command does not.
	Into *Command
}

// ReadFrameWith reads one frame as o says; lent is as for ReadFrameLent.
func ReadFrameWith(r *bufio.Reader, o ReadOptions) (c *Command, lent bool, err error) {
	return readFrame(r, o, !o.Lend)
}

func readFrame(r *bufio.Reader, o ReadOptions, copyBody bool) (*Command, bool, error) {
	max := o.Max
	if max <= 0 || max > MaxFrameSize {
		max = MaxFrameSize
	}
	n, err := readLength(r)
	if err != nil {
		return nil, false, err
	}
	if n < 4 {
		return nil, false, fmt.Errorf("read frame: length %d is shorter than a header mark: %w", n, ErrMalformedFrame)
	}
	if n > max {
		return nil, false, fmt.Errorf("read frame: length %d exceeds %d: %w", n, max, ErrFrameTooLarge)
	}
	if n <= r.Size() {
		// The frame fits the reader's buffer: decode it there. Its header's strings are
		// copied anyway and a body is copied out (unless lent), so a frame without a body
		// (most responses) costs no buffer of its own.
		frame, err := r.Peek(n)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, false, fmt.Errorf("read frame of %d bytes after %d: %w", n, len(frame), err)
		}
		c, err := decodeFrame(frame, copyBody, o)
		_, _ = r.Discard(n) // buffered: cannot fail; the bytes stay until the next read
		return c, err == nil && !copyBody && len(c.Body) > 0, err
	}
	frame := make([]byte, 0, min(n, frameChunk))
	for len(frame) < n {
		if len(frame) == cap(frame) {
			grown := make([]byte, len(frame), min(n, 2*cap(frame)))
			copy(grown, frame)
			frame = grown
		}
		m, err := r.Read(frame[len(frame):cap(frame)])
		frame = frame[:len(frame)+m]
		if err != nil && len(frame) < n {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, false, fmt.Errorf("read frame of %d bytes after %d: %w", n, len(frame), err)
		}
	}
	c, err := decodeFrame(frame, false, o) // the frame is its own: the body is not lent
	return c, false, err
}

// readLength reads a frame's 4-byte length prefix. It is read in place (Peek, then
// Discard): an array handed to io.ReadFull would escape, one allocation per frame. Errors
// are io.ReadFull's: io.EOF before the first byte, io.ErrUnexpectedEOF after it.
func readLength(r *bufio.Reader) (int, error) {
	p, err := r.Peek(4)
	if err != nil {
		if len(p) > 0 && errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, err
	}
	n := int(int32(binary.BigEndian.Uint32(p)))
	_, _ = r.Discard(4)
	return n, nil
}
