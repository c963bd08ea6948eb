package protocol

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func typicalSendHeader() SendMessageRequestHeader {
	return SendMessageRequestHeader{
		ProducerGroup: "orders", Topic: "TopicTest", DefaultTopic: AutoCreateTopicKey,
		DefaultTopicQueueNums: 4, QueueID: 3, SysFlag: 0, BornTimestamp: 1712345678901,
		Flag: -7, Properties: "UNIQ_KEY\x01AC1100020000\x02WAIT\x01true\x02", MaxReconsumeTimes: -1,
		BrokerName: "broker-\"a\"",
	}
}

// TestFieldsEncodeAsTheMap checks that a header written with Fields decodes, in both
// encodings, to the very fields EncodeV2 puts in a map, alongside ExtFields of its own.
func TestFieldsEncodeAsTheMap(t *testing.T) {
	for _, st := range []SerializeType{JSON, RocketMQ} {
		h := typicalSendHeader()
		c := NewRequest(SendMessageV2, map[string]string{"extra": "x"}, []byte("body"))
		c.Fields = (*SendV2Fields)(&h)
		c.Opaque, c.Serialize = 42, st
		frame, err := c.AppendFrame(nil)
		require.NoError(t, err)
		got, err := DecodeFrame(frame[4:])
		require.NoError(t, err, "serialize %d", st)
		want := h.EncodeV2()
		want["extra"] = "x"
		require.Equal(t, want, got.ExtFields, "serialize %d", st)
		require.Equal(t, []byte("body"), got.Body)
		require.Nil(t, got.Fields)

		var back SendMessageRequestHeader
		require.NoError(t, back.DecodeV2(got.ExtFields))
		require.Equal(t, h, back)
	}
}

// TestFieldsOnlyJSON checks a JSON header whose fields all come from Fields.
func TestFieldsOnlyJSON(t *testing.T) {
	h := typicalSendHeader()
	c := &Command{Code: int32(SendMessageV2), Language: LangGo, Version: Version, Fields: (*SendV2Fields)(&h)}
	frame, err := c.AppendFrame(nil)
	require.NoError(t, err)
	got, err := DecodeFrame(frame[4:])
	require.NoError(t, err)
	require.Equal(t, h.EncodeV2(), got.ExtFields)
}

type longKeyFields struct{}

func (longKeyFields) AppendFields(w FieldWriter) FieldWriter {
	w.Int(string(make([]byte, 1<<15)), 1)
	return w
}

func TestFieldsKeyTooLong(t *testing.T) {
	c := &Command{Code: 1, Serialize: RocketMQ, Fields: longKeyFields{}}
	_, err := c.AppendFrame(nil)
	require.ErrorContains(t, err, "too long")
}

// BenchmarkSendHeader compares the send request header written from a map (EncodeV2) and
// straight from the typed header (Fields), in the binary encoding, decoding included.
func BenchmarkSendHeader(b *testing.B) {
	h := typicalSendHeader()
	buf := make([]byte, 0, 1024)
	b.Run("map", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c := NewRequest(SendMessageV2, h.EncodeV2(), nil)
			c.Serialize = RocketMQ
			buf, _ = c.AppendFrame(buf[:0])
		}
	})
	b.Run("fields", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c := Command{Code: int32(SendMessageV2), Serialize: RocketMQ, Fields: (*SendV2Fields)(&h)}
			buf, _ = c.AppendFrame(buf[:0])
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeFrame(buf[4:]); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// The header's quick number parser reads what strconv.ParseInt reads, and leaves the rest to
// it.
func TestParseSmallIntAgreesWithStrconv(t *testing.T) {
	for _, s := range []string{"0", "7", "-1", "+42", "2147483647", "-2147483648", "2147483648", "-2147483649",
		"123456789012345678", "-123456789012345678", "9223372036854775807", "", "-", "+", "1x", " 1", "1_0", "٣", "--1", "0x10"} {
		for _, bits := range []int{32, 64} {
			want, err := strconv.ParseInt(s, 10, bits)
			got, ok := parseSmallInt(s, bits)
			if ok {
				assert.NoError(t, err, "%q (%d bits) read quickly but refused by strconv", s, bits)
				assert.Equal(t, want, got, "%q (%d bits)", s, bits)
			}
			r := fieldReader{ext: map[string]string{"n": s}}
			n := r.int("n", true, bits, 0)
			if err != nil {
				assert.Error(t, r.err, "%q (%d bits)", s, bits)
			} else {
				assert.NoError(t, r.err, "%q (%d bits)", s, bits)
				assert.Equal(t, want, n, "%q (%d bits)", s, bits)
			}
		}
	}
}
