package protocol

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

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
	resp.Code = int16(SendMessageV2)
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
