package pop

import (
	"testing"

	"github.com/flowd-io/flowd/protocol"
)

// BenchmarkDecodeAndAck decodes a pop answer of 32 messages of 1 KiB and builds the batch
// ack of them, per op.
func BenchmarkDecodeAndAck(b *testing.B) {
	var body []byte
	for i := range 32 {
		x := protocol.ExtraInfo{CkQueueOffset: 100, PopTime: 1700000000000, InvisibleTime: 60000, Retry: "0", BrokerName: "broker-a", QueueOffset: int64(100 + i)}
		m := &protocol.MessageExt{Message: protocol.Message{Topic: "T", Body: make([]byte, 1024), Properties: map[string]string{
			protocol.PropertyUniqueKey: "7F000001000118B4AAC2000000000000", protocol.PropertyPopCK: x.String(), protocol.PropertyFirstPopTime: "1700000000000"}},
			QueueOffset: int64(100 + i)}
		var err error
		if body, err = protocol.AppendStored(body, m); err != nil {
			b.Fatal(err)
		}
	}
	c := &Consumer{group: "G", topic: "T"}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for range b.N {
		msgs, err := decodeMessages(body, "broker-a", "T")
		if err != nil {
			b.Fatal(err)
		}
		ptrs := make([]*Message, len(msgs))
		for i := range msgs {
			ptrs[i] = &msgs[i]
		}
		if _, err := c.batchBody("broker-a", ptrs); err != nil {
			b.Fatal(err)
		}
	}
}
