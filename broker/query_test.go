package broker_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

func (c *rawClient) sendKeyed(topic, body, keys, uniq string) {
	c.t.Helper()
	props := map[string]string{protocol.PropertyKeys: keys, protocol.PropertyUniqueKey: uniq}
	h := &protocol.SendMessageRequestHeader{
		ProducerGroup: "raw", Topic: topic, DefaultTopic: protocol.AutoCreateTopicKey, DefaultTopicQueueNums: 4,
		QueueID: 0, BornTimestamp: time.Now().UnixMilli(), Properties: protocol.EncodeProperties(props),
	}
	resp := c.invoke(context.Background(), protocol.SendMessage, h, []byte(body))
	require.Equal(c.t, protocol.Success, resp.ResponseCode(), resp.Remark)
}

func (c *rawClient) query(h *protocol.QueryMessageRequestHeader) (*protocol.Command, []*protocol.MessageExt) {
	c.t.Helper()
	resp := c.invoke(context.Background(), protocol.QueryMessage, h, nil)
	var out []*protocol.MessageExt
	for b := resp.Body; len(b) > 0; {
		m, n, err := protocol.DecodeStored(b)
		require.NoError(c.t, err)
		out = append(out, m)
		b = b[n:]
	}
	return resp, out
}

func bodies(ms []*protocol.MessageExt) []string {
	out := []string{}
	for _, m := range ms {
		out = append(out, string(m.Body))
	}
	return out
}

func TestQueryMessageByKey(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.sendKeyed("qk", "m0", "order-1", "U0")
	c.sendKeyed("qk", "m1", "order-1 customer-9", "U1")
	c.sendKeyed("qk", "m2", "customer-9", "U2")
	require.Eventually(t, func() bool { return b.StoreMax("qk", 0) == 3 }, 5*time.Second, time.Millisecond)

	all := func(key string) *protocol.QueryMessageRequestHeader {
		return &protocol.QueryMessageRequestHeader{Topic: "qk", Key: key, MaxNum: 32, BeginTimestamp: 0, EndTimestamp: math.MaxInt64}
	}
	resp, ms := c.query(all("order-1"))
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	assert.Equal(t, []string{"m0", "m1"}, bodies(ms))
	var rh protocol.QueryMessageResponseHeader
	require.NoError(t, resp.DecodeHeader(&rh))
	assert.Positive(t, rh.IndexLastUpdateTimestamp)
	assert.Positive(t, rh.IndexLastUpdatePhyoffset, "the last message indexed is the third")

	_, ms = c.query(all("customer-9"))
	assert.Equal(t, []string{"m1", "m2"}, bodies(ms))

	u := all("U1")
	u.Unique = true
	u.MaxNum = 0 // ignored for a unique-key query, as Java overrides it
	resp, ms = c.query(u)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	assert.Equal(t, []string{"m1"}, bodies(ms))

	resp, ms = c.query(all("nothing"))
	assert.Equal(t, protocol.QueryNotFound, resp.ResponseCode())
	assert.Contains(t, resp.Remark, "can not find message")
	assert.Empty(t, ms)
	require.NoError(t, resp.DecodeHeader(&rh), "the index position travels with QUERY_NOT_FOUND too")

	other := all("order-1")
	other.Topic = "never-created"
	resp, _ = c.query(other)
	assert.Equal(t, protocol.QueryNotFound, resp.ResponseCode())

	// The time range bounds store times.
	past := all("order-1")
	past.EndTimestamp = time.Now().Add(-time.Hour).UnixMilli()
	resp, _ = c.query(past)
	assert.Equal(t, protocol.QueryNotFound, resp.ResponseCode())
}

func TestQueryMessageBoundsTheResult(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	for i := range 70 {
		c.sendKeyed("qb", fmt.Sprintf("m%02d", i), "many", fmt.Sprintf("U%d", i))
	}
	require.Eventually(t, func() bool { return b.StoreMax("qb", 0) == 70 }, 5*time.Second, time.Millisecond)
	h := &protocol.QueryMessageRequestHeader{Topic: "qb", Key: "many", MaxNum: 5, EndTimestamp: math.MaxInt64}
	_, ms := c.query(h)
	assert.Equal(t, []string{"m65", "m66", "m67", "m68", "m69"}, bodies(ms), "the newest maxNum, oldest first")
	h.MaxNum = 1000
	resp, ms := c.query(h)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	assert.Len(t, ms, 64, "capped at the broker's maximum")
	assert.Equal(t, "m69", string(ms[63].Body))
}

func TestQueryMessageRefusesBadInput(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	good := func() map[string]string {
		return (&protocol.QueryMessageRequestHeader{Topic: "qx", Key: "k", MaxNum: 8, BeginTimestamp: 10, EndTimestamp: 20}).Encode()
	}
	cases := []struct {
		name   string
		mod    func(map[string]string)
		remark string
	}{
		{"backwards range", func(m map[string]string) { m["beginTimestamp"] = "30" }, "beginTimestamp 30 is after endTimestamp 20"},
		{"zero maxNum", func(m map[string]string) { m["maxNum"] = "0" }, "maxNum 0 is illegal"},
		{"negative maxNum", func(m map[string]string) { m["maxNum"] = "-3" }, "maxNum -3 is illegal"},
		{"huge maxNum", func(m map[string]string) { m["maxNum"] = "99999999999" }, `"maxNum"`},
		{"maxNum not a number", func(m map[string]string) { m["maxNum"] = "ten" }, `"maxNum"`},
		{"bad topic", func(m map[string]string) { m["topic"] = "no spaces" }, "no spaces"},
		{"empty key", func(m map[string]string) { m["key"] = "" }, "key is empty"},
		{"missing key", func(m map[string]string) { delete(m, "key") }, `"key": missing`},
		{"missing end", func(m map[string]string) { delete(m, "endTimestamp") }, `"endTimestamp": missing`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ext := good()
			tc.mod(ext)
			resp, err := c.cl.Invoke(context.Background(), b.Addr(), protocol.NewRequest(protocol.QueryMessage, ext, nil))
			require.NoError(t, err)
			assert.Equal(t, protocol.InvalidParameter, resp.ResponseCode(), resp.Remark)
			assert.True(t, strings.Contains(resp.Remark, tc.remark), "remark %q should contain %q", resp.Remark, tc.remark)
		})
	}
}
