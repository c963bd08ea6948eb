package protocol

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// typicalPullRequest is what the Go client sends for every pull: 12 ext fields.
func typicalPullRequest(st SerializeType) *Command {
	h := PullMessageRequestHeader{
		ConsumerGroup:        "please_rename_unique_group_name",
		Topic:                "TopicTest",
		QueueID:              3,
		QueueOffset:          1234567,
		MaxMsgNums:           32,
		SysFlag:              PullFlagSuspend | PullFlagSubscription | PullFlagCommitOffset,
		CommitOffset:         1234560,
		SuspendTimeoutMillis: 20000,
		Subscription:         "TagA || TagB",
		SubVersion:           1712345678901234567,
		ExpressionType:       ExpressionTag,
		BrokerName:           "broker-a",
	}
	c := NewRequestWith(PullMessage, &h, nil)
	c.Opaque = 123456
	c.Serialize = st
	return c
}

func benchHeader(b *testing.B, st SerializeType) {
	c := typicalPullRequest(st)
	frame, err := c.AppendFrame(nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("encode", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(frame)))
		buf := make([]byte, 0, 1024)
		for b.Loop() {
			var err error
			if buf, err = c.AppendFrame(buf[:0]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(frame)))
		var h PullMessageRequestHeader
		for b.Loop() {
			c, err := DecodeFrame(frame[4:])
			if err != nil {
				b.Fatal(err)
			}
			if err := c.DecodeHeader(&h); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkJSONHeader(b *testing.B)   { benchHeader(b, JSON) }
func BenchmarkBinaryHeader(b *testing.B) { benchHeader(b, RocketMQ) }

// pullResponse builds a FOUND pull response carrying n messages of size bytes each.
func pullResponse(b testing.TB, n, size int) (*Command, []*MessageExt) {
	msgs := make([]*MessageExt, n)
	for i := range msgs {
		msgs[i] = &MessageExt{
			Message: Message{
				Topic:      "TopicTest",
				Properties: map[string]string{PropertyTags: "TagA", PropertyKeys: "order-1 order-2", PropertyUniqueKey: "7F000001000118B4AAC2000000000000"},
				Body:       bytes.Repeat([]byte{byte('a' + i%26)}, size),
			},
			QueueID:         3,
			QueueOffset:     int64(1000 + i),
			CommitLogOffset: int64(1 << 30 * i),
			BornTimestamp:   1712345678901,
			BornHost:        netip.MustParseAddrPort("10.0.0.7:54321"),
			StoreTimestamp:  1712345678999,
			StoreHost:       netip.MustParseAddrPort("10.0.0.1:10911"),
		}
	}
	req := typicalPullRequest(JSON)
	resp := NewResponse(req, Success, "FOUND")
	(&PullMessageResponseHeader{NextBeginOffset: 1032, MinOffset: 0, MaxOffset: 5000}).EncodeTo(resp.ExtFields)
	var body []byte
	for _, m := range msgs {
		var err error
		if body, err = AppendStored(body, m); err != nil {
			b.Fatal(err)
		}
	}
	resp.Body = body
	return resp, msgs
}

func BenchmarkPullResponse(b *testing.B) {
	const n, size = 32, 1024
	resp, msgs := pullResponse(b, n, size)
	frame, err := resp.AppendFrame(nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("encode", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(frame)))
		body := make([]byte, 0, len(resp.Body))
		buf := make([]byte, 0, len(frame))
		for b.Loop() {
			body = body[:0]
			for _, m := range msgs {
				var err error
				if body, err = AppendStored(body, m); err != nil {
					b.Fatal(err)
				}
			}
			c := NewResponse(resp, Success, "FOUND")
			(&PullMessageResponseHeader{NextBeginOffset: 1032, MinOffset: 0, MaxOffset: 5000}).EncodeTo(c.ExtFields)
			c.Body = body
			if buf, err = c.AppendFrame(buf[:0]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(frame)))
		var h PullMessageResponseHeader
		for b.Loop() {
			c, err := DecodeFrame(frame[4:])
			if err != nil {
				b.Fatal(err)
			}
			if err := c.DecodeHeader(&h); err != nil {
				b.Fatal(err)
			}
			got, err := DecodeStoredAll(c.Body)
			if err != nil || len(got) != n {
				b.Fatal(err, len(got))
			}
		}
	})
	// The baseline: the same body decoded by rocketmq-client-go, which does not verify CRCs
	// or sizes.
	b.Run("decode-body-rocketmq-client-go", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(resp.Body)))
		for b.Loop() {
			if got := primitive.DecodeMessage(resp.Body); len(got) != n {
				b.Fatal(len(got))
			}
		}
	})
	b.Run("decode-body", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(resp.Body)))
		for b.Loop() {
			if got, err := DecodeStoredAll(resp.Body); err != nil || len(got) != n {
				b.Fatal(err, len(got))
			}
		}
	})
}
