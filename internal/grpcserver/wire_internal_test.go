package grpcserver

import (
	"bytes"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/flowd-io/flowd/broker"
	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
	"github.com/flowd-io/flowd/protocol"
)

func newWireServer(t testing.TB) *Server {
	t.Helper()
	b, err := broker.New(broker.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", NamesrvListen: "off", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	s, err := New(Config{Broker: b, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	return s
}

// wireCases are stored messages with every field the delivery encoding writes, and without.
func wireCases(t testing.TB) map[string]*protocol.MessageExt {
	t.Helper()
	body := bytes.Repeat([]byte("flowd "), 200)
	compressed, err := protocol.CompressBody(body, 5)
	require.NoError(t, err)
	base := func(props map[string]string) *protocol.MessageExt {
		return &protocol.MessageExt{
			Message: protocol.Message{Topic: "wire", Body: body, Properties: props},
			QueueID: 3, QueueOffset: 12345, CommitLogOffset: 987654,
			BornTimestamp: 1_700_000_000_123, StoreTimestamp: 1_700_000_000_456,
			BornHost:  netip.MustParseAddrPort("10.1.2.3:40000"),
			StoreHost: netip.MustParseAddrPort("127.0.0.1:10911"),
		}
	}
	cases := map[string]*protocol.MessageExt{
		"bare":    base(nil),
		"id only": base(map[string]string{protocol.PropertyUniqueKey: "01ABCDEF"}),
		"tag keys props": base(map[string]string{
			protocol.PropertyUniqueKey: "01AB", protocol.PropertyTags: "TagA", protocol.PropertyKeys: "k1 k2  k3",
			"color": "blue", "empty": "", "": "no key", "ünïcode": "välue",
		}),
		"fifo trace": base(map[string]string{propShardingKey: "group-7", propTraceContext: "00-abc-def-01", protocol.PropertyTags: ""}),
		"delayed":    base(map[string]string{propDeliverAt: "1700000060000"}),
		"bad delay":  base(map[string]string{propDeliverAt: "soon"}),
		"half":       base(map[string]string{protocol.PropertyTransactionPrepared: "true"}),
		"system keys hidden": base(map[string]string{
			protocol.PropertyReconsumeTimes: "2", protocol.PropertyRealTopic: "x", "MIN_OFFSET": "0", "user": "kept",
		}),
	}
	v6 := base(map[string]string{"a": "b"})
	v6.BornHost = netip.MustParseAddrPort("[fe80::1%eth0]:1234")
	v6.StoreHost = netip.MustParseAddrPort("[2001:db8::7]:8081")
	cases["ipv6 hosts"] = v6
	zero := base(nil)
	zero.BornHost, zero.StoreHost = netip.AddrPort{}, netip.AddrPort{}
	zero.QueueID, zero.QueueOffset = 0, 0
	zero.BornTimestamp, zero.StoreTimestamp = 0, -1500 // before the epoch: negative seconds
	cases["zero hosts and times"] = zero
	comp := base(map[string]string{"z": "1"})
	comp.Body, comp.SysFlag = compressed, protocol.MsgFlagCompressed
	cases["compressed body"] = comp
	commit := base(nil)
	commit.SysFlag = protocol.MsgTransactionCommit
	cases["committed transaction"] = commit
	empty := base(nil)
	empty.Body = nil
	cases["empty body"] = empty
	return cases
}

// TestEncodedDeliveryMatchesToProto: the hand-written wire format of a delivery decodes, with
// the generated types, to exactly the message toProto builds, and is as long as protobuf's
// own encoding of it, for every shape of message and delivery.
func TestEncodedDeliveryMatchesToProto(t *testing.T) {
	s := newWireServer(t)
	deliveries := map[string]*delivery{
		"no delivery": nil,
		"first":       {handle: "aGFuZGxl", attempt: 1, invisibleUntil: time.Now().Add(30 * time.Second)},
		"expired":     {handle: "aGFuZGxl", attempt: 17, invisibleUntil: time.Now().Add(-1500 * time.Millisecond)},
		"long":        {handle: "aGFuZGxl", attempt: 2, invisibleUntil: time.Now().Add(12 * time.Hour)},
	}
	for name, m := range wireCases(t) {
		for dname, d := range deliveries {
			t.Run(name+"/"+dname, func(t *testing.T) {
				o := s.outOf(m, "consumer-topic", d)
				require.True(t, o.wireSafe())
				enc, err := o.encodeDelivery()
				require.NoError(t, err)
				want := &pb.ReceiveMessageResponse{Content: &pb.ReceiveMessageResponse_Message{Message: o.proto()}}
				var got pb.ReceiveMessageResponse
				require.NoError(t, proto.Unmarshal(*enc, &got))
				require.True(t, proto.Equal(want, &got), "decoded:\n%v\nwant:\n%v", &got, want)
				require.Equal(t, proto.Size(want), len(*enc))
				mem.DefaultBufferPool().Put((*[]byte)(enc))
			})
		}
	}
}

// TestWireSafeRefusesInvalidUTF8: a string protobuf would refuse sends the message through
// the generated types, whose marshalling fails as before.
func TestWireSafeRefusesInvalidUTF8(t *testing.T) {
	s := newWireServer(t)
	for name, props := range map[string]map[string]string{
		"value": {"k": "bad\xff"},
		"key":   {"bad\xfe": "v"},
		"tag":   {protocol.PropertyTags: "\xc3("},
		"keys":  {protocol.PropertyKeys: "a \xff"},
		"id":    {protocol.PropertyUniqueKey: "\x80"},
	} {
		m := &protocol.MessageExt{Message: protocol.Message{Topic: "wire", Body: []byte("x"), Properties: props}}
		o := s.outOf(m, "wire", &delivery{handle: "h", attempt: 1, invisibleUntil: time.Now().Add(time.Minute)})
		require.False(t, o.wireSafe(), name)
		_, err := proto.Marshal(&pb.ReceiveMessageResponse{Content: &pb.ReceiveMessageResponse_Message{Message: o.proto()}})
		require.Error(t, err, name)
	}
	m := &protocol.MessageExt{Message: protocol.Message{Topic: "wire", Body: []byte("\xff binary bodies are bytes"), Properties: map[string]string{"k": "v"}}}
	o := s.outOf(m, "wire", nil)
	require.True(t, o.wireSafe())
}

// BenchmarkEncodeDelivery: a 1 KiB delivery written by hand against built as a pb.Message
// and marshalled by protobuf (what the proto codec did per message).
func BenchmarkEncodeDelivery(b *testing.B) {
	s := newWireServer(b)
	m := &protocol.MessageExt{
		Message: protocol.Message{Topic: "bench", Body: make([]byte, 1024), Properties: map[string]string{
			protocol.PropertyUniqueKey: "7F0000010001B4B5E1D2A1C300000001", protocol.PropertyTags: "TagA", protocol.PropertyKeys: "order-1",
		}},
		QueueID: 1, QueueOffset: 4242, BornTimestamp: time.Now().UnixMilli(), StoreTimestamp: time.Now().UnixMilli(),
		BornHost: netip.MustParseAddrPort("127.0.0.1:50000"), StoreHost: netip.MustParseAddrPort("127.0.0.1:10911"),
	}
	d := &delivery{handle: "AQAAAAEAAAAAAAAQkgAAAZNmYWtlAAABk2Zha2UAAAABAAAAAAAAAAF5ZXNfdGhpc19pc19mYWtl", attempt: 1, invisibleUntil: time.Now().Add(time.Minute)}
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			o := s.outOf(m, "bench", d)
			if !o.wireSafe() {
				b.Fatal("not wire safe")
			}
			enc, err := o.encodeDelivery()
			if err != nil {
				b.Fatal(err)
			}
			mem.DefaultBufferPool().Put((*[]byte)(enc))
		}
	})
	b.Run("proto", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			msg := s.toProto(m, "bench", d)
			if _, err := proto.Marshal(&pb.ReceiveMessageResponse{Content: &pb.ReceiveMessageResponse_Message{Message: msg}}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
