package broker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

func (c *rawClient) sendProps(topic, body string, props map[string]string) {
	c.t.Helper()
	h := &protocol.SendMessageRequestHeader{
		ProducerGroup: "raw", Topic: topic, DefaultTopic: protocol.AutoCreateTopicKey, DefaultTopicQueueNums: 1,
		QueueID: 0, BornTimestamp: time.Now().UnixMilli(), Properties: protocol.EncodeProperties(props),
	}
	resp := c.invoke(context.Background(), protocol.SendMessage, h, []byte(body))
	require.Equal(c.t, protocol.Success, resp.ResponseCode(), resp.Remark)
}

func sqlPull(c *rawClient, topic, expr string) *protocol.Command {
	h := pullHeader(topic, 0, 0, expr)
	h.ExpressionType = protocol.ExpressionSQL92
	return c.invoke(context.Background(), protocol.PullMessage, h, nil)
}

// SQL92 subscriptions are on by default: the broker delivers only the messages whose
// properties (TAGS included) satisfy the expression.
func TestPullWithASQL92SubscriptionFiltersByProperties(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.sendProps("sql", "eu-big", map[string]string{"region": "eu", "amount": "150", protocol.PropertyTags: "order"})
	c.sendProps("sql", "us-small", map[string]string{"region": "us", "amount": "5", protocol.PropertyTags: "order"})
	c.sendProps("sql", "no-amount", map[string]string{"region": "eu"})
	c.sendProps("sql", "eu-big-refund", map[string]string{"region": "eu", "amount": "300", protocol.PropertyTags: "refund"})
	require.Eventually(t, func() bool { return b.StoreMax("sql", 0) == 4 }, 5*time.Second, time.Millisecond)

	resp := sqlPull(c, "sql", "region IN ('eu', 'jp') AND amount > 100 AND TAGS = 'order'")
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	msgs, err := protocol.DecodeStoredAll(resp.Body)
	require.NoError(t, err)
	var bodies []string
	for _, m := range msgs {
		bodies = append(bodies, string(m.Body))
	}
	assert.Equal(t, []string{"eu-big"}, bodies)
	var rh protocol.PullMessageResponseHeader
	require.NoError(t, resp.DecodeHeader(&rh))
	assert.Equal(t, int64(4), rh.NextBeginOffset, "the messages that did not match are passed, not re-read")

	resp = sqlPull(c, "sql", "amount IS NULL")
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	msgs, err = protocol.DecodeStoredAll(resp.Body)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	assert.Equal(t, "no-amount", string(msgs[0].Body))
}

// With SQL92 turned off, such a subscription is refused, as RocketMQ refuses it without
// enablePropertyFilter.
func TestSQL92CanBeTurnedOff(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) { c.DisableSQL92 = true })
	c := newRawClient(t, b, nil)
	c.sendProps("sqloff", "m", map[string]string{"a": "2"})
	resp := sqlPull(c, "sqloff", "a > 1")
	require.Equal(t, protocol.SubscriptionParseFailed, resp.ResponseCode())
	assert.Contains(t, resp.Remark, "SQL92")
}
