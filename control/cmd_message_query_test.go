package control_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/producer"
)

func TestMessageQuery(t *testing.T) {
	e := start(t, nil)
	p := newProducer(t, e.b)
	var res []producer.SendResult
	for i := range 3 {
		r, err := p.Send(context.Background(), &producer.Message{Topic: "orders", Body: fmt.Appendf(nil, "m-%d", i), Tags: "t",
			Keys: []string{fmt.Sprintf("order-%d", i%2), "all"}})
		require.NoError(t, err)
		res = append(res, r)
	}
	for _, r := range res {
		require.Eventually(t, func() bool { return e.b.StoreMax("orders", int32(r.Queue.QueueID)) > r.QueueOffset }, wait, time.Millisecond)
	}

	var q control.MessageQueryReply
	e.ok("message.query", `{"topic":"orders","key":"order-0"}`, &q)
	assert.Equal(t, "orders", q.Topic)
	assert.Equal(t, "order-0", q.Key)
	require.Len(t, q.Messages, 2)
	for j, m := range q.Messages {
		assert.Equal(t, fmt.Sprintf("m-%d", 2*j), string(m.Body))
		assert.Equal(t, res[2*j].OffsetMsgID, m.MsgID, "each message carries the id message.get takes")
		assert.Equal(t, "order-0 all", m.Properties["KEYS"])
		assert.Equal(t, "broker-a", m.Node)
	}

	e.ok("message.query", `{"topic":"orders","key":"all","max":2}`, &q)
	require.Len(t, q.Messages, 2)
	assert.Equal(t, "m-1", string(q.Messages[0].Body), "the newest when more match")

	e.ok("message.query", `{"topic":"orders","key":"`+res[1].MsgID+`","unique":true}`, &q)
	require.Len(t, q.Messages, 1)
	assert.Equal(t, "m-1", string(q.Messages[0].Body))

	stored := q.Messages[0].StoreTime
	e.ok("message.query", fmt.Sprintf(`{"topic":"orders","key":"all","begin":%d,"end":"%s"}`,
		stored.UnixMilli(), stored.Format(time.RFC3339Nano)), &q)
	require.NotEmpty(t, q.Messages)
	for _, m := range q.Messages {
		assert.True(t, m.StoreTime.Equal(stored))
	}

	e.ok("message.query", `{"topic":"orders","key":"nothing"}`, &q)
	assert.NotNil(t, q.Messages)
	assert.Empty(t, q.Messages)
	e.ok("message.query", `{"topic":"orders","key":"all","end":"2001-01-01T00:00:00Z"}`, &q)
	assert.Empty(t, q.Messages, "stored after the range")

	assert.Contains(t, e.fail("message.query", `{"key":"k"}`, control.CodeBadRequest), `field "topic": required`)
	assert.Contains(t, e.fail("message.query", `{"topic":"orders"}`, control.CodeBadRequest), `field "key": required`)
	assert.Contains(t, e.fail("message.query", `{"topic":"no spaces","key":"k"}`, control.CodeBadRequest), `field "topic"`)
	assert.Contains(t, e.fail("message.query", `{"topic":"orders","key":"k","max":0}`, control.CodeBadRequest), `field "max": must be within 1..64`)
	assert.Contains(t, e.fail("message.query", `{"topic":"orders","key":"k","max":65}`, control.CodeBadRequest), `field "max"`)
	assert.Contains(t, e.fail("message.query", `{"topic":"orders","key":"k","begin":20,"end":10}`, control.CodeBadRequest), `field "end": is before begin`)
	assert.Contains(t, e.fail("message.query", `{"topic":"orders","key":"k","begin":"yesterday"}`, control.CodeBadRequest), `field "begin"`)
	assert.Contains(t, e.fail("message.query", `{"topic":"orders","key":"k","begin":-1}`, control.CodeBadRequest), `field "begin"`)
	assert.Contains(t, e.fail("message.query", `{"topic":"orders","key":"k","colour":1}`, control.CodeBadRequest), `field "colour": unknown field`)
	e.fail("message.query", `{"topic":"nope","key":"k"}`, control.CodeNotFound)
}
