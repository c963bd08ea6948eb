package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/protocol"
)

// pollErr polls until Poll fails or wait passes, and returns the failure (nil: none came).
func pollErr(t *testing.T, c *consumer.LitePull) error {
	t.Helper()
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		_, err := c.Poll(ctx)
		expired := ctx.Err() != nil
		cancel()
		if err != nil && !expired {
			return err
		}
	}
	return nil
}

// A subscription the broker cannot compile (a SQL92 syntax error) is not retried in silence:
// Poll reports it, with the broker's code and remark, while transient failures stay retried.
func TestPollReportsASubscriptionTheBrokerRefuses(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "refused", 2)
	c := newConsumer(t, b, "refused-group")
	require.NoError(t, c.SubscribeSelector("refused", consumer.SQLSelector("a >")))
	require.NoError(t, c.Start(context.Background()))

	err := pollErr(t, c)
	require.ErrorIs(t, err, consumer.ErrSubscriptionRefused)
	var be *consumer.BrokerError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, protocol.SubscriptionParseFailed, be.Code)
	assert.Contains(t, err.Error(), "refused", "the error names the topic")
	assert.Contains(t, err.Error(), "a >", "and the broker's remark the expression")

	// Reported, not stuck: the next Poll waits for the next answer again.
	err = pollErr(t, c)
	require.ErrorIs(t, err, consumer.ErrSubscriptionRefused, "the broker refuses the retry too")
}

// An assigned queue of a topic that does not exist fails Poll with ErrTopicNotExist.
func TestPollReportsATopicThatDoesNotExist(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "elsewhere", 1) // a route, so that the broker's address is known
	c := newConsumer(t, b, "missing-group")
	require.NoError(t, c.Assign([]consumer.MessageQueue{{Topic: "elsewhere", BrokerName: "broker-a", QueueID: 0}}))
	require.NoError(t, c.Start(context.Background()))
	_, err := c.FetchMessageQueues(context.Background(), "elsewhere")
	require.NoError(t, err)
	require.NoError(t, c.Assign([]consumer.MessageQueue{{Topic: "nowhere", BrokerName: "broker-a", QueueID: 0}}))

	err = pollErr(t, c)
	require.ErrorIs(t, err, consumer.ErrTopicNotExist)
	assert.Contains(t, err.Error(), "nowhere")
}

// A group the broker does not keep (DisableAutoCreateGroups) fails Poll with
// ErrGroupNotExist rather than logging every second.
func TestPollReportsAGroupTheBrokerDoesNotKeep(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) { c.DisableAutoCreateGroups = true })
	mqs := createTopic(t, b, "closed", 1)
	c := newConsumer(t, b, "unknown-group")
	require.NoError(t, c.Assign(mqs))
	require.NoError(t, c.Start(context.Background()))
	err := pollErr(t, c)
	require.ErrorIs(t, err, consumer.ErrGroupNotExist)
	assert.False(t, errors.Is(err, consumer.ErrTopicNotExist))
}
