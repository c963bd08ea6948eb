package grpcserver_test

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

// benchPopAck receives b.N preloaded messages in batches of benchBatch and acknowledges
// each batch with one AckMessage.
func benchPopAck(b *testing.B, body []byte) {
	e := start(b, nil)
	e.topic(b, "bench", 4)
	preload(b, e, "bench", body, b.N)
	ctx := callCtx(b, "bench-pop")
	b.ResetTimer()
	start := time.Now()
	got, calls := 0, 0
	for got < b.N {
		calls++
		stream, err := e.client.ReceiveMessage(ctx, &pb.ReceiveMessageRequest{
			Group: res("bench-pop"), MessageQueue: &pb.MessageQueue{Topic: res("bench")},
			FilterExpression: &pb.FilterExpression{Type: pb.FilterType_TAG, Expression: "*"}, BatchSize: benchBatch,
			InvisibleDuration: durationpb.New(time.Minute), LongPollingTimeout: durationpb.New(10 * time.Second),
		})
		require.NoError(b, err)
		ack := &pb.AckMessageRequest{Group: res("bench-pop"), Topic: res("bench")}
		for {
			resp, err := stream.Recv()
			if err == io.EOF {
				break
			}
			require.NoError(b, err)
			if m := resp.GetMessage(); m != nil {
				ack.Entries = append(ack.Entries, &pb.AckMessageEntry{MessageId: m.SystemProperties.MessageId, ReceiptHandle: m.SystemProperties.GetReceiptHandle()})
			}
		}
		if len(ack.Entries) == 0 {
			continue
		}
		r, err := e.client.AckMessage(ctx, ack)
		require.NoError(b, err)
		require.Equal(b, pb.Code_OK, r.Status.Code, r.Status.Message)
		got += len(ack.Entries)
	}
	b.StopTimer()
	b.ReportMetric(float64(got)/time.Since(start).Seconds(), "msgs/s")
	b.ReportMetric(float64(got)/float64(calls), "msgs/receive")
}
