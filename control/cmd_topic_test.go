package control_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/protocol"
)

func TestTopicCreate(t *testing.T) {
	e := start(t, nil)
	var r control.TopicReply
	e.ok("topic.create", `{"topic":"orders","queues":4}`, &r)
	assert.Equal(t, control.TopicView{Topic: "orders", ReadQueues: 4, WriteQueues: 4, Perm: "rw", Kind: "user"}, r.Topic)
	tc, ok := e.b.Topic("orders")
	require.True(t, ok)
	assert.Equal(t, 4, tc.ReadQueueNums)
	assert.Equal(t, protocol.PermRead|protocol.PermWrite, tc.Perm)

	e.ok("topic.create", `{"topic":"audit","queues":2,"read_queues":8,"perm":"r","order":true}`, &r)
	assert.Equal(t, control.TopicView{Topic: "audit", ReadQueues: 8, WriteQueues: 2, Perm: "r", Order: true, Kind: "user"}, r.Topic)
	e.ok("topic.create", `{"topic":"split","read_queues":3,"write_queues":5}`, &r)
	assert.Equal(t, 3, r.Topic.ReadQueues)
	assert.Equal(t, 5, r.Topic.WriteQueues)

	assert.Contains(t, e.fail("topic.create", `{"topic":"orders","queues":4}`, control.CodeConflict), "already exists")

	for _, tc := range []struct{ body, want string }{
		{`{"queues":4}`, `field "topic": required`},
		{`{"topic":"bad topic","queues":4}`, `field "topic": `},
		{`{"topic":"x"}`, `field "queues": required`},
		{`{"topic":"x","read_queues":4}`, `field "queues": required`},
		{`{"topic":"x","queues":0}`, `field "queues": must be 1..1024`},
		{`{"topic":"x","queues":1025}`, `field "queues": must be 1..1024`},
		{`{"topic":"x","queues":1,"write_queues":-1}`, `field "write_queues": must be 1..1024`},
		{`{"topic":"x","queues":1,"perm":"rwx"}`, `field "perm": must be "rw", "r", "w" or "none"`},
		{`{"topic":"SCHEDULE_TOPIC_XXXX","queues":1}`, `field "topic": `},
	} {
		assert.Contains(t, e.fail("topic.create", tc.body, control.CodeBadRequest), tc.want, tc.body)
	}
	_, ok = e.b.Topic("x")
	assert.False(t, ok)
}

func TestTopicUpdate(t *testing.T) {
	e := start(t, nil)
	e.ok("topic.create", `{"topic":"orders","queues":4}`, nil)
	var r control.TopicReply
	e.ok("topic.update", `{"topic":"orders","write_queues":8,"perm":"r"}`, &r)
	assert.Equal(t, control.TopicView{Topic: "orders", ReadQueues: 4, WriteQueues: 8, Perm: "r", Kind: "user"}, r.Topic)
	tc, _ := e.b.Topic("orders")
	assert.Equal(t, 8, tc.WriteQueueNums)
	assert.Equal(t, protocol.PermRead, tc.Perm)

	assert.Contains(t, e.fail("topic.update", `{"topic":"nope","queues":2}`, control.CodeNotFound), "nope")
	assert.Contains(t, e.fail("topic.update", `{"topic":"orders"}`, control.CodeBadRequest), "nothing to update")
	assert.Contains(t, e.fail("topic.update", `{"topic":"orders","queues":0}`, control.CodeBadRequest), `field "queues"`)
	assert.Contains(t, e.fail("topic.update", `{"queues":2}`, control.CodeBadRequest), `field "topic": required`)
	assert.Contains(t, e.fail("topic.update", `{"topic":"TBW102","queues":2}`, control.CodeBadRequest), `field "topic"`)
	_, ok := e.b.Topic("nope")
	assert.False(t, ok, "an update created a topic")
}

func TestTopicListDescribeDelete(t *testing.T) {
	e := start(t, nil)
	// More write than read queues: describe shows every queue that holds messages.
	e.ok("topic.create", `{"topic":"orders","read_queues":1,"write_queues":2}`, nil)
	p := newProducer(t, e.b)
	send(t, e.b, p, "orders", 6)

	var list control.TopicListReply
	e.ok("topic.list", ``, &list)
	kinds := map[string]string{}
	for _, v := range list.Topics {
		kinds[v.Topic] = v.Kind
	}
	assert.Equal(t, "user", kinds["orders"])
	assert.Equal(t, "system", kinds["SCHEDULE_TOPIC_XXXX"])

	var d control.TopicDescribeReply
	e.ok("topic.describe", `{"topic":"orders"}`, &d)
	assert.Equal(t, 1, d.Topic.ReadQueues)
	require.Len(t, d.Queues, 2)
	assert.Positive(t, d.Queues[1].MaxOffset, "the producer wrote to both write queues")
	var total int64
	for i, q := range d.Queues {
		assert.Equal(t, int32(i), q.Queue)
		assert.Equal(t, int64(0), q.MinOffset)
		assert.Equal(t, e.b.StoreMax("orders", int32(i)), q.MaxOffset)
		total += q.MaxOffset
	}
	assert.Equal(t, int64(6), total)
	assert.Equal(t, int64(6), d.Messages)

	e.fail("topic.describe", `{"topic":"nope"}`, control.CodeNotFound)
	assert.Contains(t, e.fail("topic.describe", `{}`, control.CodeBadRequest), `field "topic": required`)

	var del control.TopicDeleteReply
	e.ok("topic.delete", `{"topic":"orders"}`, &del)
	assert.True(t, del.Deleted)
	_, ok := e.b.Topic("orders")
	assert.False(t, ok)
	e.fail("topic.describe", `{"topic":"orders"}`, control.CodeNotFound)
	e.fail("topic.delete", `{"topic":"orders"}`, control.CodeNotFound)
	assert.Contains(t, e.fail("topic.delete", `{"topic":"SCHEDULE_TOPIC_XXXX"}`, control.CodeBadRequest), "reserved")
	assert.Contains(t, e.fail("topic.delete", `{"topic":"orders","force":true}`, control.CodeBadRequest), `field "force": unknown field`)
}
