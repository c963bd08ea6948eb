package protocol

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"net/netip"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// goldenStored is a stored message spelled out field by field from RocketMQ's v1 layout.
var goldenStored = []byte{
	0x00, 0x00, 0x00, 0x62, // TOTALSIZE 98
	0xDA, 0xA3, 0x20, 0xA7, // MAGICCODE v1
	0x58, 0x93, 0x2A, 0xAC, // BODYCRC: crc32("hi") = 0xD8932AAC, masked to 31 bits
	0x00, 0x00, 0x00, 0x01, // QUEUEID 1
	0xFF, 0xFF, 0xFF, 0xFF, // FLAG -1
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, // QUEUEOFFSET 2
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, // PHYSICALOFFSET 3
	0x00, 0x00, 0x00, 0x00, // SYSFLAG 0
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, // BORNTIMESTAMP 4
	10, 0, 0, 1, 0x00, 0x00, 0x00, 0x05, // BORNHOST 10.0.0.1:5
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x06, // STORETIMESTAMP 6
	10, 0, 0, 2, 0x00, 0x00, 0x2A, 0x9F, // STOREHOST 10.0.0.2:10911
	0x00, 0x00, 0x00, 0x07, // RECONSUMETIMES 7
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, // PREPARED_TX_OFFSET 8
	0x00, 0x00, 0x00, 0x02, 'h', 'i', // BODYLEN + body
	0x01, 'T', // TOPICLEN + topic
	0x00, 0x04, 'A', 0x01, 'b', 0x02, // PROPLEN + properties
}

func goldenMessage() *MessageExt {
	return &MessageExt{
		Message:                   Message{Topic: "T", Flag: -1, Properties: map[string]string{"A": "b"}, Body: []byte("hi")},
		QueueID:                   1,
		StoreSize:                 98,
		QueueOffset:               2,
		CommitLogOffset:           3,
		BornTimestamp:             4,
		BornHost:                  netip.MustParseAddrPort("10.0.0.1:5"),
		StoreTimestamp:            6,
		StoreHost:                 netip.MustParseAddrPort("10.0.0.2:10911"),
		BodyCRC:                   0x58932AAC,
		ReconsumeTimes:            7,
		PreparedTransactionOffset: 8,
	}
}

func TestGoldenStored(t *testing.T) {
	m := goldenMessage()
	m.StoreSize, m.BodyCRC = 0, 0 // filled in by AppendStored
	got, err := AppendStored(nil, m)
	require.NoError(t, err)
	require.Equal(t, goldenStored, got)
	require.Equal(t, goldenMessage(), m)

	dec, n, err := DecodeStored(goldenStored)
	require.NoError(t, err)
	require.Equal(t, len(goldenStored), n)
	require.Equal(t, goldenMessage(), dec)
	require.Equal(t, "0A00000200002A9F0000000000000003", OffsetMsgID(dec.StoreHost, dec.CommitLogOffset))
}

func storedCases() map[string]*MessageExt {
	compressed, err := CompressBody(bytes.Repeat([]byte("compress me "), 100), 5)
	if err != nil {
		panic(err)
	}
	base := func() *MessageExt {
		return &MessageExt{
			Message: Message{
				Topic: "TopicTest", Flag: 3, Body: []byte("hello"),
				Properties: map[string]string{PropertyTags: "TagA", PropertyKeys: "k1 k2", PropertyUniqueKey: "7F0000010001", PropertyWaitStoreOK: "true"},
			},
			QueueID: 5, QueueOffset: 1 << 33, CommitLogOffset: 1<<40 + 17, BornTimestamp: 1712345678901,
			BornHost: netip.MustParseAddrPort("192.168.1.20:50000"), StoreTimestamp: 1712345679000,
			StoreHost: netip.MustParseAddrPort("10.0.0.1:10911"), ReconsumeTimes: 2, PreparedTransactionOffset: 0,
		}
	}
	cases := map[string]*MessageExt{}
	cases["ipv4"] = base()
	m := base()
	m.BornHost = netip.MustParseAddrPort("[2001:db8::7]:50000")
	cases["ipv6 born host"] = m
	m = base()
	m.StoreHost = netip.MustParseAddrPort("[fe80::1]:10911")
	cases["ipv6 store host"] = m
	m = base()
	m.BornHost = netip.MustParseAddrPort("[2001:db8::7]:1")
	m.StoreHost = netip.MustParseAddrPort("[2001:db8::1]:65535")
	cases["ipv6 both"] = m
	m = base()
	m.Body = nil
	cases["empty body"] = m
	m = base()
	m.Properties = nil
	cases["no properties"] = m
	m = base()
	m.Body, m.SysFlag = compressed, MsgFlagCompressed
	cases["compressed"] = m
	m = base()
	m.Topic = strings.Repeat("t", MaxTopicLength)
	m.Properties = map[string]string{"big": strings.Repeat("v", MaxPropertiesLength-5)}
	cases["longest topic and properties"] = m
	m = base()
	m.Properties[PropertyTags] = "标签😀"
	m.SysFlag = MsgFlagMultiTags | 0x4
	cases["unicode tags and other sysflag bits"] = m
	return cases
}

func TestStoredRoundTrip(t *testing.T) {
	for name, m := range storedCases() {
		t.Run(name, func(t *testing.T) {
			b, err := AppendStored([]byte("prefix"), m)
			require.NoError(t, err)
			require.Equal(t, "prefix", string(b[:6]))
			b = b[6:]
			require.Len(t, b, m.StoredSize())
			require.Equal(t, int32(len(b)), m.StoreSize)

			got, n, err := DecodeStored(b)
			require.NoError(t, err)
			require.Equal(t, len(b), n)
			want := *m
			if want.Properties == nil {
				want.Properties = map[string]string{}
			}
			if want.Body == nil {
				want.Body = []byte{}
			}
			require.Equal(t, &want, got)
		})
	}
}

func TestStoredSysFlagFollowsAddresses(t *testing.T) {
	m := storedCases()["ipv4"]
	m.SysFlag = MsgFlagBornHostV6 | MsgFlagStoreHostV6 | MsgFlagCompressed // stale bits
	_, err := AppendStored(nil, m)
	require.NoError(t, err)
	require.Equal(t, int32(MsgFlagCompressed), m.SysFlag)

	m.StoreHost = netip.MustParseAddrPort("[::ffff:10.0.0.1]:10911") // IPv4-mapped is IPv4
	b, err := AppendStored(nil, m)
	require.NoError(t, err)
	require.Equal(t, int32(MsgFlagCompressed), m.SysFlag)
	got, _, err := DecodeStored(b)
	require.NoError(t, err)
	require.Equal(t, netip.MustParseAddrPort("10.0.0.1:10911"), got.StoreHost)
}

func TestDecodeStoredAll(t *testing.T) {
	var body []byte
	var want []*MessageExt
	for _, m := range storedCases() {
		var err error
		body, err = AppendStored(body, m)
		require.NoError(t, err)
		want = append(want, m)
	}
	got, err := DecodeStoredAll(body)
	require.NoError(t, err)
	require.Len(t, got, len(want))
	for i := range got {
		require.Equal(t, want[i].Topic, got[i].Topic)
		require.Equal(t, want[i].CommitLogOffset, got[i].CommitLogOffset)
	}

	// A bad third message: the first two come back with the error.
	bad := append([]byte{}, body...)
	third := int(got[0].StoreSize + got[1].StoreSize)
	bad[third+StoredBodyCRCAt] ^= 1
	part, err := DecodeStoredAll(bad)
	require.Len(t, part, 2)
	require.ErrorIs(t, err, ErrMalformedMessage)
	require.ErrorContains(t, err, "message 2: malformed message: body CRC")
}

func TestPatchStored(t *testing.T) {
	for _, name := range []string{"ipv4", "ipv6 born host", "ipv6 both"} {
		m := storedCases()[name]
		b, err := AppendStored(nil, m)
		require.NoError(t, err)
		PatchStored(b, 77, 1<<41, 1712345699999)
		got, _, err := DecodeStored(b)
		require.NoError(t, err)
		require.Equal(t, int64(77), got.QueueOffset)
		require.Equal(t, int64(1<<41), got.CommitLogOffset)
		require.Equal(t, int64(1712345699999), got.StoreTimestamp)
		require.Equal(t, m.StoreHost, got.StoreHost, name)
	}
}

func TestDecodeStoredBadInput(t *testing.T) {
	set32 := func(at int, v uint32) []byte {
		b := append([]byte{}, goldenStored...)
		binary.BigEndian.PutUint32(b[at:], v)
		return b
	}
	bodyLenAt := len(goldenStored) - 2 - 4 - 2 - 2 - 4 // before body "hi", topic, props
	tests := []struct {
		name string
		b    []byte
		msg  string
	}{
		{"empty", nil, "truncated at TOTALSIZE"},
		{"only total size", goldenStored[:4], "truncated at MAGICCODE"},
		{"truncated", goldenStored[:50], "TOTALSIZE 98 but 50 bytes present"},
		{"negative total size", set32(0, 0xFFFFFFFF), "TOTALSIZE -1"},
		{"total size below the header", set32(0, 6), "truncated at BODYCRC"},
		{"total size too small for the fields", set32(0, 97), "truncated at PROPERTIES"},
		{"total size larger than the fields", append(set32(0, 99), 0), "TOTALSIZE 99 disagrees with the fields, which end at 98"},
		{"bad magic", set32(4, 0xCAFEBABE), "bad magic code 0xCAFEBABE"},
		{"blank magic", set32(4, MagicBlank), "bad magic code 0xCBD43194"},
		{"v2 magic", set32(4, MagicV2), "v2 magic code 0xDAA320AB is not supported"},
		{"bad body CRC", set32(8, 0x12345678), "body CRC 0x58932AAC, stored 0x12345678"},
		{"body length negative", set32(bodyLenAt, 0x80000000), "truncated at BODY"},
		{"body length past the end", set32(bodyLenAt, 1000), "truncated at BODY"},
		{"v6 flag without the bytes", set32(StoredSysFlagAt, MsgFlagStoreHostV6), "truncated"},
		{"property without separator", func() []byte {
			b := append([]byte{}, goldenStored...)
			b[len(b)-3] = 'x' // "A\x01b\x02" → "Axb\x02"
			return b
		}(), `property "Axb" has no name/value separator`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, n, err := DecodeStored(tt.b)
			require.Nil(t, m)
			require.Zero(t, n)
			require.ErrorIs(t, err, ErrMalformedMessage)
			require.ErrorContains(t, err, tt.msg)
		})
	}
}

func TestAppendStoredErrors(t *testing.T) {
	m := storedCases()["ipv4"]
	m.Topic = ""
	_, err := AppendStored(nil, m)
	require.ErrorContains(t, err, "topic length 0")
	m.Topic = strings.Repeat("t", MaxTopicLength+1)
	_, err = AppendStored(nil, m)
	require.ErrorContains(t, err, "topic length 128")
	m.Topic = "t"
	m.Properties = map[string]string{"k": strings.Repeat("v", MaxPropertiesLength)}
	out, err := AppendStored([]byte("keep"), m)
	require.ErrorContains(t, err, "properties of 32770 bytes exceed 32767")
	require.Equal(t, "keep", string(out))
}

func TestProperties(t *testing.T) {
	props := map[string]string{"b": "2", "a": "1", "": "empty key", "c": ""}
	enc := EncodeProperties(props)
	require.Equal(t, "\x01empty key\x02a\x011\x02b\x012\x02c\x01\x02", enc, "sorted keys")
	got, err := DecodeProperties([]byte(enc))
	require.NoError(t, err)
	require.Equal(t, props, got)

	got, err = DecodeProperties([]byte("a\x011\x02b\x012")) // no final separator
	require.NoError(t, err)
	require.Equal(t, map[string]string{"a": "1", "b": "2"}, got)

	got, err = DecodeProperties([]byte("a\x011\x02\x02\x02")) // empty pairs are skipped
	require.NoError(t, err)
	require.Equal(t, map[string]string{"a": "1"}, got)

	_, err = DecodeProperties([]byte("a\x011\x02oops\x02"))
	require.ErrorIs(t, err, ErrMalformedMessage)

	require.Equal(t, []string{"k1", "k2"}, (&Message{Properties: map[string]string{PropertyKeys: " k1  k2 "}}).Keys())
	require.Equal(t, "TagA", (&Message{Properties: map[string]string{PropertyTags: "TagA"}}).Tags())
}

// TestGoldenBatchEntry spells out one SEND_BATCH_MESSAGE entry from RocketMQ's batch layout.
func TestGoldenBatchEntry(t *testing.T) {
	golden := []byte{
		0x00, 0x00, 0x00, 0x1C, // TOTALSIZE 28 = 22 fixed + 2 body + 4 properties
		0x00, 0x00, 0x00, 0x00, // MAGIC 0
		0x00, 0x00, 0x00, 0x00, // BODYCRC 0
		0x00, 0x00, 0x00, 0x09, // FLAG 9
		0x00, 0x00, 0x00, 0x02, 'h', 'i', // BODYLEN + body
		0x00, 0x04, 'K', 0x01, 'v', 0x02, // PROPLEN + properties
	}
	want := &Message{Flag: 9, Body: []byte("hi"), Properties: map[string]string{"K": "v"}}
	m, n, err := DecodeBatchEntry(golden)
	require.NoError(t, err)
	require.Equal(t, 28, n)
	require.Equal(t, want, m)

	enc, err := AppendBatchEntry(nil, want)
	require.NoError(t, err)
	require.Equal(t, golden, enc)
	require.Equal(t, 28, BatchEntrySize(want))

	// A writer that leaves out the last separator, and one that puts non-zero magic and CRC
	// (both ignored, as the Java broker ignores them).
	odd := append([]byte{0, 0, 0, 0x1B, 0xDA, 0xA3, 0x20, 0xA7, 1, 2, 3, 4}, golden[12:]...)
	odd = append(odd[:23], 0x03, 'K', 0x01, 'v')
	m, _, err = DecodeBatchEntry(odd)
	require.NoError(t, err)
	require.Equal(t, want, m)
}

func TestBatchRoundTrip(t *testing.T) {
	msgs := []*Message{
		{Body: []byte("one"), Properties: map[string]string{PropertyTags: "a", PropertyUniqueKey: "id1"}},
		{Flag: -1, Body: nil, Properties: map[string]string{}},
		{Body: bytes.Repeat([]byte{0xFF}, 70000), Properties: map[string]string{PropertyKeys: "k"}},
	}
	b, err := EncodeBatch(msgs)
	require.NoError(t, err)
	got, err := DecodeBatch(b)
	require.NoError(t, err)
	require.Len(t, got, 3)
	for i := range msgs {
		require.Equal(t, msgs[i].Flag, got[i].Flag)
		require.Equal(t, len(msgs[i].Body), len(got[i].Body))
		require.True(t, bytes.Equal(msgs[i].Body, got[i].Body))
		require.Equal(t, msgs[i].Properties, got[i].Properties)
	}
}

func TestDecodeBatchBadInput(t *testing.T) {
	entry, err := AppendBatchEntry(nil, &Message{Body: []byte("hi"), Properties: map[string]string{"K": "v"}})
	require.NoError(t, err)
	set32 := func(at int, v uint32) []byte {
		b := append([]byte{}, entry...)
		binary.BigEndian.PutUint32(b[at:], v)
		return b
	}
	tests := []struct {
		name string
		b    []byte
		msg  string
	}{
		{"empty", nil, "empty batch"},
		{"short", entry[:3], "truncated at batch TOTALSIZE"},
		{"truncated", entry[:len(entry)-1], "TOTALSIZE 28, but 27 bytes present"},
		{"total size below fixed part", set32(0, 10), "TOTALSIZE 10"},
		{"negative total size", set32(0, 0xFFFFFFF0), "TOTALSIZE -16"},
		{"total size larger than fields", append(set32(0, 29), 0), "TOTALSIZE 29 disagrees with the fields, which end at 28"},
		{"body length past the entry", set32(16, 100), "truncated at batch BODY"},
		{"body length negative", set32(16, 0xFFFFFFFF), "truncated at batch BODY"},
		{"second entry truncated", append(append([]byte{}, entry...), entry[:10]...), "batch message 1"},
		{"bad properties", func() []byte {
			b := append([]byte{}, entry...)
			b[len(b)-3] = 'x'
			return b
		}(), "no name/value separator"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeBatch(tt.b)
			require.ErrorIs(t, err, ErrMalformedMessage)
			require.ErrorContains(t, err, tt.msg)
		})
	}
}

func TestOffsetMsgID(t *testing.T) {
	tests := []struct {
		host   string
		offset int64
		id     string
	}{
		{"10.0.0.2:10911", 3, "0A00000200002A9F0000000000000003"},
		{"127.0.0.1:10911", 1<<40 + 0xABC, "7F00000100002A9F0000010000000ABC"},
		{"[::ffff:127.0.0.1]:10911", 0, "7F00000100002A9F0000000000000000"},
		{"[2001:db8::1]:65535", -1, "20010DB80000000000000000000000010000FFFFFFFFFFFFFFFFFFFF"},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			ap := netip.MustParseAddrPort(tt.host)
			require.Equal(t, tt.id, OffsetMsgID(ap, tt.offset))
			gotHost, gotOffset, err := ParseOffsetMsgID(tt.id)
			require.NoError(t, err)
			require.Equal(t, ap.Addr().Unmap(), gotHost.Addr())
			require.Equal(t, ap.Port(), gotHost.Port())
			require.Equal(t, tt.offset, gotOffset)
			_, _, err = ParseOffsetMsgID(strings.ToLower(tt.id))
			require.NoError(t, err)
		})
	}
	for _, bad := range []string{"", "0A00", "0A00000200002A9F000000000000000", "0A00000200002A9F000000000000000G", "0A00000200012A9F0000000000000003" + "00"} {
		_, _, err := ParseOffsetMsgID(bad)
		require.ErrorIs(t, err, ErrBadMsgID, bad)
	}
	_, _, err := ParseOffsetMsgID("0A00000200012A9F0000000000000003")
	require.ErrorContains(t, err, "port 76447 is out of range")
}

func TestCompressBody(t *testing.T) {
	body := bytes.Repeat([]byte("flowd compresses bodies "), 1000)
	for _, level := range []int{zlib.HuffmanOnly, zlib.DefaultCompression, zlib.NoCompression, zlib.BestSpeed, DefaultCompressLevel, zlib.BestCompression} {
		c, err := CompressBody(body, level)
		require.NoError(t, err)
		// A standard zlib reader agrees.
		r, err := zlib.NewReader(bytes.NewReader(c))
		require.NoError(t, err)
		var std bytes.Buffer
		_, err = std.ReadFrom(r)
		require.NoError(t, err)
		require.Equal(t, body, std.Bytes())

		got, err := DecompressBody(c, len(body))
		require.NoError(t, err)
		require.Equal(t, body, got)
	}
	_, err := CompressBody(body, 10)
	require.ErrorContains(t, err, "level 10")

	t.Run("reuse", func(t *testing.T) {
		c, err := NewCompressor(DefaultCompressLevel)
		require.NoError(t, err)
		var d Decompressor
		for i := range 5 {
			in := bytes.Repeat([]byte{byte(i)}, 100*i)
			out, err := c.Compress([]byte("x"), in)
			require.NoError(t, err)
			require.Equal(t, byte('x'), out[0])
			back, err := d.Decompress([]byte("y"), out[1:], 0)
			require.NoError(t, err)
			require.Equal(t, append([]byte("y"), in...), back)
		}
		// A bad stream in between does not poison the decompressor.
		_, err = d.Decompress(nil, []byte("not zlib"), 0)
		require.ErrorIs(t, err, ErrBadCompressedBody)
		out, err := c.Compress(nil, []byte("ok"))
		require.NoError(t, err)
		back, err := d.Decompress(nil, out, 0)
		require.NoError(t, err)
		require.Equal(t, "ok", string(back))
	})
}

func TestDecompressBodyBadInput(t *testing.T) {
	good, err := CompressBody([]byte("hello hello hello"), 5)
	require.NoError(t, err)
	corrupt := append([]byte{}, good...)
	corrupt[len(corrupt)-1] ^= 0xFF // Adler-32 checksum
	tests := []struct {
		name string
		b    []byte
		msg  string
	}{
		{"empty", nil, "bad compressed body: unexpected EOF"},
		{"not zlib", []byte("plain text body"), "bad compressed body: zlib: invalid header"},
		{"truncated", good[:len(good)-3], "bad compressed body: unexpected EOF"},
		{"bad checksum", corrupt, "bad compressed body: zlib: invalid checksum"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecompressBody(tt.b, 0)
			require.ErrorIs(t, err, ErrBadCompressedBody)
			require.EqualError(t, err, tt.msg)
		})
	}
}

// TestDecompressBodyZipBomb: 16 MiB of zeros compress to about 16 KiB; inflating them with a
// 1 MiB limit fails without allocating much more than the limit.
func TestDecompressBodyZipBomb(t *testing.T) {
	bomb, err := CompressBody(make([]byte, 16<<20), zlib.BestCompression)
	require.NoError(t, err)
	require.Less(t, len(bomb), 32<<10)

	const limit = 1 << 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const runs = 10
	for range runs {
		_, err = DecompressBody(bomb, limit)
		require.ErrorIs(t, err, ErrBodyTooLarge)
	}
	runtime.ReadMemStats(&after)
	require.ErrorContains(t, err, "inflates past the limit of 1048576 bytes")
	// Buffers of 64 KiB, 128 KiB, … 1 MiB (the largest is the limit itself), plus about 45 KiB
	// of zlib state.
	perRun := (after.TotalAlloc - before.TotalAlloc) / runs
	require.Less(t, perRun, uint64(2*limit+128<<10), "bytes allocated per decompression")

	// Exactly at the limit is fine; one byte less is not.
	exact, err := CompressBody(bytes.Repeat([]byte("z"), limit), 5)
	require.NoError(t, err)
	out, err := DecompressBody(exact, limit)
	require.NoError(t, err)
	require.Len(t, out, limit)
	require.Equal(t, limit, cap(out))
	_, err = DecompressBody(exact, limit-1)
	require.ErrorIs(t, err, ErrBodyTooLarge)
	out, err = DecompressBody(exact, 1)
	require.ErrorIs(t, err, ErrBodyTooLarge)
	require.Nil(t, out)
}

func TestUncompressedBody(t *testing.T) {
	m := storedCases()["compressed"]
	body, err := m.UncompressedBody(0)
	require.NoError(t, err)
	require.Equal(t, bytes.Repeat([]byte("compress me "), 100), body)
	plain := storedCases()["ipv4"]
	body, err = plain.UncompressedBody(0)
	require.NoError(t, err)
	require.Equal(t, []byte("hello"), body)
}

// TestTagsCode: expected values are Java's String.hashCode of the string Java decodes from the
// same UTF-8 bytes (computed with OpenJDK 17's new String(bytes, UTF_8).hashCode()).
func TestTagsCode(t *testing.T) {
	tests := []struct {
		name string
		tags string
		want int64
	}{
		{"empty", "", 0},
		{"ascii", "TagA", 2598919},
		{"overflows int32", strings.Repeat("a", 50), -1203646688},
		{"BMP", "标签", 857175},
		{"surrogate pair", "😀", 1772899},
		{"mixed", "tag-😀-é||x", -1523765658},
		{"truncated 3-byte sequence is one U+FFFD", "a\xE2\x82b", 2124838},
		{"truncated 4-byte sequence at the end", "\xF0\x9F\x98", 65533},
		{"encoded surrogate is one U+FFFD", "\xED\xA0\x80", 65533},
		{"overlong is two", "\xC0\xAF", 2097056},
		{"above U+10FFFF is four", "\xF4\x90\x80\x80", 2017367872},
		{"stray continuations", "\x80\x80z", 65008858},
		{"E0 with a low second byte", "\xE0\x80\x80", 65074269},
		{"F0 9F then ASCII", "\xF0\x9Fq", 2031636},
		{"FF FE", "\xFF\xFEA", 65008801},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, TagsCode(tt.tags))
		})
	}
}

func TestFindProperty(t *testing.T) {
	props := []byte(AppendProperties(nil, map[string]string{"TAGS": "a", "KEYS": "k1 k2", "TA": "x", "empty": ""}))
	for _, tc := range []struct {
		key, want string
		ok        bool
	}{
		{"TAGS", "a", true}, {"KEYS", "k1 k2", true}, {"TA", "x", true}, {"empty", "", true},
		{"T", "", false}, {"TAGSX", "", false}, {"missing", "", false},
	} {
		v, ok := FindProperty(props, tc.key)
		require.Equal(t, tc.ok, ok, tc.key)
		require.Equal(t, tc.want, string(v), tc.key)
	}
	_, ok := FindProperty(nil, "TAGS")
	require.False(t, ok)
}

func TestAppendSetPropertyAppendsOrReplacesWithoutReordering(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "C\x01v\x02"},
		{"z\x011\x02a\x012\x02", "z\x011\x02a\x012\x02C\x01v\x02"},
		{"z\x011\x02a\x012", "z\x011\x02a\x012\x02C\x01v\x02"},
		{"z\x011\x02C\x01old\x02a\x012\x02C\x01older", "z\x011\x02a\x012\x02C\x01v\x02"},
		{"\x02z\x011\x02\x02", "\x02z\x011\x02\x02C\x01v\x02"},
		{"CC\x01x\x02", "CC\x01x\x02C\x01v\x02"},
	} {
		got := string(AppendSetProperty(nil, tc.in, "C", "v"))
		assert.Equal(t, tc.want, got, "AppendSetProperty(%q)", tc.in)
		assert.Equal(t, got, string(AppendSetProperty(nil, []byte(tc.in), "C", "v")), "the []byte form agrees")
		want, err := DecodeProperties([]byte(tc.in))
		require.NoError(t, err)
		want["C"] = "v"
		decoded, err := DecodeProperties([]byte(got))
		require.NoError(t, err)
		assert.Equal(t, want, decoded, "AppendSetProperty(%q) decodes to the map with C set", tc.in)
	}
}

func TestPropertyInReadsAsDecodePropertiesDoes(t *testing.T) {
	for _, raw := range []string{"", "a\x011\x02", "a\x011\x02a\x012\x02", "ab\x011\x02a\x01\x02", "\x02\x02a\x01x", "b\x01a\x011\x02"} {
		m, err := DecodeProperties([]byte(raw))
		require.NoError(t, err)
		v, ok := PropertyIn(raw, "a")
		mv, mok := m["a"]
		assert.Equal(t, mok, ok, "%q", raw)
		assert.Equal(t, mv, v, "%q", raw)
	}
}

func TestCheckPropertiesAgreesWithDecodeProperties(t *testing.T) {
	for _, raw := range []string{"", "a\x011\x02", "a\x02", "a\x011\x02b", "\x02\x02", "a\x011\x02b\x01"} {
		_, derr := DecodeProperties([]byte(raw))
		cerr := CheckProperties(raw)
		assert.Equal(t, cerr, CheckProperties([]byte(raw)), "%q: the []byte form agrees", raw)
		if derr == nil {
			assert.NoError(t, cerr, "%q", raw)
		} else {
			assert.EqualError(t, cerr, derr.Error(), "%q", raw)
		}
	}
}

func TestAppendStoredUsesRawProperties(t *testing.T) {
	m := &MessageExt{Message: Message{Topic: "t", Body: []byte("b"), Properties: map[string]string{"ignored": "x"}}, RawProperties: []byte("z\x011\x02a\x012\x02")}
	b, err := AppendStored(nil, m)
	require.NoError(t, err)
	assert.Equal(t, m.StoredSize(), len(b))
	got, n, err := DecodeStored(b)
	require.NoError(t, err)
	assert.Equal(t, len(b), n)
	assert.Equal(t, map[string]string{"z": "1", "a": "2"}, got.Properties)
	assert.True(t, bytes.HasSuffix(b, m.RawProperties))
}

// TestDecodeStoredToSkipsOnlyTheCRC: without verification a damaged body decodes as it is;
// the layout checks stay, and decoding into a used MessageExt leaves nothing of the last one.
func TestDecodeStoredToSkipsOnlyTheCRC(t *testing.T) {
	enc, err := AppendStored(nil, &MessageExt{Message: Message{Topic: "t", Body: []byte("body"), Properties: map[string]string{"k": "v"}}, ReconsumeTimes: 3})
	require.NoError(t, err)
	bad := bytes.Clone(enc)
	bad[bytes.Index(bad, []byte("body"))] = 'B'

	_, _, err = DecodeStored(bad)
	require.ErrorIs(t, err, ErrMalformedMessage)
	m := MessageExt{RawProperties: []byte("x"), Message: Message{Flag: 9}}
	_, err = DecodeStoredTo(&m, bad, DecodeOptions{VerifyCRC: true})
	require.ErrorIs(t, err, ErrMalformedMessage)

	n, err := DecodeStoredTo(&m, bad, DecodeOptions{})
	require.NoError(t, err)
	assert.Equal(t, len(enc), n)
	assert.Equal(t, "Body", string(m.Body))
	assert.Equal(t, map[string]string{"k": "v"}, m.Properties)
	assert.EqualValues(t, 3, m.ReconsumeTimes)
	assert.Zero(t, m.Flag)
	assert.Nil(t, m.RawProperties)

	want, _, err := DecodeStored(enc)
	require.NoError(t, err)
	_, err = DecodeStoredTo(&m, enc, DecodeOptions{VerifyCRC: true})
	require.NoError(t, err)
	assert.Equal(t, *want, m)

	_, err = DecodeStoredTo(&m, enc[:len(enc)-1], DecodeOptions{})
	require.ErrorIs(t, err, ErrMalformedMessage)
}

// TestDecodeStoredToRawProperties: the raw block reads the same as the decoded map, a topic
// hint is used only when it matches, and a malformed block is still refused.
func TestDecodeStoredToRawProperties(t *testing.T) {
	props := map[string]string{"k": "v", PropertyTags: "a", PropertyKeys: "x y"}
	enc, err := AppendStored(nil, &MessageExt{Message: Message{Topic: "topic", Body: []byte("b"), Properties: props}})
	require.NoError(t, err)
	var m MessageExt
	_, err = DecodeStoredTo(&m, enc, DecodeOptions{RawProperties: true, Topic: "other"})
	require.NoError(t, err)
	assert.Nil(t, m.Properties)
	assert.Equal(t, "topic", m.Topic)
	got, err := DecodeProperties(m.RawProperties)
	require.NoError(t, err)
	assert.Equal(t, props, got)
	_, err = DecodeStoredTo(&m, enc, DecodeOptions{RawProperties: true, Topic: "topic"})
	require.NoError(t, err)
	assert.Equal(t, "topic", m.Topic)

	bad, err := AppendStored(nil, &MessageExt{Message: Message{Topic: "topic", Body: []byte("b")}, RawProperties: []byte("novalue\x02")})
	require.NoError(t, err)
	_, err = DecodeStoredTo(&m, bad, DecodeOptions{RawProperties: true})
	require.ErrorIs(t, err, ErrMalformedMessage)
	_, _, err = DecodeStored(bad)
	require.ErrorIs(t, err, ErrMalformedMessage)
}
