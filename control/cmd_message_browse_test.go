package control_test

import (
	"encoding/base64"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
)

// sendTo stores n messages in one queue of topic with message.send and returns the replies;
// message i has the property region "eu" when i is even, else "us".
func sendTo(t *testing.T, e *env, topic string, queue, n int) []control.MessageSendReply {
	t.Helper()
	var out []control.MessageSendReply
	for i := range n {
		region := "us"
		if i%2 == 0 {
			region = "eu"
		}
		var r control.MessageSendReply
		e.ok("message.send", fmt.Sprintf(`{"topic":%q,"queue":%d,"body":"q%d-%d","tags":"t%d","keys":["k%d-%d"],"properties":{"region":%q}}`,
			topic, queue, queue, i, i%3, queue, i, region), &r)
		out = append(out, r)
	}
	// The consume queue is written after the commit log, asynchronously: wait for it.
	require.Eventually(t, func() bool { return e.b.StoreMax(topic, int32(queue)) >= out[n-1].Offset+1 }, wait, 5*time.Millisecond)
	return out
}

func TestMessageSend(t *testing.T) {
	e := start(t, nil)
	e.ok("topic.create", `{"topic":"orders","queues":2}`, nil)

	var r control.MessageSendReply
	e.ok("message.send", `{"topic":"orders","body":"{\"id\":7}","tags":"created","keys":["o-7","c-1"],"properties":{"region":"eu"}}`, &r)
	assert.Equal(t, "orders", r.Topic)
	assert.Contains(t, []int32{0, 1}, r.Queue)
	assert.Equal(t, int64(0), r.Offset)
	assert.Len(t, r.UniqKey, 32)
	assert.False(t, r.StoreTime.IsZero())

	var m control.MessageReply
	e.ok("message.get", `{"msg_id":"`+r.MsgID+`"}`, &m)
	assert.Equal(t, `{"id":7}`, string(m.Body))
	assert.Equal(t, "created", m.Properties["TAGS"])
	assert.Equal(t, "o-7 c-1", m.Properties["KEYS"])
	assert.Equal(t, "eu", m.Properties["region"])
	assert.Equal(t, r.UniqKey, m.Properties["UNIQ_KEY"])
	assert.Equal(t, r.Queue, m.Queue)

	var q control.MessageQueryReply
	e.ok("message.query", `{"topic":"orders","key":"c-1"}`, &q)
	require.Len(t, q.Messages, 1, "the keys are indexed as a producer's are")
	assert.Equal(t, r.MsgID, q.Messages[0].MsgID)
	e.ok("message.query", `{"topic":"orders","key":"`+r.UniqKey+`","unique":true}`, &q)
	require.Len(t, q.Messages, 1)

	var r1 control.MessageSendReply
	e.ok("message.send", `{"topic":"orders","queue":1,"body":"x"}`, &r1)
	assert.Equal(t, int32(1), r1.Queue)

	for _, c := range []struct{ body, code, want string }{
		{`{"body":"x"}`, "400", `field "topic": required`},
		{`{"topic":"nope","body":"x"}`, "404", `topic "nope"`},
		{`{"topic":"orders"}`, "400", `field "body": required`},
		{`{"topic":"orders","body":"x","queue":2}`, "400", `field "queue": `},
		{`{"topic":"orders","body":"x","queue":-1}`, "400", `field "queue": `},
		{`{"topic":"orders","body":"x","properties":{"DELAY":"3"}}`, "400", `field "properties": `},
		{`{"topic":"orders","body":"x","properties":{"a\u0001":"b"}}`, "400", `field "properties": `},
		{`{"topic":"orders","body":"x","tags":"a\u0002"}`, "400", `field "tags": `},
		{`{"topic":"orders","body":7}`, "400", `field "body": must be a string`},
		{`{"topic":"orders","body":"x","extra":1}`, "400", `field "extra": unknown field`},
	} {
		t.Run(c.body, func(t *testing.T) {
			code := control.CodeBadRequest
			if c.code == "404" {
				code = control.CodeNotFound
			}
			assert.Contains(t, e.fail("message.send", c.body, code), c.want)
		})
	}
}

func TestMessageBrowse(t *testing.T) {
	e := start(t, nil)
	e.ok("topic.create", `{"topic":"orders","queues":2}`, nil)
	sent := sendTo(t, e, "orders", 1, 5)

	var p control.MessageBrowseReply
	e.ok("message.browse", `{"topic":"orders","queue":1,"max":2}`, &p)
	assert.Equal(t, int32(1), p.Queue)
	assert.Equal(t, int64(0), p.Offset)
	assert.Equal(t, int64(2), p.Next)
	assert.Equal(t, int64(5), p.MaxOffset)
	require.Len(t, p.Messages, 2)
	assert.Equal(t, sent[0].MsgID, p.Messages[0].MsgID, "shown as message.get shows it")
	assert.Equal(t, "q1-1", string(p.Messages[1].Body))

	var seen []string
	next := int64(0)
	for range 4 {
		e.ok("message.browse", fmt.Sprintf(`{"topic":"orders","queue":1,"offset":%d,"max":2}`, next), &p)
		for _, m := range p.Messages {
			seen = append(seen, string(m.Body))
		}
		next = p.Next
	}
	assert.Equal(t, []string{"q1-0", "q1-1", "q1-2", "q1-3", "q1-4"}, seen, "paging with next reads every message once")
	assert.Equal(t, int64(5), next)

	e.ok("message.browse", `{"topic":"orders","queue":1}`, &p)
	assert.Len(t, p.Messages, 5, "default max 20")
	e.ok("message.browse", `{"topic":"orders","queue":0}`, &p)
	assert.Empty(t, p.Messages)

	// A time: from the first message stored at or after it.
	e.ok("message.browse", fmt.Sprintf(`{"topic":"orders","queue":1,"timestamp":%d}`, sent[0].StoreTime.UnixMilli()), &p)
	require.NotEmpty(t, p.Messages)
	assert.Equal(t, int64(0), p.Offset)
	e.ok("message.browse", fmt.Sprintf(`{"topic":"orders","queue":1,"timestamp":%q}`, sent[4].StoreTime.Add(1e9).Format("2006-01-02T15:04:05.000Z07:00")), &p)
	assert.Empty(t, p.Messages, "nothing stored after the last message")
	assert.Equal(t, int64(5), p.Offset)

	var browse0 control.MessageBrowseReply
	e.ok("message.browse", `{"topic":"orders","broker":"broker-a","queue":1,"max":1}`, &browse0)
	assert.Len(t, browse0.Messages, 1)
	assert.Equal(t, base64.StdEncoding.EncodeToString([]byte("q1-0")), base64.StdEncoding.EncodeToString(browse0.Messages[0].Body))

	for _, c := range []struct {
		body string
		code int
		want string
	}{
		{`{"queue":0}`, control.CodeBadRequest, `field "topic": required`},
		{`{"topic":"orders"}`, control.CodeBadRequest, `field "queue": required`},
		{`{"topic":"nope","queue":0}`, control.CodeNotFound, `topic "nope"`},
		{`{"topic":"orders","queue":2}`, control.CodeNotFound, `queue 2`},
		{`{"topic":"orders","queue":0,"max":0}`, control.CodeBadRequest, `field "max": must be within 1..100`},
		{`{"topic":"orders","queue":0,"max":101}`, control.CodeBadRequest, `field "max": must be within 1..100`},
		{`{"topic":"orders","queue":0,"offset":-1}`, control.CodeBadRequest, `field "offset": `},
		{`{"topic":"orders","queue":0,"offset":1,"timestamp":1}`, control.CodeBadRequest, `field "timestamp": give offset or timestamp`},
		{`{"topic":"orders","queue":0,"timestamp":"yesterday"}`, control.CodeBadRequest, `field "timestamp": `},
		{`{"topic":"orders","queue":"a"}`, control.CodeBadRequest, `field "queue": `},
		{`{"topic":"orders","queue":0,"broker":"broker-z"}`, control.CodeNotFound, `broker "broker-z"`},
	} {
		t.Run(c.body, func(t *testing.T) {
			assert.Contains(t, e.fail("message.browse", c.body, c.code), c.want)
		})
	}
}
