package protocol

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"
)

// TestGoldenBinaryFrame spells out a ROCKETMQ-serialized GET_ROUTEINFO_BY_TOPIC request byte
// by byte from RocketMQ's frame layout.
func TestGoldenBinaryFrame(t *testing.T) {
	golden := []byte{
		0x00, 0x00, 0x00, 0x25, // length: 37 bytes follow
		0x01, 0x00, 0x00, 0x21, // header mark: serialize type 1, header length 33
		0x00, 0x69, // code 105
		0x09,       // language GO
		0x01, 0x3D, // version 317
		0x00, 0x00, 0x00, 0x01, // opaque 1
		0x00, 0x00, 0x00, 0x00, // flag 0: a request
		0x00, 0x00, 0x00, 0x00, // remark length 0
		0x00, 0x00, 0x00, 0x0C, // ext fields: 12 bytes
		0x00, 0x05, 't', 'o', 'p', 'i', 'c', // key length 5, "topic"
		0x00, 0x00, 0x00, 0x01, 'T', // value length 1, "T"
	}
	cmd := NewRequestWith(GetRouteInfoByTopic, &GetRouteInfoRequestHeader{Topic: "T"}, nil)
	cmd.Opaque = 1
	cmd.Serialize = RocketMQ
	got, err := cmd.AppendFrame(nil)
	require.NoError(t, err)
	require.Equal(t, golden, got)

	dec, err := DecodeFrame(golden[4:])
	require.NoError(t, err)
	require.Equal(t, cmd, dec)
}

// TestGoldenBinaryResponse: a response with a remark, two ext fields in key order, and a body.
func TestGoldenBinaryResponse(t *testing.T) {
	golden := []byte{
		0x00, 0x00, 0x00, 0x36, // length 54
		0x01, 0x00, 0x00, 0x30, // ROCKETMQ, header 48
		0x00, 0x00, // code 0 SUCCESS
		0x00,       // language JAVA
		0x01, 0x3D, // version 317
		0xFF, 0xFF, 0xFF, 0xFE, // opaque -2
		0x00, 0x00, 0x00, 0x01, // flag: response
		0x00, 0x00, 0x00, 0x05, 'F', 'O', 'U', 'N', 'D', // remark
		0x00, 0x00, 0x00, 0x16, // ext fields: 22 bytes
		0x00, 0x01, 'a', 0x00, 0x00, 0x00, 0x00, // "a" → ""
		0x00, 0x06, 'o', 'f', 'f', 's', 'e', 't', 0x00, 0x00, 0x00, 0x03, '-', '4', '2', // "offset" → "-42"
		'h', 'i', // body
	}
	cmd := &Command{
		Code: 0, Language: LangJava, Version: 317, Opaque: -2, Flag: FlagResponse, Remark: "FOUND",
		ExtFields: map[string]string{"offset": "-42", "a": ""}, Body: []byte("hi"), Serialize: RocketMQ,
	}
	got, err := cmd.AppendFrame(nil)
	require.NoError(t, err)
	require.Equal(t, golden, got)
	dec, err := DecodeFrame(golden[4:])
	require.NoError(t, err)
	require.Equal(t, cmd, dec)
}

// TestGoldenJSONFrame: the same request with a JSON header.
func TestGoldenJSONFrame(t *testing.T) {
	header := `{"code":105,"language":"GO","version":317,"opaque":1,"flag":0,"extFields":{"topic":"T"}}`
	require.Len(t, header, 88)
	golden := append([]byte{0x00, 0x00, 0x00, 0x5C, 0x00, 0x00, 0x00, 0x58}, header...)

	cmd := NewRequestWith(GetRouteInfoByTopic, &GetRouteInfoRequestHeader{Topic: "T"}, nil)
	cmd.Opaque = 1
	got, err := cmd.AppendFrame(nil)
	require.NoError(t, err)
	require.Equal(t, string(golden), string(got))
	dec, err := DecodeFrame(golden[4:])
	require.NoError(t, err)
	require.Equal(t, cmd, dec)
}

// TestDecodeForeignJSONHeaders reads headers as the Go client (jsoniter, empty remark) and a
// Java broker (fastjson, serializeTypeCurrentRPC) write them.
func TestDecodeForeignJSONHeaders(t *testing.T) {
	tests := []struct {
		name   string
		header string
		want   *Command
	}{
		{
			name:   "go client",
			header: `{"code":11,"language":"GO","version":317,"opaque":5,"flag":0,"remark":"","extFields":{"topic":"T","queueId":"0"}}`,
			want:   &Command{Code: 11, Language: LangGo, Version: 317, Opaque: 5, ExtFields: map[string]string{"topic": "T", "queueId": "0"}},
		},
		{
			name:   "java broker",
			header: `{"code":0,"extFields":{"msgId":"X","queueId":"1","queueOffset":"2"},"flag":1,"language":"JAVA","opaque":5,"serializeTypeCurrentRPC":"JSON","version":395}`,
			want:   &Command{Code: 0, Language: LangJava, Version: 395, Opaque: 5, Flag: 1, ExtFields: map[string]string{"msgId": "X", "queueId": "1", "queueOffset": "2"}},
		},
		{
			name:   "numeric language, no extFields, escapes",
			header: " {\"code\":34,\"language\":9,\"remark\":\"a\\\"b\\u00e9\\ud83d\\ude00\",\"flag\":2}\n",
			want:   &Command{Code: 34, Language: LangGo, Flag: FlagOneway, Remark: "a\"bé😀", ExtFields: map[string]string{}},
		},
		{
			name:   "unknown language, nested unknown fields",
			header: `{"code":1,"language":"COBOL","x":{"y":[1,2.5e3,{"z":null}],"w":true}}`,
			want:   &Command{Code: 1, Language: LangOther, ExtFields: map[string]string{}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			frame := binary.BigEndian.AppendUint32(nil, uint32(len(tt.header)))
			frame = append(frame, tt.header...)
			got, err := DecodeFrame(frame)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
			oracle, err := decodeJSONHeaderStd([]byte(tt.header))
			require.NoError(t, err)
			require.Equal(t, oracle, got, "encoding/json agrees")
		})
	}
}

func frameOf(mark uint32, rest ...byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, mark), rest...)
}

// binHeader builds a binary header with the given remark-length and ext bytes appended raw.
func binHeader(tail ...byte) []byte {
	h := []byte{0x00, 0x0B, 0x09, 0x01, 0x3D, 0, 0, 0, 1, 0, 0, 0, 0}
	return append(h, tail...)
}

func TestDecodeFrameBadInput(t *testing.T) {
	withMark := func(st byte, header []byte) []byte {
		return frameOf(uint32(st)<<24|uint32(len(header)), header...)
	}
	tests := []struct {
		name    string
		frame   []byte
		is      error
		message string
	}{
		{"empty", nil, ErrMalformedFrame, "0 bytes is too short for a header mark"},
		{"three bytes", []byte{0, 0, 0}, ErrMalformedFrame, "too short"},
		{"header longer than frame", frameOf(0x00000010, '{', '}'), ErrMalformedFrame, "header length 16 exceeds the 2 bytes after the mark"},
		{"max header length", frameOf(0x00FFFFFF), ErrMalformedFrame, "header length 16777215 exceeds the 0 bytes"},
		{"unknown serialize type", frameOf(0x02000000), ErrUnknownSerialize, "unknown serialize type 2"},
		{"unknown serialize type is a header error", frameOf(0x02000000), ErrMalformedHeader, "unknown serialize type 2"},
		{"serialize type 0xFF", frameOf(0xFF000000), ErrUnknownSerialize, "255"},
		{"invalid JSON", withMark(0, []byte(`{"code":`)), ErrMalformedHeader, "decode JSON header"},
		{"JSON not an object", withMark(0, []byte(`[1,2]`)), ErrMalformedHeader, "not an object"},
		{"JSON trailing garbage", withMark(0, []byte(`{} x`)), ErrMalformedHeader, "after top-level value"},
		{"JSON code overflows int32", withMark(0, []byte(`{"code":4000000000}`)), ErrMalformedHeader, "not an int32"},
		{"JSON ext value not a number", withMark(0, []byte(`{"extFields":{"a":-}}`)), ErrMalformedHeader, `(key "a")`},
		{"JSON extFields not an object", withMark(0, []byte(`{"extFields":"a"}`)), ErrMalformedHeader, `header field "extFields": "a" is not an object`},
		{"JSON raw control character", withMark(0, []byte("{\"remark\":\"a\nb\"}")), ErrMalformedHeader, "in string literal"},
		{"JSON empty header", withMark(0, nil), ErrMalformedHeader, "looking for a value"},
		{"binary header too short", withMark(1, []byte{0, 1, 2}), ErrMalformedHeader, "shorter than the fixed 17"},
		{"binary remark length negative", withMark(1, binHeader(0xFF, 0xFF, 0xFF, 0xFF)[:17]), ErrMalformedHeader, "remark length -1"},
		{"binary remark length past end", withMark(1, append(binHeader(0x00, 0x00, 0x10, 0x00), 'a')), ErrMalformedHeader, "remark length 4096 exceeds the 1 bytes left"},
		{"binary ext length past end", withMark(1, binHeader(0, 0, 0, 0, 0, 0, 0, 9, 0, 1)), ErrMalformedHeader, "ext fields length 9 exceeds the 2 bytes left"},
		{"binary ext length truncated", withMark(1, binHeader(0, 0, 0, 0, 0, 0)), ErrMalformedHeader, "truncated ext fields length"},
		{"binary ext key length past end", withMark(1, binHeader(0, 0, 0, 0, 0, 0, 0, 3, 0, 9, 'k')), ErrMalformedHeader, "ext field key length 9 exceeds the 1 bytes left"},
		{"binary ext key length truncated", withMark(1, binHeader(0, 0, 0, 0, 0, 0, 0, 1, 0)), ErrMalformedHeader, "truncated ext field key length"},
		{"binary ext value length negative", withMark(1, binHeader(0, 0, 0, 0, 0, 0, 0, 7, 0, 1, 'k', 0x80, 0, 0, 0)), ErrMalformedHeader, `ext field value length -2147483648 exceeds the 0 bytes left (key "k")`},
		{"binary bytes after ext fields", withMark(1, binHeader(0, 0, 0, 0, 0, 0, 0, 0, 'x')), ErrMalformedHeader, "1 bytes after the ext fields"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := DecodeFrame(tt.frame)
			require.Nil(t, c)
			require.ErrorIs(t, err, tt.is)
			require.ErrorContains(t, err, tt.message)
			// A frame is either broken (the stream is lost) or intact with a bad header
			// (the connection can answer and go on), never both.
			var he *HeaderError
			require.Equal(t, errors.As(err, &he), !errors.Is(err, ErrMalformedFrame), "%v", err)
		})
	}
}

func TestDecodeFrameTooLarge(t *testing.T) {
	_, err := DecodeFrame(make([]byte, MaxFrameSize+1))
	require.ErrorIs(t, err, ErrFrameTooLarge)
}

func TestAppendFrameErrors(t *testing.T) {
	t.Run("unknown serialize type", func(t *testing.T) {
		c := NewRequest(HeartBeat, nil, nil)
		c.Serialize = 7
		out, err := c.AppendFrame([]byte("keep"))
		require.ErrorIs(t, err, ErrUnknownSerialize)
		require.Equal(t, "keep", string(out))
	})
	t.Run("body too large", func(t *testing.T) {
		c := NewRequest(SendMessage, nil, make([]byte, MaxFrameSize))
		out, err := c.AppendFrame([]byte("keep"))
		require.ErrorIs(t, err, ErrFrameTooLarge)
		require.Equal(t, "keep", string(out))
	})
	t.Run("largest frame", func(t *testing.T) {
		c := NewRequest(SendMessage, nil, nil)
		c.Serialize = RocketMQ
		h, err := c.AppendFrame(nil)
		require.NoError(t, err)
		c.Body = make([]byte, MaxFrameSize-(len(h)-4))
		out, err := c.AppendFrame(nil)
		require.NoError(t, err)
		require.Len(t, out, MaxFrameSize+4)
		_, err = DecodeFrame(out[4:])
		require.NoError(t, err)
	})
}

func TestReadFrame(t *testing.T) {
	cmd := NewRequestWith(PullMessage, &PullMessageRequestHeader{Topic: "t"}, []byte("body"))
	frame, err := cmd.AppendFrame(nil)
	require.NoError(t, err)

	t.Run("two frames back to back", func(t *testing.T) {
		r := bufio.NewReader(bytes.NewReader(append(append([]byte{}, frame...), frame...)))
		for range 2 {
			got, err := ReadFrame(r, 0)
			require.NoError(t, err)
			require.Equal(t, cmd, got)
		}
		_, err := ReadFrame(r, 0)
		require.ErrorIs(t, err, io.EOF)
	})

	tests := []struct {
		name  string
		input []byte
		max   int
		is    error
		msg   string
	}{
		{"negative length", []byte{0xFF, 0xFF, 0xFF, 0xFF}, 0, ErrMalformedFrame, "length -1"},
		{"length below a header mark", []byte{0, 0, 0, 3, 0, 0, 0}, 0, ErrMalformedFrame, "length 3"},
		{"huge length, nothing allocated", []byte{0x7F, 0xFF, 0xFF, 0xFF}, 0, ErrFrameTooLarge, "length 2147483647 exceeds 16777216"},
		{"over the caller's limit", frame, 16, ErrFrameTooLarge, "exceeds 16"},
		{"truncated frame", frame[:len(frame)-1], 0, io.ErrUnexpectedEOF, "read frame of"},
		{"truncated length", frame[:2], 0, io.ErrUnexpectedEOF, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadFrame(bufio.NewReader(bytes.NewReader(tt.input)), tt.max)
			require.ErrorIs(t, err, tt.is)
			require.ErrorContains(t, err, tt.msg)
		})
	}

	t.Run("a lying length allocates nothing", func(t *testing.T) {
		in := []byte{0x7F, 0xFF, 0xFF, 0xFF}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range 100 {
			_, err := ReadFrame(bufio.NewReaderSize(bytes.NewReader(in), 16), 0)
			require.ErrorIs(t, err, ErrFrameTooLarge)
		}
		runtime.ReadMemStats(&after)
		require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "100 reads of a 2 GiB length")
	})
}

// TestJSONHeaderEscaping checks the hand-written encoder's string escaping with values
// encoding/json must read back identically.
func TestJSONHeaderEscaping(t *testing.T) {
	values := []string{
		"", "plain", `quote " backslash \ slash /`, "\x00\x01\x1f\x7f", "tab\tnl\nr\r\b\f",
		"<html>&amp;", "é 中文 😀", "\u2028\u2029", "bad utf8 \xff\xfe end", "\xed\xa0\x80",
		"properties TAGS\x01a\x02KEYS\x01b c\x02",
	}
	for _, v := range values {
		c := &Command{Code: 1, Remark: v, ExtFields: map[string]string{v: v, "k": v}}
		frame, err := c.AppendFrame(nil)
		require.NoError(t, err)
		header := frame[8:]
		require.True(t, json.Valid(header), "%q → %s", v, header)
		if v != "" {
			var std map[string]any
			require.NoError(t, json.Unmarshal(header, &std))
			require.Equal(t, validUTF8PerByte(v), std["remark"])
		}
		got, err := DecodeFrame(frame[4:])
		require.NoError(t, err)
		oracle, err := decodeJSONHeaderStd(header)
		require.NoError(t, err)
		require.Equal(t, oracle, got)
	}
}

// TestJSONHeaderParity runs odd but valid (and invalid) headers through the hand-written
// decoder and encoding/json and requires the same outcome.
func TestJSONHeaderParity(t *testing.T) {
	headers := []string{
		`null`, ` null `, `{}`, `{"CODE":3}`, `{"Code":3,"code":4}`, `{"code":null}`, `{"code":-0}`,
		`{"code":1.0}`, `{"code":1e2}`, `{"code":"1"}`, `{"code":true}`, `{"opaque":2147483648}`,
		`{"language":null}`, `{"language":{}}`, `{"language":300}`, `{"language":-1}`, `{"language":"\u0047O"}`,
		`{"remark":"a","remark":null}`, `{"remark":1}`, `{"extFields":{"a":"1"},"extFields":{"b":"2"}}`,
		`{"extFields":{"a":"1"},"extFields":null}`, `{"extFields":{"a":null}}`, `{"extFields":[]}`,
		`{"extFields":{"a":"1","a":"2"}}`, `{"ext\u0046ields":{"a":"b"}}`, `{"remark":"\ud800"}`,
		`{"remark":"\ud800\u0041"}`, `{"remark":"\udc00\ud800"}`, `{"remark":"\ud83d\ude00"}`,
		"{\"remark\":\"\xff\"}", "{\"k\xff\":1}", "{\"extFields\":{\"k\xff\":\"\xff\"}}", `{"x":[[[[]]]]}`, `{"x":01}`, `{"x":1.}`, `{"x":-}`,
		`{"x":tru}`, `{"x":"\x"}`, `{"x":"\u12"}`, `{,}`, `{"a":1,}`, `[]`, `"s"`, `1`, `{"a" 1}`,
		`{"flag":1}{}`, "{\"VERſION\":5}", `{"version":32768}`, `{"code":-32768}`,
		// extFields values of every JSON type.
		`{"extFields":{"a":0,"b":-1,"c":1.5,"d":1e3,"e":-0.0E+2,"f":true,"g":false,"h":null}}`,
		`{"extFields":{"a":{"x":[1, {"y":null}]},"b":[ ],"c":{ },"d":[true,"s"]}}`,
		`{"extFields":{"a":"1","a":null}}`, `{"extFields":{"a":null,"a":2}}`, `{"extFields":{"a":1},"extFields":{"a":null}}`,
		"{\"extFields\":{\"a\":[\"\xff\"]}}", `{"extFields":{"a":01}}`, `{"extFields":{"a":1.}}`, `{"extFields":{"a":tru}}`,
		`{"extFields":{"a":{"b"}}}`, `{"extFields":{"a":[1,]}}`, `{"extFields":{"a":nul}}`, `{"extFields":{"a" : 7 }}`,
	}
	for _, h := range headers {
		got, err := decodeJSONHeader([]byte(h))
		want, werr := decodeJSONHeaderStd([]byte(h))
		if werr != nil {
			require.Error(t, err, "%s: encoding/json says %v", h, werr)
			continue
		}
		require.NoError(t, err, h)
		require.Equal(t, want, got, h)
	}
}

// validUTF8PerByte replaces each byte of invalid UTF-8 with U+FFFD, as encoding/json does
// (strings.ToValidUTF8 replaces whole runs).
func validUTF8PerByte(s string) string {
	var b strings.Builder
	for _, r := range s {
		b.WriteRune(r)
	}
	return b.String()
}

// TestJSONHeaderDepthParity: encoding/json refuses more than 10000 nested objects and arrays;
// so does the hand-written decoder, at the same depth.
func TestJSONHeaderDepthParity(t *testing.T) {
	for _, n := range []int{9998, 9999, 10000} {
		h := `{"x":` + strings.Repeat("[", n) + "1" + strings.Repeat("]", n) + `}`
		_, werr := decodeJSONHeaderStd([]byte(h))
		_, err := decodeJSONHeader([]byte(h))
		require.Equal(t, werr == nil, err == nil, "depth %d: encoding/json %v, ours %v", n, werr, err)
	}
	for _, n := range []int{9997, 9998, 9999} {
		h := `{"extFields":{"x":` + strings.Repeat("[", n) + "1" + strings.Repeat("]", n) + `}}`
		_, werr := decodeJSONHeaderStd([]byte(h))
		_, err := decodeJSONHeader([]byte(h))
		require.Equal(t, werr == nil, err == nil, "extFields depth %d: encoding/json %v, ours %v", n, werr, err)
	}
	top := strings.Repeat("[", 10000) + strings.Repeat("]", 10000)
	_, werr := decodeJSONHeaderStd([]byte(top))
	_, err := decodeJSONHeader([]byte(top))
	require.Error(t, werr)
	require.Error(t, err)
}

func TestLanguageCodes(t *testing.T) {
	for i, name := range []string{"JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP", "OMS", "RUST", "NODE_JS"} {
		require.Equal(t, name, LanguageCode(i).String())
		require.Equal(t, LanguageCode(i), ParseLanguage(name))
	}
	require.Equal(t, "OTHER", LanguageCode(-3).String())
	require.Equal(t, LangOther, ParseLanguage("go"))
}

func TestCodeStrings(t *testing.T) {
	require.Equal(t, "SEND_BATCH_MESSAGE", SendBatchMessage.String())
	require.Equal(t, "REQUEST_CODE_999", RequestCode(999).String())
	require.Equal(t, "FLOW_CONTROL", FlowControl.String())
	require.Equal(t, "RESPONSE_CODE_-1", ResponseCode(-1).String())
	require.Equal(t, "SERIALIZE_TYPE_9", SerializeType(9).String())
}

// TestDecodeJSONHeaderExtFieldsOfAnyType: other RocketMQ clients write header values as JSON
// numbers and booleans, and the Java broker reads them as their text; so does flowd, and the
// typed headers then parse that text.
func TestDecodeJSONHeaderExtFieldsOfAnyType(t *testing.T) {
	header := `{"code":11,"language":"CPP","opaque":9,"extFields":{"consumerGroup":"g","topic":"T",` +
		`"queueId":0,"queueOffset":-1,"maxMsgNums":32,"sysFlag":2,"commitOffset":1e3,"suspendTimeoutMillis":20000,` +
		`"subVersion":1.5,"expressionType":null,"lite":true,"batch":false,"obj":{"a": [1, 2]},"arr":[]}}`
	got, err := DecodeFrame(append(binary.BigEndian.AppendUint32(nil, uint32(len(header))), header...))
	require.NoError(t, err)
	require.Equal(t, map[string]string{
		"consumerGroup": "g", "topic": "T", "queueId": "0", "queueOffset": "-1", "maxMsgNums": "32",
		"sysFlag": "2", "commitOffset": "1e3", "suspendTimeoutMillis": "20000", "subVersion": "1.5",
		"lite": "true", "batch": "false", "obj": `{"a": [1, 2]}`, "arr": "[]",
	}, got.ExtFields, "numbers keep their exact text; null is absent")
	oracle, err := decodeJSONHeaderStd([]byte(header))
	require.NoError(t, err)
	require.Equal(t, oracle.ExtFields, got.ExtFields, "encoding/json agrees")

	// The typed header reads the integers; a number that is not an integer is reported by
	// name, like any unparsable value.
	var h PullMessageRequestHeader
	err = got.DecodeHeader(&h)
	var fe *FieldError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "commitOffset", fe.Field)
	require.ErrorContains(t, err, `header field "commitOffset": "1e3" is not a valid int64`)
	got.ExtFields["commitOffset"] = "0"
	got.ExtFields["subVersion"] = "7"
	require.NoError(t, got.DecodeHeader(&h))
	require.Equal(t, int32(0), h.QueueID)
	require.Equal(t, int64(-1), h.QueueOffset)
	require.Equal(t, int64(20000), h.SuspendTimeoutMillis)

	var send SendMessageRequestHeader
	sendExt := `{"code":10,"extFields":{"producerGroup":"p","topic":"T","defaultTopic":"TBW102","defaultTopicQueueNums":4,` +
		`"queueId":0,"sysFlag":0,"bornTimestamp":1700000000000,"flag":0,"unitMode":false,"batch":true,"reconsumeTimes":0}}`
	c, err := DecodeFrame(append(binary.BigEndian.AppendUint32(nil, uint32(len(sendExt))), sendExt...))
	require.NoError(t, err)
	require.NoError(t, c.DecodeHeader(&send))
	require.True(t, send.Batch)
	require.Equal(t, int64(1700000000000), send.BornTimestamp)
}

// TestDecodeFrameHeaderErrorKeepsTheOpaque: a header that is valid JSON but has a field of
// the wrong type still gives its opaque (and code and flag), wherever the opaque is, so that
// the request can be answered; a syntax error gives it only when it came before the error.
func TestDecodeFrameHeaderErrorKeepsTheOpaque(t *testing.T) {
	tests := []struct {
		name        string
		header      string
		opaqueKnown bool
		opaque      int32
		msg         string
	}{
		{"bad code before the opaque", `{"code":"x","flag":2,"opaque":7}`, true, 7, `header field "code": "x" is not an int32`},
		{"bad extFields before the opaque", `{"code":10,"extFields":[1],"opaque":7}`, true, 7, `header field "extFields": [1] is not an object`},
		{"code out of range", `{"code":4000000000,"opaque":7}`, true, 7, `header field "code": 4000000000 is not an int32`},
		{"bad remark", `{"remark":{},"opaque":-3}`, true, -3, `header field "remark": {} is not a string`},
		{"bad opaque", `{"code":10,"opaque":"7"}`, false, 0, `header field "opaque"`},
		{"syntax error after the opaque", `{"opaque":7,"code":10,"extFields":{"a":-}}`, true, 7, `(key "a")`},
		{"syntax error before the opaque", `{"code":10,"extFields":{"a":-},"opaque":7}`, false, 0, `(key "a")`},
		{"not an object", `[{"opaque":7}]`, false, 0, "not an object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			frame := append(binary.BigEndian.AppendUint32(nil, uint32(len(tt.header))), tt.header...)
			c, err := DecodeFrame(frame)
			require.Nil(t, c)
			var he *HeaderError
			require.ErrorAs(t, err, &he)
			require.ErrorIs(t, err, ErrMalformedHeader)
			require.NotErrorIs(t, err, ErrMalformedFrame)
			require.ErrorContains(t, err, tt.msg)
			require.Equal(t, tt.opaqueKnown, he.OpaqueKnown)
			if tt.opaqueKnown {
				require.Equal(t, tt.opaque, he.Opaque)
			}
			require.Equal(t, JSON, he.Serialize)
			_, werr := decodeJSONHeaderStd([]byte(tt.header))
			require.Error(t, werr, "encoding/json refuses it too")
		})
	}

	t.Run("flag and code are kept", func(t *testing.T) {
		h := `{"code":11,"flag":2,"opaque":5,"version":"x"}`
		_, err := DecodeFrame(append(binary.BigEndian.AppendUint32(nil, uint32(len(h))), h...))
		var he *HeaderError
		require.ErrorAs(t, err, &he)
		require.Equal(t, int32(11), he.Code)
		require.True(t, he.IsOneway())
		require.False(t, he.IsResponse())
	})
	t.Run("binary header with its fixed part", func(t *testing.T) {
		h := binHeader(0, 0, 0, 0, 0, 0, 0, 0, 'x') // opaque 1, then a stray byte
		_, err := DecodeFrame(frameOf(uint32(RocketMQ)<<24|uint32(len(h)), h...))
		var he *HeaderError
		require.ErrorAs(t, err, &he)
		require.True(t, he.OpaqueKnown)
		require.Equal(t, int32(1), he.Opaque)
		require.Equal(t, int32(11), he.Code)
	})
	t.Run("binary header without its fixed part", func(t *testing.T) {
		_, err := DecodeFrame(frameOf(uint32(RocketMQ)<<24|3, 0, 1, 2))
		var he *HeaderError
		require.ErrorAs(t, err, &he)
		require.False(t, he.OpaqueKnown)
	})
}

// stallingReader returns its data, then blocks-free reports a stall: the peer announced more
// than it sent.
type stallingReader struct {
	data []byte
	err  error
}

func (r *stallingReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

// TestReadFrameAllocatesAsBytesArrive: a peer that announces a 16 MiB frame and sends a few
// KiB costs about what it sent, not 16 MiB; a frame that does arrive whole in small pieces
// decodes intact.
func TestReadFrameAllocatesAsBytesArrive(t *testing.T) {
	prefix := binary.BigEndian.AppendUint32(nil, MaxFrameSize)
	partial := append(prefix, make([]byte, 4096)...)
	stalled := errors.New("stalled")
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 50 {
		_, err := ReadFrame(bufio.NewReaderSize(&stallingReader{data: partial, err: stalled}, 1024), 0)
		require.ErrorIs(t, err, stalled)
		require.ErrorContains(t, err, "read frame of 16777216 bytes after 4096")
	}
	runtime.ReadMemStats(&after)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(16<<20), "50 frames of 16 MiB announced, 4 KiB sent")

	body := make([]byte, 3<<20+17)
	for i := range body {
		body[i] = byte(i * 7)
	}
	cmd := NewRequestWith(SendMessage, &GetRouteInfoRequestHeader{Topic: "t"}, body)
	frame, err := cmd.AppendFrame(nil)
	require.NoError(t, err)
	got, err := ReadFrame(bufio.NewReaderSize(iotest.HalfReader(bytes.NewReader(frame)), 16), 0)
	require.NoError(t, err)
	require.Equal(t, cmd, got)
}

// A header given as Command.Fields reads back, in both serialize types, exactly as the same
// header encoded into ExtFields, alone or after other ExtFields.
func TestFieldsEncodeAsExtFields(t *testing.T) {
	h := &SendMessageResponseHeader{MsgID: "0A00000100002A9F000000000000002A", QueueID: 3, QueueOffset: -7, TransactionID: "tx \"1\"", TraceOn: true}
	for _, st := range []SerializeType{JSON, RocketMQ} {
		for _, extra := range []map[string]string{nil, {"a": "1", "zz": "2"}} {
			want := h.Encode()
			c := &Command{Code: 0, Flag: FlagResponse, Opaque: 9, Serialize: st, ExtFields: map[string]string{}, Fields: h}
			for k, v := range extra {
				c.ExtFields[k] = v
				want[k] = v
			}
			frame, err := c.AppendFrame(nil)
			require.NoError(t, err)
			got, err := DecodeFrame(frame[4:])
			require.NoError(t, err, "serialize %d", st)
			require.Equal(t, want, got.ExtFields, "serialize %d, extra %v", st, extra)
			var back SendMessageResponseHeader
			require.NoError(t, got.DecodeHeader(&back))
			require.Equal(t, *h, back)
		}
	}
}

// A code wider than the binary header's 16 bits (RocketMQ 5's pop codes) goes out with a
// JSON header even on a connection that writes binary ones, and decodes whole.
func TestWideCodeGoesOutAsJSON(t *testing.T) {
	c := NewRequest(PopMessage, map[string]string{"topic": "t"}, nil)
	c.Serialize = RocketMQ
	frame, err := c.AppendFrame(nil)
	require.NoError(t, err)
	require.Equal(t, byte(JSON), frame[4], "the header mark's serialize type")
	got, err := DecodeFrame(frame[4:])
	require.NoError(t, err)
	require.Equal(t, PopMessage, got.RequestCode())
	require.Equal(t, JSON, got.Serialize)
	require.Equal(t, "t", got.ExtFields["topic"])

	c = NewRequest(PullMessage, nil, nil)
	c.Serialize = RocketMQ
	frame, err = c.AppendFrame(nil)
	require.NoError(t, err)
	require.Equal(t, byte(RocketMQ), frame[4])
}
