package grpcserver_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

func halfMessage(topic, id, body string) *pb.Message {
	m := message(topic, id, body)
	m.SystemProperties.MessageType = pb.MessageType_TRANSACTION
	return m
}

func TestEndTransactionCommitsAndRollsBack(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "tx", 1)
	ctx := callCtx(t, "p1")
	send := func(id string) string {
		resp, err := e.client.SendMessage(ctx, &pb.SendMessageRequest{Messages: []*pb.Message{halfMessage("tx", id, "body-"+id)}})
		require.NoError(t, err)
		require.Equal(t, pb.Code_OK, resp.Status.Code, resp.Status.Message)
		require.NotEmpty(t, resp.Entries[0].TransactionId)
		return resp.Entries[0].TransactionId
	}
	commit, rollback := send("id-commit"), send("id-rollback")
	require.Equal(t, 2, e.b.PendingTransactions())

	end := func(txID, msgID string, r pb.TransactionResolution) *pb.Status {
		resp, err := e.client.EndTransaction(ctx, &pb.EndTransactionRequest{Topic: res("tx"), MessageId: msgID, TransactionId: txID, Resolution: r, Source: pb.TransactionSource_SOURCE_CLIENT})
		require.NoError(t, err)
		return resp.Status
	}
	require.Equal(t, pb.Code_OK, end(commit, "id-commit", pb.TransactionResolution_COMMIT).Code)
	require.Equal(t, pb.Code_OK, end(rollback, "id-rollback", pb.TransactionResolution_ROLLBACK).Code)
	got := e.stored(t, "tx", 1)
	require.Equal(t, "body-id-commit", string(got[0].Body))
	require.Equal(t, 0, e.b.PendingTransactions())

	// Resolved once only; an id flowd never issued is refused as such.
	require.Equal(t, pb.Code_INVALID_TRANSACTION_ID, end(commit, "id-commit", pb.TransactionResolution_COMMIT).Code)
	require.Equal(t, pb.Code_INVALID_TRANSACTION_ID, end("nonsense", "x", pb.TransactionResolution_COMMIT).Code)
}

func TestHalfMessageIsCheckedBackOverTelemetry(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "tx", 1)
	ctx := callCtx(t, "p-check")
	stream, err := e.client.Telemetry(ctx)
	require.NoError(t, err)
	typ := pb.ClientType_PRODUCER
	require.NoError(t, stream.Send(&pb.TelemetryCommand{Command: &pb.TelemetryCommand_Settings{Settings: &pb.Settings{
		ClientType: &typ, PubSub: &pb.Settings_Publishing{Publishing: &pb.Publishing{Topics: []*pb.Resource{res("tx")}}},
	}}}))
	_, err = stream.Recv() // the settings answer
	require.NoError(t, err)

	m := halfMessage("tx", "id-orphan", "orphan")
	m.SystemProperties.Tag = strp("T")
	resp, err := e.client.SendMessage(ctx, &pb.SendMessageRequest{Messages: []*pb.Message{m}})
	require.NoError(t, err)
	require.Equal(t, pb.Code_OK, resp.Status.Code)

	// No EndTransaction: after TransactionTimeout (1 s here) the broker checks back.
	got := make(chan *pb.RecoverOrphanedTransactionCommand, 1)
	go func() {
		for {
			c, err := stream.Recv()
			if err != nil {
				return
			}
			if r := c.GetRecoverOrphanedTransactionCommand(); r != nil {
				got <- r
				return
			}
		}
	}()
	var check *pb.RecoverOrphanedTransactionCommand
	select {
	case check = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no check-back over Telemetry")
	}
	require.Equal(t, "tx", check.Message.Topic.Name, "the check names the real topic")
	require.Equal(t, "id-orphan", check.Message.SystemProperties.MessageId)
	require.Equal(t, "T", check.Message.SystemProperties.GetTag())
	require.Equal(t, resp.Entries[0].TransactionId, check.TransactionId)

	end, err := e.client.EndTransaction(ctx, &pb.EndTransactionRequest{Topic: res("tx"), MessageId: "id-orphan", TransactionId: check.TransactionId,
		Resolution: pb.TransactionResolution_COMMIT, Source: pb.TransactionSource_SOURCE_SERVER_CHECK})
	require.NoError(t, err)
	require.Equal(t, pb.Code_OK, end.Status.Code, end.Status.Message)
	require.Equal(t, "orphan", string(e.stored(t, "tx", 1)[0].Body))
}
