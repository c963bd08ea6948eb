package control_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/control"
)

func TestGroupListAndDescribe(t *testing.T) {
	e := start(t, nil)
	e.ok("topic.create", `{"topic":"orders","queues":2}`, nil)
	p := newProducer(t, e.b)
	send(t, e.b, p, "orders", 6)
	c := newConsumer(t, e.b, "billing", "orders")
	pollN(t, c, 6)
	require.NoError(t, c.Commit(context.Background()))

	var list control.GroupListReply
	e.ok("group.list", ``, &list)
	require.Len(t, list.Groups, 1)
	assert.Equal(t, control.GroupSummaryView{Group: "billing", Configured: true, Members: 1, Topics: []string{"%RETRY%billing", "orders"}, Lag: 0}, list.Groups[0],
		"a clustering consumer reads its group's retry topic too, as RocketMQ's do")

	send(t, e.b, p, "orders", 4) // lag 4, nobody polls
	var d control.GroupDescribeReply
	e.ok("group.describe", `{"group":"billing"}`, &d)
	assert.Equal(t, "billing", d.Group)
	require.Len(t, d.Members, 1)
	assert.Equal(t, c.ClientID(), d.Members[0].ClientID)
	assert.False(t, d.Members[0].LastHeartbeat.IsZero())
	assert.Equal(t, []control.SubscriptionView{
		{Topic: "%RETRY%billing", Expression: "*", Type: "TAG"},
		{Topic: "orders", Expression: "*", Type: "TAG"},
	}, d.Subscriptions)
	assert.Equal(t, int64(4), d.Lag)
	require.Len(t, d.Topics, 2)
	assert.Equal(t, "%RETRY%billing", d.Topics[0].Topic)
	require.Equal(t, "orders", d.Topics[1].Topic)
	require.Len(t, d.Topics[1].Queues, 2)
	for _, q := range d.Topics[1].Queues {
		require.NotNil(t, q.Committed)
		assert.Equal(t, q.MaxOffset-*q.Committed, q.Lag)
		assert.Equal(t, c.ClientID(), q.Owner, "the flowd consumer locks the queues it owns")
	}
	assert.Equal(t, map[string]string{"%RETRY%billing:0": c.ClientID(), "orders:0": c.ClientID(), "orders:1": c.ClientID()}, d.Allocation)

	e.fail("group.describe", `{"group":"nobody"}`, control.CodeNotFound)
	assert.Contains(t, e.fail("group.describe", `{}`, control.CodeBadRequest), `field "group": required`)
	assert.Contains(t, e.fail("group.describe", `{"group":"a b"}`, control.CodeBadRequest), `field "group": `)
	assert.Contains(t, e.fail("group.describe", `{"group":["billing"]}`, control.CodeBadRequest), `field "group": must be a string`)
}

func TestGroupResetOffset(t *testing.T) {
	e := start(t, nil)
	e.ok("topic.create", `{"topic":"orders","queues":2}`, nil)
	p := newProducer(t, e.b)
	send(t, e.b, p, "orders", 10)
	max0, max1 := e.b.StoreMax("orders", 0), e.b.StoreMax("orders", 1)
	require.Equal(t, int64(10), max0+max1)
	committed := func(q int32) int64 {
		off, ok := e.b.CommittedOffset("g", "orders", q)
		require.True(t, ok)
		return off
	}

	var r control.ResetReply
	e.ok("group.reset_offset", `{"group":"g","topic":"orders","offsets":{"0":1}}`, &r)
	assert.Equal(t, []control.QueueOffset{{Queue: 0, Offset: 1}}, r.Offsets)
	assert.Equal(t, int64(1), committed(0))

	e.ok("group.reset_offset", `{"group":"g","topic":"orders","to":"latest"}`, &r)
	assert.Equal(t, []control.QueueOffset{{Queue: 0, Offset: max0}, {Queue: 1, Offset: max1}}, r.Offsets)
	assert.Equal(t, max1, committed(1))

	e.ok("group.reset_offset", `{"group":"g","topic":"orders","to":"earliest"}`, &r)
	assert.Equal(t, []control.QueueOffset{{Queue: 0, Offset: 0}, {Queue: 1, Offset: 0}}, r.Offsets)

	// A timestamp after every message moves each queue to its end.
	later := time.Now().Add(time.Hour)
	e.ok("group.reset_offset", fmt.Sprintf(`{"group":"g","topic":"orders","timestamp":%d}`, later.UnixMilli()), &r)
	assert.Equal(t, max0, committed(0))
	e.ok("group.reset_offset", `{"group":"g","topic":"orders","timestamp":"2000-01-01T00:00:00Z"}`, &r)
	assert.Equal(t, int64(0), committed(0))

	for _, tc := range []struct {
		body string
		code int
		want string
	}{
		{`{"topic":"orders","to":"earliest"}`, control.CodeBadRequest, `field "group": required`},
		{`{"group":"g","to":"earliest"}`, control.CodeBadRequest, `field "topic": required`},
		{`{"group":"g","topic":"orders"}`, control.CodeBadRequest, `exactly one of`},
		{`{"group":"g","topic":"orders","to":"earliest","offsets":{"0":1}}`, control.CodeBadRequest, `exactly one of`},
		{`{"group":"g","topic":"orders","to":"middle"}`, control.CodeBadRequest, `field "to": must be "earliest" or "latest"`},
		{`{"group":"g","topic":"orders","timestamp":true}`, control.CodeBadRequest, `field "timestamp"`},
		{`{"group":"g","topic":"orders","timestamp":"yesterday"}`, control.CodeBadRequest, `field "timestamp"`},
		{`{"group":"g","topic":"orders","offsets":{"x":1}}`, control.CodeBadRequest, `field "offsets": key "x"`},
		{`{"group":"g","topic":"orders","offsets":{"0":"1"}}`, control.CodeBadRequest, `field "offsets`},
		{`{"group":"g","topic":"orders","offsets":{"0":99}}`, control.CodeBadRequest, `field "offsets": `},
		{`{"group":"g","topic":"orders","offsets":{"7":0}}`, control.CodeBadRequest, `field "offsets": `},
		{`{"group":"g","topic":"orders","offsets":{}}`, control.CodeBadRequest, `field "offsets": must name`},
		{`{"group":"%SCHEDULE%","topic":"SCHEDULE_TOPIC_XXXX","to":"earliest"}`, control.CodeBadRequest, `field "group": `},
		{`{"group":"g","topic":"nope","to":"earliest"}`, control.CodeNotFound, `nope`},
		{`{"group":"g","topic":"nope","to":"latest"}`, control.CodeNotFound, `nope`},
	} {
		assert.Contains(t, e.fail("group.reset_offset", tc.body, tc.code), tc.want, tc.body)
	}
	assert.Equal(t, int64(0), committed(0), "a refused reset moved an offset")
}

// A live flowd consumer is told about a reset (RESET_CONSUMER_OFFSET) and reads again from
// the new offsets without restarting.
func TestGroupResetOffsetRewindsALiveConsumer(t *testing.T) {
	e := start(t, nil)
	e.ok("topic.create", `{"topic":"orders","queues":2}`, nil)
	p := newProducer(t, e.b)
	send(t, e.b, p, "orders", 6)
	c := newConsumer(t, e.b, "billing", "orders")
	first := pollN(t, c, 6)
	require.NoError(t, c.Commit(context.Background()))

	var r control.ResetReply
	e.ok("group.reset_offset", `{"group":"billing","topic":"orders","to":"earliest"}`, &r)
	assert.Equal(t, 1, r.Members)
	assert.Empty(t, r.Warning)
	again := pollN(t, c, 6)
	bodies := func(ms []*consumer.Message) map[string]bool {
		out := map[string]bool{}
		for _, m := range ms {
			out[string(m.Body)] = true
		}
		return out
	}
	assert.Equal(t, bodies(first), bodies(again), "every message is delivered again after the reset")
}
