package protocol

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"
)

// jsonSafe is what a string becomes after a trip through a JSON header: invalid UTF-8 turns
// into U+FFFD byte by byte.
func jsonSafe(s string) string { return validUTF8PerByte(s) }

// throughJSON is what c becomes when written with a JSON header and read back.
func throughJSON(c *Command) *Command {
	out := *c
	out.Language = ParseLanguage(c.Language.String())
	out.Remark = jsonSafe(c.Remark)
	out.ExtFields = map[string]string{}
	for _, k := range slices.Sorted(maps.Keys(c.ExtFields)) { // the encoder's order: last wins
		out.ExtFields[jsonSafe(k)] = jsonSafe(c.ExtFields[k])
	}
	out.Serialize = JSON
	return &out
}

func FuzzDecodeFrame(f *testing.F) {
	for _, st := range []SerializeType{JSON, RocketMQ} {
		for _, c := range []*Command{
			typicalPullRequest(st),
			NewRequestWith(GetRouteInfoByTopic, &GetRouteInfoRequestHeader{Topic: "T"}, nil),
			{Code: 0, Flag: FlagResponse, Remark: "é\x00\xff", ExtFields: map[string]string{"a": "", "\x01": "\"\\"}, Body: []byte("body"), Serialize: st},
		} {
			c.Serialize = st
			frame, err := c.AppendFrame(nil)
			require.NoError(f, err)
			f.Add(frame[4:])
		}
	}
	for _, h := range []string{
		`null`, `{}`, `{"CODE":1,"code":2}`, `{"extFields":{"a":"1"},"extFields":null}`, `{"remark":"\ud800\u0041"}`,
		`{"language":9,"x":[{"y":[]}]}`, "{\"k\xff\":\"\xff\"}", `{"code":1e2}`, `{"a":1,}`,
		// extFields values of every JSON type, as other RocketMQ clients write them.
		`{"code":10,"opaque":3,"extFields":{"queueId":0,"offset":-1,"x":1.5,"y":1e3,"batch":false,"u":true,"n":null}}`,
		`{"extFields":{"o":{"a":[1,{"b":null}]},"l":[ ],"s":"v","s":null}}`, `{"extFields":{"a":1},"extFields":{"a":null}}`,
		// wrong types before and after the opaque
		`{"code":"x","opaque":7}`, `{"extFields":[],"opaque":7,"flag":"1"}`, `{"opaque":7,"extFields":{"a":-}}`,
	} {
		f.Add(binary.BigEndian.AppendUint32(nil, uint32(len(h))) /* mark */)
		f.Add(append(binary.BigEndian.AppendUint32(nil, uint32(len(h))), h...))
	}
	f.Add([]byte{1, 0, 0, 17, 0, 0, 9, 1, 0x3D, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF})
	f.Add([]byte{2, 0, 0, 0})
	f.Add([]byte{0, 0xFF, 0xFF, 0xFF})

	f.Fuzz(func(t *testing.T, frame []byte) {
		c, err := DecodeFrame(frame)

		// Reading the ext fields raw accepts what the map accepts, with the same fields.
		raw, rerr := decodeFrame(frame, false, ReadOptions{RawExt: func(RequestCode) bool { return true }, RawResponses: true})
		require.Equal(t, err == nil, rerr == nil, "map: %v; raw: %v", err, rerr)
		if err == nil && raw.RawExt != "" {
			require.Nil(t, raw.ExtFields)
			for k, v := range c.ExtFields {
				require.Equal(t, v, raw.Ext(k), "field %q", k)
			}
		}
		if err == nil {
			// Built later, the map is the one built on reading.
			raw.BuildExtFields()
			require.Equal(t, c.ExtFields, raw.ExtFields)
		}

		// A frame is broken (its lengths do not add up) or intact with a header that cannot
		// be read, never both; only the second may be answered.
		var he *HeaderError
		isHeaderErr := errors.As(err, &he)
		if err != nil {
			require.NotEqual(t, isHeaderErr, errors.Is(err, ErrMalformedFrame), "%v", err)
		}
		intact := len(frame) >= 4 && int(binary.BigEndian.Uint32(frame)&0xFFFFFF) <= len(frame)-4
		if err != nil && intact {
			require.True(t, isHeaderErr, "an intact frame gives a HeaderError: %v", err)
		}

		// The hand-written JSON header decoder accepts exactly what encoding/json accepts,
		// with the same result.
		if intact && frame[0] == byte(JSON) {
			if n := int(binary.BigEndian.Uint32(frame) & 0xFFFFFF); n <= len(frame)-4 {
				header := frame[4 : 4+n]
				want, werr := decodeJSONHeaderStd(header)
				if werr != nil {
					require.Error(t, err, "encoding/json rejects the header: %v", werr)
					// An opaque recovered from a bad header is the one encoding/json reads.
					var o struct {
						Opaque int32 `json:"opaque"`
					}
					if he.OpaqueKnown && json.Valid(header) && json.Unmarshal(header, &o) == nil {
						require.Equal(t, o.Opaque, he.Opaque)
					}
				} else {
					require.NoError(t, err)
					got := *c
					got.Body, got.Serialize = nil, 0
					require.Equal(t, want, &got)
				}
			}
		}
		if err != nil {
			require.Nil(t, c)
			return
		}

		// Re-encoding in the same form gives the same command; in the other form, the same
		// up to what JSON can carry.
		for _, st := range []SerializeType{JSON, RocketMQ} {
			c2 := *c
			c2.Serialize = st
			enc, err := c2.AppendFrame(nil)
			if errors.Is(err, ErrFrameTooLarge) {
				continue
			}
			require.NoError(t, err)
			require.Equal(t, uint32(len(enc)-4), binary.BigEndian.Uint32(enc))
			back, err := DecodeFrame(enc[4:])
			require.NoError(t, err)
			want := &c2
			if st == JSON {
				want = throughJSON(&c2)
			}
			require.Equal(t, want, back)
		}
	})
}

func FuzzDecodeStored(f *testing.F) {
	f.Add(goldenStored)
	for _, m := range storedCases() {
		if m.StoredSize() > 4096 {
			continue
		}
		b, err := AppendStored(nil, m)
		require.NoError(f, err)
		f.Add(b)
	}
	var two []byte
	two = append(two, goldenStored...)
	two = append(two, goldenStored...)
	f.Add(two)
	f.Add(goldenStored[:40])
	f.Add([]byte{0, 0, 0, 8, 0xDA, 0xA3, 0x20, 0xA7})
	f.Add([]byte{0xFF, 0xFF, 0xFF, 0xFF, 0xDA, 0xA3, 0x20, 0xA7})

	f.Fuzz(func(t *testing.T, b []byte) {
		m, n, err := DecodeStored(b)
		if err != nil {
			require.Nil(t, m)
			require.ErrorIs(t, err, ErrMalformedMessage)
			return
		}
		require.Equal(t, int(m.StoreSize), n)
		require.LessOrEqual(t, n, len(b))
		raw := b[:n]

		// rocketmq-client-go reads the same fields out of it.
		g := primitive.DecodeMessage(raw)
		require.Len(t, g, 1)
		require.Equal(t, m.Topic, g[0].Topic)
		require.Equal(t, m.CommitLogOffset, g[0].CommitLogOffset)
		require.Equal(t, m.QueueOffset, g[0].QueueOffset)
		require.Equal(t, m.StoreTimestamp, g[0].StoreTimestamp)
		require.Equal(t, OffsetMsgID(m.StoreHost, m.CommitLogOffset), g[0].OffsetMsgId)
		if m.SysFlag&MsgFlagCompressed == 0 {
			require.Equal(t, string(m.Body), string(g[0].Body))
		}

		// Re-encoding reproduces the message, and the bytes when the input was canonical.
		m2 := *m
		enc, err := AppendStored(nil, &m2)
		if m.Topic == "" || propertiesLen(m.Properties) > MaxPropertiesLength {
			require.Error(t, err)
			return
		}
		require.NoError(t, err)
		back, _, err := DecodeStored(enc)
		require.NoError(t, err)
		require.Equal(t, &m2, back)
		props := raw[storedPropertiesAt(m):]
		if m2.SysFlag == m.SysFlag && bytes.Equal(props, AppendProperties(nil, m.Properties)) && canonicalHosts(m) {
			require.Equal(t, raw, enc)
		}
	})
}

// storedPropertiesAt is where the properties of the decoded message m start in its encoding.
func storedPropertiesAt(m *MessageExt) int {
	return StoreTimestampAt(m.SysFlag) + 8 + hostLen(m.SysFlag, MsgFlagStoreHostV6) + 4 + 8 +
		4 + len(m.Body) + 1 + len(m.Topic) + 2
}

// canonicalHosts reports whether m's addresses encode back to the same bytes: an IPv4-mapped
// address stored under a v6 flag is re-encoded as IPv4.
func canonicalHosts(m *MessageExt) bool {
	for _, a := range []netip.Addr{m.BornHost.Addr(), m.StoreHost.Addr()} {
		if a.Is4In6() {
			return false
		}
	}
	return true
}

func FuzzDecodeBatch(f *testing.F) {
	b, err := EncodeBatch([]*Message{
		{Body: []byte("one"), Properties: map[string]string{PropertyTags: "a"}},
		{Flag: -1, Properties: map[string]string{}},
	})
	require.NoError(f, err)
	f.Add(b)
	f.Add(b[:30])
	f.Add([]byte{0, 0, 0, 22, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0x7F, 0xFF, 0xFF, 0xFF})
	f.Add([]byte{})

	f.Fuzz(func(t *testing.T, b []byte) {
		msgs, err := DecodeBatch(b)
		entries, rawErr := DecodeBatchEntries(b)
		if err != nil {
			require.Nil(t, msgs)
			require.ErrorIs(t, err, ErrMalformedMessage)
			require.EqualError(t, rawErr, err.Error(), "DecodeBatchEntries refuses what DecodeBatch does")
			return
		}
		require.NotEmpty(t, msgs)
		require.NoError(t, rawErr)
		require.Len(t, entries, len(msgs))
		for i, e := range entries {
			require.Equal(t, msgs[i].Flag, e.Flag)
			require.Equal(t, msgs[i].Body, e.Body)
			props, err := DecodeProperties(e.Properties)
			require.NoError(t, err)
			require.Equal(t, msgs[i].Properties, props)
			stamped, err := DecodeProperties(AppendSetProperty(nil, e.Properties, "CLUSTER", "c"))
			require.NoError(t, err)
			props["CLUSTER"] = "c"
			require.Equal(t, props, stamped, "AppendSetProperty sets one key and keeps the others")
		}
		enc, err := EncodeBatch(msgs)
		for _, m := range msgs {
			if propertiesLen(m.Properties) > MaxPropertiesLength {
				require.Error(t, err)
				return
			}
		}
		require.NoError(t, err)
		back, err := DecodeBatch(enc)
		require.NoError(t, err)
		require.Equal(t, msgs, back)
	})
}

func FuzzTopicRouteData(f *testing.F) {
	b, err := sampleRoute().Encode()
	require.NoError(f, err)
	f.Add(b)
	f.Add([]byte(`{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911",1:"x:1"},"brokerName":"b","cluster":"c"}],"queueDatas":[{"brokerName":"b","perm":6,"readQueueNums":4,"topicSynFlag":0,"writeQueueNums":4}]}`))
	f.Add([]byte(`{"brokerDatas":[{"brokerAddrs":{}}],"queueDatas":[],"orderTopicConf":"x"}`))
	f.Add([]byte(`{{"a":1}:2}`))
	f.Add([]byte(`{0:[{1:{2:3}}]}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"queueDatas":null}`))

	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeTopicRouteData(b)
		if err != nil {
			require.Nil(t, r)
			require.ErrorIs(t, err, ErrMalformedJSON)
			return
		}
		enc, err := r.Encode()
		if err != nil {
			require.ErrorContains(t, err, "encode route")
			return
		}
		back, err := DecodeTopicRouteData(enc)
		require.NoError(t, err)
		want := *r
		if want.QueueDatas == nil {
			want.QueueDatas = []QueueData{}
		}
		if want.FilterServerTable == nil {
			want.FilterServerTable = map[string][]string{}
		}
		want.BrokerDatas = slices.Clone(r.BrokerDatas)
		for i := range want.BrokerDatas {
			if want.BrokerDatas[i].BrokerAddrs == nil {
				want.BrokerDatas[i].BrokerAddrs = map[int64]string{}
			}
		}
		if want.BrokerDatas == nil {
			want.BrokerDatas = []BrokerData{}
		}
		if back.BrokerDatas == nil {
			back.BrokerDatas = []BrokerData{}
		}
		require.Equal(t, &want, back)

		// What we write, the Go client reads the same way.
		g, err := goClientParseRoute(string(enc))
		require.NoError(t, err)
		require.Len(t, g.BrokerDatas, len(want.BrokerDatas))
		for i := range g.BrokerDatas {
			require.Equal(t, want.BrokerDatas[i], g.BrokerDatas[i])
		}
	})
}

func FuzzResetOffsetBody(f *testing.F) {
	b, err := (&ResetOffsetBody{OffsetTable: map[MessageQueue]int64{{Topic: "t", BrokerName: "b"}: 1, {Topic: "t", BrokerName: "b", QueueID: 1}: -5}}).Encode()
	require.NoError(f, err)
	f.Add(b)
	f.Add([]byte(`{"offsetTable":[[{"topic":"t","brokerName":"b","queueId":0},1]]}`))
	f.Add([]byte(`{"offsetTable":{}}`))

	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeResetOffsetBody(b)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformedJSON)
			return
		}
		enc, err := r.Encode()
		if err != nil {
			return // names the Go client could not split
		}
		back, err := DecodeResetOffsetBody(enc)
		require.NoError(t, err)
		require.Equal(t, r.OffsetTable, back.OffsetTable)
		if len(r.OffsetTable) > 0 {
			got := goClientParseResetOffsets(t, enc)
			require.Len(t, got, len(r.OffsetTable))
		}
	})
}

func FuzzDecompressBody(f *testing.F) {
	for _, in := range [][]byte{nil, []byte("hello"), bytes.Repeat([]byte("ab"), 3000)} {
		c, err := CompressBody(in, DefaultCompressLevel)
		require.NoError(f, err)
		f.Add(c, 100)
	}
	f.Add([]byte("not zlib"), 10)

	f.Fuzz(func(t *testing.T, b []byte, limit int) {
		limit = 1 + abs(limit)%(1<<16)
		out, err := DecompressBody(b, limit)
		require.LessOrEqual(t, len(out), limit)
		require.LessOrEqual(t, cap(out), limit)

		// The standard reader, bounded, agrees.
		r, zerr := zlib.NewReader(bytes.NewReader(b))
		var std []byte
		if zerr == nil {
			std, zerr = io.ReadAll(io.LimitReader(r, int64(limit)+1))
		}
		switch {
		case err == nil:
			require.NoError(t, zerr)
			require.Equal(t, std, out)
		case errors.Is(err, ErrBodyTooLarge):
			require.Greater(t, len(std), limit)
		default:
			require.ErrorIs(t, err, ErrBadCompressedBody)
			require.Error(t, zerr)
		}
	})
}

func abs(n int) int {
	if n < 0 {
		if n == -n { // math.MinInt
			return 0
		}
		return -n
	}
	return n
}
