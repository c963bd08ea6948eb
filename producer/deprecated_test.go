//lint:file-ignore SA1019 this test checks that the deprecated options still work

package producer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/producer"
)

// Programs written against the client settings the producer and consumer once took directly
// keep working: the deprecated options forward to WithClientOptions, and they add up.
func TestDeprecatedClientOptionsStillWork(t *testing.T) {
	b := startBroker(t, nil)
	ctx := context.Background()
	p, err := producer.New("deprecated-options", producer.WithNameServers(b.NamesrvAddr()), producer.WithLogger(quiet()),
		producer.WithInstanceName("old-style"), producer.WithJSONHeaders(), producer.WithRouteRefreshInterval(time.Second))
	require.NoError(t, err)
	require.NoError(t, p.Start(ctx))
	defer p.Close(ctx)
	_, err = p.Send(ctx, &producer.Message{Topic: "deprecated", Body: []byte("hello")})
	require.NoError(t, err)

	c, err := consumer.NewLitePull("deprecated-reader", consumer.WithNameServers(b.NamesrvAddr()), consumer.WithLogger(quiet()),
		consumer.WithConsumeFrom(consumer.ConsumeFromFirst), consumer.WithPollTimeout(100*time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, c.Subscribe("deprecated", "*"))
	require.NoError(t, c.Start(ctx))
	defer c.Close(ctx)
	var bodies []string
	require.Eventually(t, func() bool {
		msgs, err := c.Poll(ctx)
		require.NoError(t, err)
		for _, m := range msgs {
			bodies = append(bodies, string(m.Body))
		}
		return len(bodies) > 0
	}, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"hello"}, bodies)
}
