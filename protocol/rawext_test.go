package protocol

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sendFrame(t testing.TB, code RequestCode, st SerializeType) []byte {
	t.Helper()
	h := &SendMessageRequestHeader{
		ProducerGroup: "pg", Topic: "T", DefaultTopic: AutoCreateTopicKey, DefaultTopicQueueNums: 4,
		QueueID: 3, SysFlag: 0, BornTimestamp: 1700000000000, Flag: 7, Properties: "KEYS\x01k\x02",
		ReconsumeTimes: 2, MaxReconsumeTimes: 16, BrokerName: "b",
	}
	ext := h.EncodeV2()
	if code == SendMessage {
		ext = h.Encode()
	}
	cmd := NewRequest(code, ext, []byte("body"))
	cmd.Opaque, cmd.Serialize = 9, st
	b, err := cmd.AppendFrame(nil)
	require.NoError(t, err)
	return b
}

func allSends(RequestCode) bool { return true }

// A binary send header read with ReadFrameRawExt comes without its map, and decodes to the
// same typed header as the map does.
func TestReadFrameRawExtDecodesSendHeadersWithoutTheMap(t *testing.T) {
	for _, code := range []RequestCode{SendMessage, SendMessageV2, SendBatchMessage} {
		frame := sendFrame(t, code, RocketMQ)
		want, err := ReadFrame(bufio.NewReader(bytes.NewReader(frame)), 0)
		require.NoError(t, err)
		got, err := ReadFrameRawExt(bufio.NewReader(bytes.NewReader(frame)), 0, allSends)
		require.NoError(t, err)
		assert.Nil(t, got.ExtFields, code)
		assert.NotEmpty(t, got.RawExt, code)
		assert.Equal(t, "body", string(got.Body))
		assert.Equal(t, int32(9), got.Opaque)
		for k, v := range want.ExtFields {
			assert.Equal(t, v, got.Ext(k), "%s field %s", code, k)
		}
		assert.Empty(t, got.Ext("absent"))
		wh, err := DecodeSendHeader(want)
		require.NoError(t, err)
		gh, err := DecodeSendHeader(got)
		require.NoError(t, err)
		assert.Equal(t, wh, gh, code)
	}
}

// Only binary requests the predicate names skip the map: JSON headers, other codes and
// responses are as ReadFrame makes them.
func TestReadFrameRawExtLeavesTheRestAlone(t *testing.T) {
	onlyV2 := func(c RequestCode) bool { return c == SendMessageV2 }
	c, err := ReadFrameRawExt(bufio.NewReader(bytes.NewReader(sendFrame(t, SendMessageV2, JSON))), 0, onlyV2)
	require.NoError(t, err)
	assert.Equal(t, "T", c.ExtFields["b"], "JSON builds the map")
	assert.Empty(t, c.RawExt)
	c, err = ReadFrameRawExt(bufio.NewReader(bytes.NewReader(sendFrame(t, SendMessage, RocketMQ))), 0, onlyV2)
	require.NoError(t, err)
	assert.Equal(t, "T", c.ExtFields["topic"], "a code not asked for builds the map")

	resp := NewResponse(&Command{Serialize: RocketMQ}, Success, "")
	resp.Code = int32(SendMessageV2)
	resp.ExtFields["msgId"] = "x"
	b, err := resp.AppendFrame(nil)
	require.NoError(t, err)
	c, err = ReadFrameRawExt(bufio.NewReader(bytes.NewReader(b)), 0, onlyV2)
	require.NoError(t, err)
	assert.Equal(t, "x", c.ExtFields["msgId"], "a response builds the map")
}

// A broken ext-fields block is refused as with the map: a HeaderError with the opaque.
func TestReadFrameRawExtRefusesABrokenBlock(t *testing.T) {
	frame := sendFrame(t, SendMessageV2, RocketMQ)
	// The first ext field's key length (after the length prefix, the mark, the fixed 13
	// bytes, the empty remark's length and the block's length) made too large.
	at := 4 + 4 + 13 + 4 + 4
	binary.BigEndian.PutUint16(frame[at:], 0xFFF0)
	_, err := ReadFrameRawExt(bufio.NewReader(bytes.NewReader(frame)), 0, allSends)
	var he *HeaderError
	require.True(t, errors.As(err, &he), "%v", err)
	assert.True(t, he.OpaqueKnown)
	assert.Equal(t, int32(9), he.Opaque)
}

// Reading a send without the map costs fewer allocations.
func TestReadFrameRawExtAllocatesLess(t *testing.T) {
	frame := sendFrame(t, SendMessageV2, RocketMQ)
	r := bytes.NewReader(frame)
	br := bufio.NewReaderSize(r, 16<<10)
	read := func(rawExt func(RequestCode) bool) float64 {
		return testing.AllocsPerRun(200, func() {
			r.Reset(frame)
			br.Reset(r)
			c, err := ReadFrameRawExt(br, 0, rawExt)
			if err != nil {
				panic(err)
			}
			if _, err := DecodeSendHeader(c); err != nil {
				panic(err)
			}
		})
	}
	withMap, without := read(nil), read(allSends)
	t.Logf("allocations per send header: %.0f with the map, %.0f without", withMap, without)
	assert.Less(t, without, withMap)
}

// BenchmarkReadSendHeader reads a binary SEND_MESSAGE_V2 frame and decodes its header, with
// the ExtFields map (map) and from the raw fields (raw).
func BenchmarkReadSendHeader(b *testing.B) {
	frame := sendFrame(b, SendMessageV2, RocketMQ)
	for _, c := range []struct {
		name   string
		rawExt func(RequestCode) bool
	}{{"map", nil}, {"raw", allSends}} {
		b.Run(c.name, func(b *testing.B) {
			r := bytes.NewReader(frame)
			br := bufio.NewReaderSize(r, 16<<10)
			b.ReportAllocs()
			for b.Loop() {
				r.Reset(frame)
				br.Reset(r)
				cmd, err := ReadFrameRawExt(br, 0, c.rawExt)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := DecodeSendHeader(cmd); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// rawBlock encodes key/value pairs as a binary ext-fields block (Command.RawExt), in order
// and with repeats, as a sender may write them.
func rawBlock(kv ...string) string {
	var b []byte
	for i := 0; i < len(kv); i += 2 {
		b = binary.BigEndian.AppendUint16(b, uint16(len(kv[i])))
		b = append(b, kv[i]...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(kv[i+1])))
		b = append(b, kv[i+1]...)
	}
	return string(b)
}

// SEND_MESSAGE_V2's one-letter keys are read from the raw block by letter; whatever the
// block holds (keys out of order, repeated, other keys among them, fields missing or
// malformed), the result and the error are those of the map the block would make.
func TestDecodeSendHeaderLettersAsTheMap(t *testing.T) {
	full := []string{"a", "pg", "b", "T", "c", "TBW102", "d", "4", "e", "3", "f", "0", "g", "1700000000000",
		"h", "7", "i", "KEYS\x01k\x02", "j", "2", "k", "false", "l", "16", "m", "false", "n", "b"}
	cases := map[string][]string{
		"in order":        full,
		"reversed":        {"n", "b", "m", "false", "l", "16", "k", "false", "j", "2", "i", "p", "h", "7", "g", "1", "f", "0", "e", "3", "d", "4", "c", "d", "b", "T", "a", "pg"},
		"repeated":        append(append([]string{}, full...), "b", "T2", "e", "5"),
		"other keys":      append(append([]string{}, full...), "zz", "1", "topic", "X"),
		"capital letter":  append(append([]string{}, full...), "B", "X"),
		"optional absent": {"a", "pg", "b", "T", "c", "d", "d", "4", "e", "3", "f", "0", "g", "1", "h", "7"},
		"empty values":    {"a", "", "b", "", "c", "", "d", "4", "e", "3", "f", "0", "g", "1", "h", "7", "i", ""},
		"required absent": {"a", "pg", "c", "d", "d", "4", "e", "3", "f", "0", "g", "1", "h", "7"},
		"bad number":      {"a", "pg", "b", "T", "c", "d", "d", "4", "e", "x", "f", "0", "g", "1", "h", "7"},
		"bad bool":        append(append([]string{}, full...), "k", "yes"),
	}
	for name, kv := range cases {
		for _, code := range []RequestCode{SendMessageV2, SendBatchMessage} {
			ext := map[string]string{}
			for i := 0; i < len(kv); i += 2 {
				ext[kv[i]] = kv[i+1]
			}
			want, wantErr := DecodeSendHeader(&Command{Code: int32(code), ExtFields: ext})
			got, err := DecodeSendHeader(&Command{Code: int32(code), RawExt: rawBlock(kv...)})
			if wantErr != nil {
				assert.Equal(t, wantErr.Error(), err.Error(), name)
				var fe *FieldError
				assert.True(t, errors.As(err, &fe), name)
				continue
			}
			require.NoError(t, err, name)
			assert.Equal(t, want, got, "%s %s", name, code)
		}
	}
}

// ReadFrameLent leaves the body of a frame that fits the buffer in the buffer (lent, and
// capped so that an append cannot run into the next frame); a frame without a body, or one
// larger than the buffer, lends nothing.
func TestReadFrameLent(t *testing.T) {
	small := sendFrame(t, SendMessageV2, RocketMQ)
	bare, err := NewResponse(&Command{Serialize: RocketMQ}, Success, "").AppendFrame(nil)
	require.NoError(t, err)
	bigReq := NewRequest(SendMessageV2, map[string]string{"b": "T"}, bytes.Repeat([]byte("x"), 20<<10))
	big, err := bigReq.AppendFrame(nil)
	require.NoError(t, err)
	stream := append(append(append(append([]byte{}, small...), bare...), big...), small...)
	br := bufio.NewReaderSize(bytes.NewReader(stream), 16<<10)

	c, lent, err := ReadFrameLent(br, 0, allSends)
	require.NoError(t, err)
	assert.True(t, lent)
	assert.Equal(t, "body", string(c.Body))
	assert.Equal(t, len(c.Body), cap(c.Body))
	buffered, err := br.Peek(br.Buffered())
	require.NoError(t, err)
	assert.Equal(t, unsafe.Pointer(unsafe.SliceData(buffered)), unsafe.Add(unsafe.Pointer(unsafe.SliceData(c.Body)), len(c.Body)),
		"the body is in the buffer, just before the next frame")

	_, lent, err = ReadFrameLent(br, 0, allSends)
	require.NoError(t, err)
	assert.False(t, lent, "no body")
	c, lent, err = ReadFrameLent(br, 0, allSends)
	require.NoError(t, err)
	assert.False(t, lent, "larger than the buffer: read into a frame of its own")
	assert.Len(t, c.Body, 20<<10)
	c, err = ReadFrameRawExt(br, 0, allSends)
	require.NoError(t, err)
	assert.Equal(t, "body", string(c.Body))
}

func sendAnswerFrame(t testing.TB, st SerializeType) []byte {
	t.Helper()
	h := &SendMessageResponseHeader{MsgID: "0A0000010000000000001F40", QueueID: 3, QueueOffset: 1234567, TransactionID: "tx", TraceOn: true}
	cmd := NewResponseWith(&Command{Opaque: 9, Serialize: st}, Success, "", h)
	b, err := cmd.AppendFrame(nil)
	require.NoError(t, err)
	return b
}

// A send's answer read with RawResponses comes without its map when its header is binary,
// and decodes to the header the map gives; BuildExtFields makes that map afterwards.
func TestReadFrameWithRawResponses(t *testing.T) {
	for _, st := range []SerializeType{JSON, RocketMQ} {
		frame := sendAnswerFrame(t, st)
		want, err := ReadFrame(bufio.NewReader(bytes.NewReader(frame)), 0)
		require.NoError(t, err)
		got, lent, err := ReadFrameWith(bufio.NewReader(bytes.NewReader(frame)), ReadOptions{RawResponses: true, Lend: true})
		require.NoError(t, err)
		assert.False(t, lent, "no body to lend")
		if st == RocketMQ {
			assert.Nil(t, got.ExtFields)
			assert.NotEmpty(t, got.RawExt)
		}
		var wh, gh SendMessageResponseHeader
		require.NoError(t, want.DecodeHeader(&wh))
		require.NoError(t, DecodeSendResponse(got, &gh))
		assert.Equal(t, wh, gh, st)
		assert.Equal(t, SendMessageResponseHeader{MsgID: "0A0000010000000000001F40", QueueID: 3, QueueOffset: 1234567, TransactionID: "tx", TraceOn: true}, gh)
		topic, offset := got.Ext2("msgId", "queueOffset")
		assert.Equal(t, "0A0000010000000000001F40", topic)
		assert.Equal(t, "1234567", offset)

		got.BuildExtFields()
		assert.Equal(t, want.ExtFields, got.ExtFields, st)
		assert.Empty(t, got.RawExt)
	}
}

// A request is read raw only when RawExt names it, whatever RawResponses says.
func TestRawResponsesLeavesRequestsAlone(t *testing.T) {
	c, _, err := ReadFrameWith(bufio.NewReader(bytes.NewReader(sendFrame(t, SendMessageV2, RocketMQ))), ReadOptions{RawResponses: true})
	require.NoError(t, err)
	assert.NotNil(t, c.ExtFields)
	assert.Empty(t, c.RawExt)
}

// A send's answer missing a required field is refused, raw or not.
func TestDecodeSendResponseRefusesAMissingField(t *testing.T) {
	cmd := NewResponseWith(&Command{Serialize: RocketMQ}, Success, "", &SendMessageResponseHeader{MsgID: "m", QueueID: 1, QueueOffset: 2})
	frame, err := cmd.AppendFrame(nil)
	require.NoError(t, err)
	got, _, err := ReadFrameWith(bufio.NewReader(bytes.NewReader(frame)), ReadOptions{RawResponses: true})
	require.NoError(t, err)
	var h SendMessageResponseHeader
	require.NoError(t, DecodeSendResponse(got, &h))
	got.RawExt = got.RawExt[:len(got.RawExt)-len("queueOffset")-2-4-1] // drop the last field
	err = DecodeSendResponse(got, &h)
	require.ErrorIs(t, err, ErrMissingField)
	assert.ErrorContains(t, err, "queueOffset")
}

// Reading a send's answer raw and decoding it costs two allocations (the command and its
// strings), against several more with the map.
func TestReadSendAnswerRawAllocates(t *testing.T) {
	frame := sendAnswerFrame(t, RocketMQ)
	r := bytes.NewReader(frame)
	br := bufio.NewReaderSize(r, 16<<10)
	read := func(raw bool) float64 {
		return testing.AllocsPerRun(200, func() {
			r.Reset(frame)
			br.Reset(r)
			c, _, err := ReadFrameWith(br, ReadOptions{RawResponses: raw})
			if err != nil {
				panic(err)
			}
			var h SendMessageResponseHeader
			if err := DecodeSendResponse(c, &h); err != nil {
				panic(err)
			}
		})
	}
	withMap, raw := read(false), read(true)
	t.Logf("allocations per send answer: %.0f with the map, %.0f raw", withMap, raw)
	assert.Equal(t, 2.0, raw)
	assert.Less(t, raw, withMap)
}

// BenchmarkReadSendAnswer reads a binary send answer and decodes its header, with the
// ExtFields map (map) and from the raw fields (raw): what a producer does per message.
func BenchmarkReadSendAnswer(b *testing.B) {
	frame := sendAnswerFrame(b, RocketMQ)
	for _, raw := range []bool{false, true} {
		name := "map"
		if raw {
			name = "raw"
		}
		b.Run(name, func(b *testing.B) {
			r := bytes.NewReader(frame)
			br := bufio.NewReaderSize(r, 16<<10)
			b.ReportAllocs()
			for b.Loop() {
				r.Reset(frame)
				br.Reset(r)
				c, _, err := ReadFrameWith(br, ReadOptions{RawResponses: raw})
				if err != nil {
					b.Fatal(err)
				}
				var h SendMessageResponseHeader
				if err := DecodeSendResponse(c, &h); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A frame read Into a Command overwrites it and costs only its strings: the header decoded
// from it before stays valid, the Command's fields are the new frame's alone.
func TestReadFrameIntoReusesTheCommand(t *testing.T) {
	first := NewResponseWith(&Command{Serialize: RocketMQ}, Success, "", &SendMessageResponseHeader{MsgID: "first", QueueID: 1, QueueOffset: 10})
	first.Opaque = 7
	second := NewResponseWith(&Command{Serialize: RocketMQ}, SystemBusy, "busy", nil)
	second.Opaque = 8
	var frames []byte
	for _, c := range []*Command{first, second} {
		var err error
		frames, err = c.AppendFrame(frames)
		require.NoError(t, err)
	}
	br := bufio.NewReader(bytes.NewReader(frames))
	into := &Command{Body: []byte("stale"), Remark: "stale"}
	got, _, err := ReadFrameWith(br, ReadOptions{RawResponses: true, Into: into})
	require.NoError(t, err)
	require.Same(t, into, got)
	var h SendMessageResponseHeader
	require.NoError(t, DecodeSendResponse(got, &h))
	assert.Equal(t, int32(7), got.Opaque)
	assert.Nil(t, got.Body, "nothing left of what the Command held")
	assert.Empty(t, got.Remark)

	got, _, err = ReadFrameWith(br, ReadOptions{RawResponses: true, Into: into})
	require.NoError(t, err)
	require.Same(t, into, got)
	assert.Equal(t, SystemBusy, got.ResponseCode())
	assert.Equal(t, int32(8), got.Opaque)
	assert.Equal(t, "busy", got.Remark)
	assert.Empty(t, got.RawExt, "the first frame's fields are gone")
	assert.Equal(t, SendMessageResponseHeader{MsgID: "first", QueueID: 1, QueueOffset: 10}, h, "what was read from the first frame stays")

	frame := sendAnswerFrame(t, RocketMQ)
	r := bytes.NewReader(frame)
	br = bufio.NewReaderSize(r, 16<<10)
	n := testing.AllocsPerRun(200, func() {
		r.Reset(frame)
		br.Reset(r)
		if _, _, err := ReadFrameWith(br, ReadOptions{RawResponses: true, Into: into}); err != nil {
			panic(err)
		}
	})
	assert.Equal(t, 1.0, n, "the header's one string")
}
