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

// Pulls under protocol.ReaderGroup read like any other, with their filter, but leave nothing:
// no subscription group, no retry topic, no offset (a pull's commit flag is ignored), no
// event; the retry topic's route is not made for it.
func TestReaderGroupPullsLeaveNothingBehind(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.send("readable", "one", "a")
	c.send("readable", "two", "b")
	require.Eventually(t, func() bool { return b.StoreMax("readable", 0) == 2 }, 5*time.Second, 5*time.Millisecond)
	events := make(chan broker.Event, 64)
	defer b.Subscribe(func(e broker.Event) { events <- e })()

	h := pullHeader("readable", 0, 0, "b")
	h.ConsumerGroup = protocol.ReaderGroup
	h.SysFlag |= protocol.PullFlagCommitOffset
	h.CommitOffset = 1
	resp := c.invoke(context.Background(), protocol.PullMessage, h, nil)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	msgs, err := protocol.DecodeStoredAll(resp.Body)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	assert.Equal(t, "two", string(msgs[0].Body), "the tag filter applies")

	route := c.invoke(context.Background(), protocol.GetRouteInfoByTopic, &protocol.GetRouteInfoRequestHeader{Topic: broker.RetryTopicPrefix + protocol.ReaderGroup}, nil)
	assert.Equal(t, protocol.TopicNotExist, route.ResponseCode())

	assert.Empty(t, b.Groups(), "no group")
	_, ok := b.Group(protocol.ReaderGroup)
	assert.False(t, ok)
	_, ok = b.Topic(broker.RetryTopicPrefix + protocol.ReaderGroup)
	assert.False(t, ok, "no retry topic")
	no := false
	q := c.invoke(context.Background(), protocol.QueryConsumerOffset, &protocol.QueryConsumerOffsetRequestHeader{ConsumerGroup: protocol.ReaderGroup, Topic: "readable", QueueID: 0, SetZeroIfNotFound: &no}, nil)
	assert.Equal(t, protocol.QueryNotFound, q.ResponseCode(), "no offset: %s", q.Remark)
	// Events reach a subscriber in order: any the pull emitted arrives before the barrier's.
	c.send("barrier", "x", "")
	for e := range events {
		if e.Type == broker.TopicCreated && e.Topic == "barrier" {
			break
		}
		t.Fatalf("a stateless pull emitted %+v", e)
	}
}
