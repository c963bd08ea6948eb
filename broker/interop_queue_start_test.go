//go:build !race

package broker_test

import (
	"fmt"
	"testing"
	"time"

	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/stretchr/testify/require"
)

// A group that consumes from the last offset must still read what was written into a queue
// the topic gained after the group started, before any member first looked at that queue.
func TestRocketMQGroupReadsAQueueAddedAfterItStarted(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.createTopic("grows", 1)

	first := newReceived()
	newPushConsumer(t, b, "grows-group", "grows", "*", first,
		rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromLastOffset),
		rmqconsumer.WithInstance(fmt.Sprintf("a-%s", instance(t))))
	require.Eventually(t, func() bool { return len(b.GroupMembers("grows-group")) == 1 }, 10*time.Second, 10*time.Millisecond)

	// The topic gains a queue and messages land in it before any member has looked at it.
	c.createTopic("grows", 2)
	const n = 5
	for i := range n {
		c.sendTo("grows", 1, fmt.Sprintf("late-%d", i))
	}

	// A second member (sorted after the first, so it is given queue 1 of 2) takes the new
	// queue. Consuming from the last offset must not mean skipping these messages.
	second := newReceived()
	newPushConsumer(t, b, "grows-group", "grows", "*", second,
		rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromLastOffset),
		rmqconsumer.WithInstance(fmt.Sprintf("b-%s", instance(t))))
	second.waitFor(t, n, 20*time.Second)
}
