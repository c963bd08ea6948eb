package grpcserver_test

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

type recv struct {
	group, topic string
	filter       *pb.FilterExpression
	batch        int32
	invisible    time.Duration
	wait         time.Duration
}

// receive makes one ReceiveMessage call and returns its messages and final status.
func (e *env) receive(t *testing.T, r recv) ([]*pb.Message, *pb.Status) {
	t.Helper()
	if r.batch == 0 {
		r.batch = 32
	}
	if r.invisible == 0 {
		r.invisible = 30 * time.Second
	}
	if r.filter == nil {
		r.filter = &pb.FilterExpression{Type: pb.FilterType_TAG, Expression: "*"}
	}
	stream, err := e.client.ReceiveMessage(callCtx(t, "c-"+r.group), &pb.ReceiveMessageRequest{
		Group: res(r.group), MessageQueue: &pb.MessageQueue{Topic: res(r.topic), Id: 0},
		FilterExpression: r.filter, BatchSize: r.batch,
		InvisibleDuration: durationpb.New(r.invisible), LongPollingTimeout: durationpb.New(r.wait),
	})
	require.NoError(t, err)
	var msgs []*pb.Message
	var st *pb.Status
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		switch c := resp.Content.(type) {
		case *pb.ReceiveMessageResponse_Message:
			msgs = append(msgs, c.Message)
		case *pb.ReceiveMessageResponse_Status:
			st = c.Status
		}
	}
	require.NotNil(t, st, "a receive ends with a status")
	return msgs, st
}

// receiveN receives until n messages came or 10 s passed.
func (e *env) receiveN(t *testing.T, r recv, n int) []*pb.Message {
	t.Helper()
	var all []*pb.Message
	deadline := time.Now().Add(10 * time.Second)
	for len(all) < n && time.Now().Before(deadline) {
		if r.wait == 0 {
			r.wait = time.Second
		}
		msgs, st := e.receive(t, r)
		require.Contains(t, []pb.Code{pb.Code_OK, pb.Code_MESSAGE_NOT_FOUND}, st.Code, st.Message)
		all = append(all, msgs...)
	}
	require.Len(t, all, n)
	return all
}

func (e *env) ack(t *testing.T, group, topic string, ms ...*pb.Message) *pb.AckMessageResponse {
	t.Helper()
	req := &pb.AckMessageRequest{Group: res(group), Topic: res(topic)}
	for _, m := range ms {
		req.Entries = append(req.Entries, &pb.AckMessageEntry{MessageId: m.SystemProperties.MessageId, ReceiptHandle: m.SystemProperties.GetReceiptHandle()})
	}
	resp, err := e.client.AckMessage(callCtx(t, "c-"+group), req)
	require.NoError(t, err)
	return resp
}

func sendN(t *testing.T, e *env, topic string, n int, tag func(int) string) {
	t.Helper()
	ctx := callCtx(t, "p")
	for i := range n {
		m := message(topic, "01MSG"+strconv.Itoa(i), "body-"+strconv.Itoa(i))
		if tag != nil {
			m.SystemProperties.Tag = strp(tag(i))
		}
		m.UserProperties = map[string]string{"n": strconv.Itoa(i)}
		resp, err := e.client.SendMessage(ctx, &pb.SendMessageRequest{Messages: []*pb.Message{m}})
		require.NoError(t, err)
		require.Equal(t, pb.Code_OK, resp.Status.Code, resp.Status.Message)
	}
}

func TestReceiveFromEveryQueueAndAck(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "orders", 4)
	sendN(t, e, "orders", 20, nil)
	msgs := e.receiveN(t, recv{group: "g", topic: "orders"}, 20)
	queues := map[int32]bool{}
	for _, m := range msgs {
		sp := m.SystemProperties
		queues[sp.QueueId] = true
		require.NotEmpty(t, sp.GetReceiptHandle())
		require.Equal(t, int32(1), sp.GetDeliveryAttempt())
		sum := md5.Sum(m.Body)
		require.Equal(t, pb.DigestType_MD5, sp.BodyDigest.Type)
		require.Equal(t, strings.ToUpper(hex.EncodeToString(sum[:])), sp.BodyDigest.Checksum)
		require.Equal(t, "orders", m.Topic.Name)
		require.Equal(t, strings.TrimPrefix(string(m.Body), "body-"), m.UserProperties["n"])
	}
	require.Greater(t, len(queues), 1, "a receive naming queue 0 hands out every queue's messages")
	resp := e.ack(t, "g", "orders", msgs...)
	require.Equal(t, pb.Code_OK, resp.Status.Code, resp.Status.Message)
	_, st := e.receive(t, recv{group: "g", topic: "orders", wait: 200 * time.Millisecond})
	require.Equal(t, pb.Code_MESSAGE_NOT_FOUND, st.Code, "nothing left after the acks")
}

// A batch over the broker's bound is served at the bound, not refused.
func TestReceiveCapsALargeBatch(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "orders", 1)
	sendN(t, e, "orders", 40, nil)
	msgs, st := e.receive(t, recv{group: "g", topic: "orders", batch: 100, wait: 2 * time.Second})
	require.Equal(t, pb.Code_OK, st.Code, st.Message)
	require.NotEmpty(t, msgs)
	require.LessOrEqual(t, len(msgs), 32)
}

func TestUnacknowledgedMessageComesBackWithItsAttempt(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "orders", 1)
	sendN(t, e, "orders", 1, nil)
	first := e.receiveN(t, recv{group: "g", topic: "orders", invisible: time.Second}, 1)[0]
	_, st := e.receive(t, recv{group: "g", topic: "orders", wait: 100 * time.Millisecond})
	require.Equal(t, pb.Code_MESSAGE_NOT_FOUND, st.Code, "invisible while in flight")
	again := e.receiveN(t, recv{group: "g", topic: "orders", wait: 3 * time.Second}, 1)[0]
	require.Equal(t, first.SystemProperties.MessageId, again.SystemProperties.MessageId)
	require.Equal(t, int32(2), again.SystemProperties.GetDeliveryAttempt())
	require.Equal(t, pb.Code_OK, e.ack(t, "g", "orders", again).Status.Code)
	// The first delivery's handle is stale now.
	require.Equal(t, pb.Code_INVALID_RECEIPT_HANDLE, e.ack(t, "g", "orders", first).Status.Code)
}

func TestBadInputIsAnsweredWithItsCode(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "orders", 1)
	_, st := e.receive(t, recv{group: "g", topic: "missing"})
	require.Equal(t, pb.Code_TOPIC_NOT_FOUND, st.Code, st.Message)
	_, st = e.receive(t, recv{group: "g", topic: "orders", filter: &pb.FilterExpression{Type: pb.FilterType_SQL, Expression: "a >>> ("}})
	require.Equal(t, pb.Code_ILLEGAL_FILTER_EXPRESSION, st.Code, st.Message)
	_, st = e.receive(t, recv{group: "g", topic: "orders", invisible: 500 * time.Millisecond})
	require.Equal(t, pb.Code_ILLEGAL_INVISIBLE_TIME, st.Code, st.Message)
	_, st = e.receive(t, recv{group: "g", topic: "orders", invisible: 13 * time.Hour})
	require.Equal(t, pb.Code_ILLEGAL_INVISIBLE_TIME, st.Code, st.Message)
	_, st = e.receive(t, recv{group: "", topic: "orders"})
	require.Equal(t, pb.Code_ILLEGAL_CONSUMER_GROUP, st.Code, st.Message)

	bad := &pb.Message{SystemProperties: &pb.SystemProperties{MessageId: "x", ReceiptHandle: strp("not-a-handle")}}
	resp := e.ack(t, "g", "orders", bad)
	require.Equal(t, pb.Code_INVALID_RECEIPT_HANDLE, resp.Status.Code, resp.Status.Message)
	ch, err := e.client.ChangeInvisibleDuration(callCtx(t, "c"), &pb.ChangeInvisibleDurationRequest{Group: res("g"), Topic: res("orders"), ReceiptHandle: "not-a-handle", InvisibleDuration: durationpb.New(5 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, pb.Code_INVALID_RECEIPT_HANDLE, ch.Status.Code)
}

func TestAckAfterTheInvisibilityExpiredIsRefused(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "orders", 1)
	sendN(t, e, "orders", 1, nil)
	m := e.receiveN(t, recv{group: "g", topic: "orders", invisible: time.Second}, 1)[0]
	time.Sleep(1500 * time.Millisecond)
	resp := e.ack(t, "g", "orders", m)
	require.Equal(t, pb.Code_INVALID_RECEIPT_HANDLE, resp.Status.Code, resp.Status.Message)
	// Not acknowledged: it comes back.
	again := e.receiveN(t, recv{group: "g", topic: "orders", wait: 3 * time.Second}, 1)[0]
	require.Equal(t, m.SystemProperties.MessageId, again.SystemProperties.MessageId)
}

func TestChangeInvisibleDurationGivesANewHandle(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "orders", 1)
	sendN(t, e, "orders", 1, nil)
	m := e.receiveN(t, recv{group: "g", topic: "orders", invisible: 30 * time.Second}, 1)[0]
	ch, err := e.client.ChangeInvisibleDuration(callCtx(t, "c"), &pb.ChangeInvisibleDurationRequest{
		Group: res("g"), Topic: res("orders"), ReceiptHandle: m.SystemProperties.GetReceiptHandle(),
		InvisibleDuration: durationpb.New(time.Second), MessageId: m.SystemProperties.MessageId,
	})
	require.NoError(t, err)
	require.Equal(t, pb.Code_OK, ch.Status.Code, ch.Status.Message)
	require.NotEmpty(t, ch.ReceiptHandle)
	// Visible again after the new, shorter time.
	again := e.receiveN(t, recv{group: "g", topic: "orders", wait: 4 * time.Second}, 1)[0]
	require.Equal(t, m.SystemProperties.MessageId, again.SystemProperties.MessageId)
	ch, err = e.client.ChangeInvisibleDuration(callCtx(t, "c"), &pb.ChangeInvisibleDurationRequest{
		Group: res("g"), Topic: res("orders"), ReceiptHandle: again.SystemProperties.GetReceiptHandle(), InvisibleDuration: durationpb.New(100 * time.Millisecond),
	})
	require.NoError(t, err)
	require.Equal(t, pb.Code_ILLEGAL_INVISIBLE_TIME, ch.Status.Code)
}

func TestReceiveFiltersByTagAndSQL(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "orders", 2)
	sendN(t, e, "orders", 10, func(i int) string { return []string{"a", "b"}[i%2] })
	msgs := e.receiveN(t, recv{group: "tags", topic: "orders", filter: &pb.FilterExpression{Type: pb.FilterType_TAG, Expression: "a"}}, 5)
	for _, m := range msgs {
		require.Equal(t, "a", m.SystemProperties.GetTag())
	}
	msgs = e.receiveN(t, recv{group: "sql", topic: "orders", filter: &pb.FilterExpression{Type: pb.FilterType_SQL, Expression: "n >= 7"}}, 3)
	for _, m := range msgs {
		n, _ := strconv.Atoi(m.UserProperties["n"])
		require.GreaterOrEqual(t, n, 7)
	}
}

func TestReceiveLongPollsUntilAMessageArrives(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "orders", 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = e.client.SendMessage(ctx, &pb.SendMessageRequest{Messages: []*pb.Message{message("orders", "01LATE", "late")}})
	}()
	msgs, st := e.receive(t, recv{group: "g", topic: "orders", wait: 5 * time.Second})
	require.Equal(t, pb.Code_OK, st.Code, st.Message)
	require.Len(t, msgs, 1)
	require.Equal(t, "late", string(msgs[0].Body))
}

func TestForwardToDeadLetterQueue(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "orders", 1)
	sendN(t, e, "orders", 1, nil)
	m := e.receiveN(t, recv{group: "g", topic: "orders"}, 1)[0]
	resp, err := e.client.ForwardMessageToDeadLetterQueue(callCtx(t, "c"), &pb.ForwardMessageToDeadLetterQueueRequest{
		Group: res("g"), Topic: res("orders"), ReceiptHandle: m.SystemProperties.GetReceiptHandle(), MessageId: m.SystemProperties.MessageId,
		DeliveryAttempt: 1, MaxDeliveryAttempts: 1,
	})
	require.NoError(t, err)
	require.Equal(t, pb.Code_OK, resp.Status.Code, resp.Status.Message)
	dlq := e.stored(t, "%DLQ%g", 1)
	require.Equal(t, string(m.Body), string(dlq[0].Body))
	_, st := e.receive(t, recv{group: "g", topic: "orders", wait: 200 * time.Millisecond})
	require.Equal(t, pb.Code_MESSAGE_NOT_FOUND, st.Code)
}

// One AckMessage of a batch answers each entry on its own: a stale handle among good ones
// is refused alone, and the good ones are done.
func TestAckOfABatchAnswersEachEntry(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "orders", 2)
	sendN(t, e, "orders", 4, nil)
	msgs := e.receiveN(t, recv{group: "g", topic: "orders", wait: 3 * time.Second}, 4)
	require.Equal(t, pb.Code_OK, e.ack(t, "g", "orders", msgs[1]).Status.Code)
	resp := e.ack(t, "g", "orders", msgs...)
	require.Equal(t, pb.Code_MULTIPLE_RESULTS, resp.Status.Code, resp.Status.Message)
	require.Len(t, resp.Entries, 4)
	for i, en := range resp.Entries {
		require.Equal(t, msgs[i].SystemProperties.MessageId, en.MessageId)
		want := pb.Code_OK
		if i == 1 {
			want = pb.Code_INVALID_RECEIPT_HANDLE
		}
		require.Equal(t, want, en.Status.Code, "entry %d: %s", i, en.Status.Message)
	}
	_, st := e.receive(t, recv{group: "g", topic: "orders", wait: 200 * time.Millisecond})
	require.Equal(t, pb.Code_MESSAGE_NOT_FOUND, st.Code, "every message is acknowledged")
}
