package grpcserver_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/flowd-io/flowd/broker"
	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
	"github.com/flowd-io/flowd/protocol"
)

func TestQueryRouteNamesTheGRPCEndpointAndEveryQueue(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "orders", 3)
	ctx := callCtx(t, "c1")

	resp, err := e.client.QueryRoute(ctx, &pb.QueryRouteRequest{Topic: res("orders")})
	require.NoError(t, err)
	require.Equal(t, pb.Code_OK, resp.Status.Code)
	require.Len(t, resp.MessageQueues, 3)
	for i, q := range resp.MessageQueues {
		require.Equal(t, int32(i), q.Id)
		require.Equal(t, pb.Permission_READ_WRITE, q.Permission)
		addr := q.Broker.Endpoints.Addresses[0]
		require.Equal(t, e.addr, addr.Host+":"+itoa(addr.Port), "routes name the gRPC address")
		require.Contains(t, q.AcceptMessageTypes, pb.MessageType_TRANSACTION)
	}

	resp, err = e.client.QueryRoute(ctx, &pb.QueryRouteRequest{Topic: res("missing")})
	require.NoError(t, err)
	require.Equal(t, pb.Code_TOPIC_NOT_FOUND, resp.Status.Code)
}

func itoa(p int32) string { return strconv.Itoa(int(p)) }

func fmtInt(v int64) string { return strconv.FormatInt(v, 10) }

func TestSendMapsSystemPropertiesOntoTheStoredMessage(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "orders", 2)
	ctx := callCtx(t, "p1")
	m := message("orders", "01AABBCCDDEEFF00112233445566", "hello")
	m.SystemProperties.Tag = strp("tagA")
	m.SystemProperties.Keys = []string{"k1", "k2"}
	m.SystemProperties.BornTimestamp = timestamppb.New(time.UnixMilli(1700000000123))
	m.UserProperties = map[string]string{"color": "red"}

	resp, err := e.client.SendMessage(ctx, &pb.SendMessageRequest{Messages: []*pb.Message{m}})
	require.NoError(t, err)
	require.Equal(t, pb.Code_OK, resp.Status.Code, resp.Status.Message)
	require.Equal(t, "01AABBCCDDEEFF00112233445566", resp.Entries[0].MessageId)

	got := e.stored(t, "orders", 1)[0]
	require.Equal(t, "hello", string(got.Body))
	require.Equal(t, "tagA", got.Tags())
	require.Equal(t, []string{"k1", "k2"}, got.Keys())
	require.Equal(t, "01AABBCCDDEEFF00112233445566", got.Properties[protocol.PropertyUniqueKey], "the 5.x message id is the UNIQ_KEY 4.x clients see")
	require.Equal(t, "red", got.Properties["color"])
	require.Equal(t, int64(1700000000123), got.BornTimestamp)
}

func TestSendRefusesBadMessagesWithTheirCodes(t *testing.T) {
	e := start(t, func(c *broker.Config) { c.MaxMessageSize = 1024 })
	e.topic(t, "orders", 1)
	ctx := callCtx(t, "p1")
	big := message("orders", "id-big", strings.Repeat("x", 1025))
	empty := message("orders", "id-empty", "")
	missing := message("nowhere", "id-missing", "x")
	badTag := message("orders", "id-tag", "x")
	badTag.SystemProperties.Tag = strp("a|b")
	sysKey := message("orders", "id-key", "x")
	sysKey.UserProperties = map[string]string{"UNIQ_KEY": "mine"}
	tooLate := message("orders", "id-late", "x")
	tooLate.SystemProperties.MessageType = pb.MessageType_DELAY
	tooLate.SystemProperties.DeliveryTimestamp = timestamppb.New(time.Now().Add(time.Hour))

	for _, c := range []struct {
		m    *pb.Message
		code pb.Code
	}{
		{big, pb.Code_MESSAGE_BODY_TOO_LARGE},
		{empty, pb.Code_MESSAGE_BODY_EMPTY},
		{missing, pb.Code_TOPIC_NOT_FOUND},
		{badTag, pb.Code_ILLEGAL_MESSAGE_TAG},
		{sysKey, pb.Code_ILLEGAL_MESSAGE_PROPERTY_KEY},
		{tooLate, pb.Code_ILLEGAL_DELIVERY_TIME},
	} {
		resp, err := e.client.SendMessage(ctx, &pb.SendMessageRequest{Messages: []*pb.Message{c.m}})
		require.NoError(t, err)
		require.Equal(t, c.code, resp.Status.Code, "%s: %s", c.m.SystemProperties.MessageId, resp.Status.Message)
	}
	resp, err := e.client.SendMessage(ctx, &pb.SendMessageRequest{})
	require.NoError(t, err)
	require.Equal(t, pb.Code_BAD_REQUEST, resp.Status.Code)

	// Two entries with different outcomes: MULTIPLE_RESULTS, each entry its own.
	resp, err = e.client.SendMessage(ctx, &pb.SendMessageRequest{Messages: []*pb.Message{message("orders", "good", "x"), empty}})
	require.NoError(t, err)
	require.Equal(t, pb.Code_MULTIPLE_RESULTS, resp.Status.Code)
	require.Equal(t, pb.Code_OK, resp.Entries[0].Status.Code)
	require.Equal(t, pb.Code_MESSAGE_BODY_EMPTY, resp.Entries[1].Status.Code)
}

func TestFIFOMessagesOfAGroupShareAQueue(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "fifo", 8)
	ctx := callCtx(t, "p1")
	queues := map[string]map[int32]bool{}
	for i := range 40 {
		g := []string{"g1", "g2", "g3"}[i%3]
		m := message("fifo", "id-"+fmtInt(int64(i)), "b")
		m.SystemProperties.MessageType = pb.MessageType_FIFO
		m.SystemProperties.MessageGroup = strp(g)
		resp, err := e.client.SendMessage(ctx, &pb.SendMessageRequest{Messages: []*pb.Message{m}})
		require.NoError(t, err)
		require.Equal(t, pb.Code_OK, resp.Status.Code)
	}
	for _, m := range e.stored(t, "fifo", 40) {
		g := m.Properties["__SHARDINGKEY"]
		if queues[g] == nil {
			queues[g] = map[int32]bool{}
		}
		queues[g][m.QueueID] = true
	}
	require.Len(t, queues, 3)
	for g, qs := range queues {
		require.Len(t, qs, 1, "group %s in one queue", g)
	}
}

func TestDelayedMessageIsDeliveredAfterItsDeliveryTime(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "later", 1)
	ctx := callCtx(t, "p1")
	m := message("later", "id-delay", "soon")
	m.SystemProperties.MessageType = pb.MessageType_DELAY
	m.SystemProperties.DeliveryTimestamp = timestamppb.New(time.Now().Add(1500 * time.Millisecond))
	sent := time.Now()
	resp, err := e.client.SendMessage(ctx, &pb.SendMessageRequest{Messages: []*pb.Message{m}})
	require.NoError(t, err)
	require.Equal(t, pb.Code_OK, resp.Status.Code, resp.Status.Message)
	r, err := e.b.ReadQueue(context.Background(), "later", 0, 0, 1)
	require.NoError(t, err)
	require.Empty(t, r.Messages, "not visible before its delivery time")
	require.Eventually(t, func() bool {
		r, err := e.b.ReadQueue(context.Background(), "later", 0, 0, 1)
		return err == nil && len(r.Messages) == 1
	}, 10*time.Second, 50*time.Millisecond)
	// Rounded up to the 2 s level: never early.
	require.GreaterOrEqual(t, time.Since(sent), 1500*time.Millisecond)
}

func TestTelemetryAnswersTheClientSettings(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "orders", 1)
	events := make(chan broker.Event, 16)
	cancelSub := e.b.Subscribe(func(ev broker.Event) {
		if ev.Type == broker.MemberJoined || ev.Type == broker.MemberLeft {
			events <- ev
		}
	})
	defer cancelSub()
	ctx := callCtx(t, "c-telemetry")
	stream, err := e.client.Telemetry(ctx)
	require.NoError(t, err)
	typ := pb.ClientType_SIMPLE_CONSUMER
	require.NoError(t, stream.Send(&pb.TelemetryCommand{Command: &pb.TelemetryCommand_Settings{Settings: &pb.Settings{
		ClientType:     &typ,
		RequestTimeout: durationpb.New(3 * time.Second),
		PubSub: &pb.Settings_Subscription{Subscription: &pb.Subscription{
			Group:         res("g1"),
			Subscriptions: []*pb.SubscriptionEntry{{Topic: res("orders"), Expression: &pb.FilterExpression{Type: pb.FilterType_TAG, Expression: "*"}}},
		}},
	}}}))
	got, err := stream.Recv()
	require.NoError(t, err)
	require.Equal(t, pb.Code_OK, got.Status.Code)
	select {
	case ev := <-events:
		require.Equal(t, broker.MemberJoined, ev.Type)
		require.Equal(t, "g1", ev.Group)
		require.Equal(t, "c-telemetry", ev.ClientID)
	case <-time.After(5 * time.Second):
		t.Fatal("no member.joined event for the gRPC consumer")
	}
	sub := got.GetSettings().GetSubscription()
	require.NotNil(t, sub, "the answer is the subscription settings")
	require.Equal(t, int32(32), sub.GetReceiveBatchSize())
	require.Equal(t, 20*time.Second, sub.GetLongPollingTimeout().AsDuration())
	require.NotNil(t, got.GetSettings().GetBackoffPolicy().GetExponentialBackoff())
	require.Eventually(t, func() bool { return e.srv.Clients() == 1 }, 5*time.Second, 10*time.Millisecond)

	// A producer gets the publishing settings with the body size limit.
	pctx := callCtx(t, "p-telemetry")
	ps, err := e.client.Telemetry(pctx)
	require.NoError(t, err)
	ptyp := pb.ClientType_PRODUCER
	require.NoError(t, ps.Send(&pb.TelemetryCommand{Command: &pb.TelemetryCommand_Settings{Settings: &pb.Settings{
		ClientType: &ptyp, PubSub: &pb.Settings_Publishing{Publishing: &pb.Publishing{Topics: []*pb.Resource{res("orders")}}},
	}}}))
	pg, err := ps.Recv()
	require.NoError(t, err)
	require.Equal(t, int32(e.b.MaxMessageSize()), pg.GetSettings().GetPublishing().GetMaxBodySize())
}

func TestRPCCountsByStatusCode(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "orders", 1)
	ctx := callCtx(t, "c")
	_, err := e.client.QueryRoute(ctx, &pb.QueryRouteRequest{Topic: res("orders")})
	require.NoError(t, err)
	_, err = e.client.QueryRoute(ctx, &pb.QueryRouteRequest{Topic: res("missing")})
	require.NoError(t, err)
	_, err = e.client.SendMessage(ctx, &pb.SendMessageRequest{Messages: []*pb.Message{message("orders", "01X", "x")}})
	require.NoError(t, err)
	got := map[string]uint64{}
	for _, c := range e.srv.RPCCounts() {
		got[c.RPC+"/"+c.Code] = c.Calls
	}
	require.Equal(t, map[string]uint64{"QueryRoute/OK": 1, "QueryRoute/TOPIC_NOT_FOUND": 1, "SendMessage/OK": 1}, got)
}

// A Telemetry session that never sent its settings does not hold up Shutdown.
func TestShutdownEndsOpenTelemetrySessions(t *testing.T) {
	e := start(t, nil)
	stream, err := e.client.Telemetry(callCtx(t, "idle"))
	require.NoError(t, err)
	require.NoError(t, stream.Send(&pb.TelemetryCommand{})) // no settings
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	require.NoError(t, e.srv.Shutdown(ctx))
	_, err = stream.Recv()
	require.Error(t, err, "the stream ended")
}
