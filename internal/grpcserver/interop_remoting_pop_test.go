package grpcserver_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer/pop"
	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

// One pop state behind both protocols: a message popped over remoting (consumer/pop) is
// acknowledged over gRPC with its POP_CK receipt, and one received over gRPC is acknowledged
// over remoting with its receipt handle; neither comes back.
func TestRemotingPopAndGRPCAckEachOther(t *testing.T) {
	e := start(t, withNamesrv)
	e.topic(t, "pop-both", 1)
	sendTagged(t, e, "pop-both", 2)
	c, err := pop.New("g-both", "pop-both", pop.WithPollTime(time.Second),
		pop.WithClientOptions(client.WithNameServers(e.b.NamesrvAddr()), client.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	ctx := context.Background()

	got, err := c.Receive(ctx, 1)
	require.NoError(t, err)
	require.Len(t, got, 1)
	resp, err := e.client.AckMessage(callCtx(t, "c-both"), &pb.AckMessageRequest{Group: res("g-both"), Topic: res("pop-both"),
		Entries: []*pb.AckMessageEntry{{MessageId: got[0].MsgID, ReceiptHandle: got[0].Receipt}}})
	require.NoError(t, err)
	require.Equal(t, pb.Code_OK, resp.Status.Code, resp.Status.Message)

	msgs := e.receiveN(t, recv{group: "g-both", topic: "pop-both", batch: 1}, 1)
	sp := msgs[0].SystemProperties
	require.NoError(t, c.Ack(ctx, pop.Message{Topic: "pop-both", BrokerName: "broker-a", QueueID: sp.GetQueueId(), QueueOffset: sp.GetQueueOffset(),
		MsgID: sp.MessageId, Receipt: sp.GetReceiptHandle()}))

	var acked uint64
	for _, st := range e.b.PopStats("g-both") {
		acked += st.Acked
		assert.Equal(t, 0, st.InFlight)
	}
	assert.Equal(t, uint64(2), acked)
}
