package consumer_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/consumer"
)

// A consumer owning more queues than Java's 20 pull threads gets a message in any of them
// while the broker parks the pulls of the idle ones: by default no queue's pull waits for a
// slot that a parked pull holds. With the bound asked for, a parked pull does hold its slot
// (the documented trade-off), which is what this checks against.
func TestEveryOwnedQueueIsPulledWhileOthersPark(t *testing.T) {
	const queues = 24
	suspend := 25 * time.Second // far beyond the wait below: a message stuck behind parks shows
	for _, tc := range []struct {
		name    string
		opts    []consumer.Option
		stalled bool
	}{
		{name: "default", opts: nil, stalled: false},
		{name: "bounded to 20", opts: []consumer.Option{consumer.WithPullGoroutines(20)}, stalled: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := startBroker(t, nil)
			topic := strings.NewReplacer("/", "_", " ", "_").Replace(uniqueName(t))
			mqs := createTopic(t, b, topic, queues)
			c := newConsumer(t, b, topic+"-g", append([]consumer.Option{
				consumer.WithBrokerSuspend(suspend), consumer.WithConsumeFrom(consumer.ConsumeFromFirst),
			}, tc.opts...)...)
			require.NoError(t, c.Subscribe(topic, "*"))
			p := newProducer(t, b)
			want := 0
			for _, mq := range mqs {
				// Uneven backlogs: queues drain at different times, and a drained queue's
				// pull parks while others still have messages.
				want += len(produceTo(t, p, mq, fmt.Sprintf("q%d", mq.QueueID), 1+mq.QueueID*3, nil))
			}
			require.NoError(t, c.Start(context.Background()))
			got := pollN(t, c, want, 8*time.Second)
			missing := want - len(got)
			if tc.stalled {
				assert.Positive(t, missing, "with 20 slots and %d queues, some queue waits behind parked pulls", queues)
			} else {
				assert.Zero(t, missing, "every queue's message arrives while the others' pulls park")
			}
		})
	}
}
