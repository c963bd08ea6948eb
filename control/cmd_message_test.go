package control_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/protocol"
)

func TestMessageGet(t *testing.T) {
	e := start(t, nil)
	p := newProducer(t, e.b)
	res := send(t, e.b, p, "orders", 3)

	var m control.MessageReply
	e.ok("message.get", `{"msg_id":"`+res[1].OffsetMsgID+`"}`, &m)
	assert.Equal(t, "orders", m.Topic)
	assert.Equal(t, int32(res[1].Queue.QueueID), m.Queue)
	assert.Equal(t, res[1].QueueOffset, m.Offset)
	assert.Equal(t, "m-1", string(m.Body), "the body travels in base64 and decodes to what was sent")
	assert.Equal(t, 3, m.BodySize)
	assert.Equal(t, "t", m.Properties["TAGS"])
	assert.Equal(t, res[1].MsgID, m.Properties["UNIQ_KEY"])
	assert.False(t, m.StoreTime.IsZero())
	assert.Equal(t, res[1].OffsetMsgID, m.MsgID)

	raw := e.request("message.get", `{"msg_id":"`+res[1].OffsetMsgID+`"}`)
	assert.Contains(t, string(raw.Data), `"body":"bS0x"`, "standard base64 of m-1")

	assert.Contains(t, e.fail("message.get", `{}`, control.CodeBadRequest), `field "msg_id": required`)
	assert.Contains(t, e.fail("message.get", `{"msg_id":"xyz"}`, control.CodeBadRequest), `field "msg_id": `)
	assert.Contains(t, e.fail("message.get", `{"msg_id":12}`, control.CodeBadRequest), `field "msg_id": must be a string`)
	assert.Contains(t, e.fail("message.get", `{"id":"x"}`, control.CodeBadRequest), `field "id": unknown field`)
	// A well-formed id of this broker at an offset where no message starts.
	host, off, err := protocol.ParseOffsetMsgID(res[1].OffsetMsgID)
	require.NoError(t, err)
	e.fail("message.get", `{"msg_id":"`+protocol.OffsetMsgID(host, off+1)+`"}`, control.CodeNotFound)
}
