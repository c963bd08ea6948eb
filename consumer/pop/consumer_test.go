package pop_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer/pop"
	"github.com/flowd-io/flowd/protocol"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startBroker runs a broker with its name service on free loopback ports.
func startBroker(t *testing.T, mod func(*broker.Config)) *broker.Broker {
	t.Helper()
	cfg := broker.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", NamesrvListen: "127.0.0.1:0", Logger: quiet()}
	cfg.Store.SegmentSize = 16 << 20
	if mod != nil {
		mod(&cfg)
	}
	b, err := broker.New(cfg)
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, b.Shutdown(ctx))
	})
	return b
}

// send stores n messages in each queue of topic, the body "q<queue>-<i>".
func send(t *testing.T, b *broker.Broker, topic string, queues, n int, props map[string]string) {
	t.Helper()
	for q := range queues {
		for i := range n {
			_, err := b.Send(context.Background(), protocol.Message{Topic: topic, Body: []byte(fmt.Sprintf("q%d-%d", q, i)), Properties: props}, int32(q))
			require.NoError(t, err)
		}
	}
}

func newConsumer(t *testing.T, b *broker.Broker, group, topic string, opts ...pop.Option) *pop.Consumer {
	t.Helper()
	opts = append([]pop.Option{pop.WithClientOptions(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet()))}, opts...)
	c, err := pop.New(group, topic, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// receiveAll receives until n messages came.
func receiveAll(t *testing.T, c *pop.Consumer, n int) []pop.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var out []pop.Message
	for len(out) < n {
		msgs, err := c.Receive(ctx, pop.MaxBatch)
		require.NoError(t, err)
		require.NoError(t, ctx.Err(), "received %d of %d", len(out), n)
		out = append(out, msgs...)
	}
	return out
}

func TestReceiveAckBatch(t *testing.T) {
	b := startBroker(t, nil)
	require.NoError(t, b.CreateTopic(broker.TopicConfig{Name: "T", ReadQueueNums: 4, WriteQueueNums: 4, Perm: 6}))
	send(t, b, "T", 4, 10, map[string]string{protocol.PropertyTags: "a"})
	c := newConsumer(t, b, "G", "T", pop.WithPollTime(time.Second))

	msgs := receiveAll(t, c, 40)
	require.Len(t, msgs, 40)
	seen := map[string]bool{}
	for _, m := range msgs {
		assert.Equal(t, 1, m.Attempt)
		assert.Equal(t, "a", m.Tags)
		assert.Equal(t, "T", m.Topic)
		assert.NotEmpty(t, m.Receipt)
		assert.Equal(t, m.Receipt, m.Property(protocol.PropertyPopCK))
		assert.Equal(t, "a", m.Properties()[protocol.PropertyTags])
		assert.True(t, m.InvisibleUntil.After(time.Now()))
		seen[string(m.Body)] = true
	}
	assert.Len(t, seen, 40, "each message once")
	require.NoError(t, c.Ack(context.Background(), msgs...), "one batch ack of four queues")
	var acked uint64
	for _, st := range b.PopStats("G") {
		acked += st.Acked
		assert.Equal(t, 0, st.InFlight)
	}
	assert.Equal(t, uint64(40), acked)

	// Acknowledged again: each is not in flight any more.
	err := c.Ack(context.Background(), msgs[:3]...)
	require.ErrorIs(t, err, pop.ErrNotInFlight)
	err = c.Ack(context.Background(), msgs[5])
	require.ErrorIs(t, err, pop.ErrNotInFlight)

	// Nothing left: the receive waits its poll time and comes back empty.
	none, err := c.Receive(context.Background(), 1)
	require.NoError(t, err)
	assert.Empty(t, none)
}

func TestChangeInvisibleDuration(t *testing.T) {
	b := startBroker(t, nil)
	require.NoError(t, b.CreateTopic(broker.TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	send(t, b, "T", 1, 1, nil)
	c := newConsumer(t, b, "G", "T", pop.WithPollTime(0))
	ctx := context.Background()
	msgs := receiveAll(t, c, 1)

	// Visible again at once: a negative acknowledgement; the next receive has it again.
	nacked, err := c.ChangeInvisibleDuration(ctx, msgs[0], 0)
	require.NoError(t, err)
	assert.NotEqual(t, msgs[0].Receipt, nacked.Receipt)
	require.ErrorIs(t, c.Ack(ctx, msgs[0]), pop.ErrNotInFlight, "the old receipt")
	again := receiveAll(t, c, 1)
	assert.Equal(t, 2, again[0].Attempt)
	assert.Equal(t, msgs[0].MsgID, again[0].MsgID)

	longer, err := c.ChangeInvisibleDuration(ctx, again[0], time.Hour)
	require.NoError(t, err)
	assert.True(t, longer.InvisibleUntil.After(time.Now().Add(50*time.Minute)))
	require.NoError(t, c.Ack(ctx, longer))

	_, err = c.ChangeInvisibleDuration(ctx, longer, time.Minute)
	require.ErrorIs(t, err, pop.ErrNotInFlight)
	_, err = c.ChangeInvisibleDuration(ctx, longer, -time.Second)
	require.ErrorIs(t, err, pop.ErrInvalidArgument)
}

func TestConsumersShareAGroup(t *testing.T) {
	b := startBroker(t, nil)
	require.NoError(t, b.CreateTopic(broker.TopicConfig{Name: "T", ReadQueueNums: 2, WriteQueueNums: 2, Perm: 6}))
	send(t, b, "T", 2, 50, nil)
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for range 3 {
		c := newConsumer(t, b, "G", "T", pop.WithPollTime(200*time.Millisecond))
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for {
				msgs, err := c.Receive(ctx, 7)
				if err != nil || len(msgs) == 0 {
					assert.NoError(t, err)
					return
				}
				mu.Lock()
				for _, m := range msgs {
					seen[string(m.Body)]++
				}
				mu.Unlock()
				assert.NoError(t, c.Ack(ctx, msgs...))
			}
		}()
	}
	wg.Wait()
	assert.Len(t, seen, 100)
	for body, n := range seen {
		assert.Equal(t, 1, n, body)
	}
}

func TestFilterAndBadInput(t *testing.T) {
	b := startBroker(t, nil)
	require.NoError(t, b.CreateTopic(broker.TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	send(t, b, "T", 1, 2, map[string]string{protocol.PropertyTags: "a"})
	send(t, b, "T", 1, 2, map[string]string{protocol.PropertyTags: "b"})
	ctx := context.Background()

	c := newConsumer(t, b, "G", "T", pop.WithPollTime(0), pop.WithFilter(protocol.ExpressionTag, "b"))
	msgs := receiveAll(t, c, 2)
	for _, m := range msgs {
		assert.Equal(t, "b", m.Tags)
	}
	none, err := c.Receive(ctx, 32)
	require.NoError(t, err)
	assert.Empty(t, none)

	_, err = c.Receive(ctx, 33)
	require.ErrorIs(t, err, pop.ErrInvalidArgument)
	require.ErrorIs(t, c.Ack(ctx, pop.Message{}), pop.ErrInvalidArgument)

	missing := newConsumer(t, b, "G", "missing")
	_, err = missing.Receive(ctx, 1)
	require.ErrorIs(t, err, pop.ErrTopicNotExist)

	bad := newConsumer(t, b, "G", "T", pop.WithFilter(protocol.ExpressionSQL92, "a >"))
	_, err = bad.Receive(ctx, 1)
	var be *pop.BrokerError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, protocol.SubscriptionParseFailed, be.Code)

	_, err = pop.New("G", "T", pop.WithInvisibleDuration(time.Millisecond))
	require.ErrorIs(t, err, pop.ErrInvalidOption)
	_, err = pop.New("", "T")
	require.ErrorIs(t, err, pop.ErrInvalidArgument)

	require.NoError(t, c.Close(ctx))
	_, err = c.Receive(ctx, 1)
	require.ErrorIs(t, err, pop.ErrClosed)
}

// With JSON headers on the client's connections too (WithJSONHeaders), and with the
// default binary ones, pop requests go out with JSON headers and are answered.
func TestJSONHeadersClient(t *testing.T) {
	b := startBroker(t, nil)
	require.NoError(t, b.CreateTopic(broker.TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	send(t, b, "T", 1, 3, nil)
	c := newConsumer(t, b, "G", "T", pop.WithClientOptions(client.WithJSONHeaders()), pop.WithPollTime(0))
	msgs := receiveAll(t, c, 3)
	require.NoError(t, c.Ack(context.Background(), msgs...))
}

// A shared client: the consumer does not close it.
func TestSharedClient(t *testing.T) {
	b := startBroker(t, nil)
	require.NoError(t, b.CreateTopic(broker.TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	send(t, b, "T", 1, 1, nil)
	cl, err := client.New(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet()))
	require.NoError(t, err)
	defer cl.Close(context.Background())
	c1, err := pop.New("G", "T", pop.WithClient(cl), pop.WithPollTime(0))
	require.NoError(t, err)
	require.NoError(t, c1.Close(context.Background()))
	c2, err := pop.New("G", "T", pop.WithClient(cl), pop.WithPollTime(0))
	require.NoError(t, err)
	msgs := receiveAll(t, c2, 1)
	require.NoError(t, c2.Ack(context.Background(), msgs...))
	_, err = pop.New("G", "T", pop.WithClient(cl), pop.WithClientOptions(client.WithNameServers("x:1")))
	require.ErrorIs(t, err, pop.ErrInvalidOption)
}

// A receive with nothing there waits at the broker (a parked pop, not a goroutine asking
// again) and is answered when a message arrives.
func TestReceiveLongPolls(t *testing.T) {
	b := startBroker(t, nil)
	require.NoError(t, b.CreateTopic(broker.TopicConfig{Name: "T", ReadQueueNums: 2, WriteQueueNums: 2, Perm: 6}))
	send(t, b, "T", 1, 1, nil)
	c := newConsumer(t, b, "G", "T", pop.WithPollTime(time.Minute))
	ctx := context.Background()
	first := receiveAll(t, c, 1)
	require.NoError(t, c.Ack(ctx, first...))

	got := make(chan []pop.Message, 1)
	go func() {
		msgs, err := c.Receive(ctx, 32)
		assert.NoError(t, err)
		got <- msgs
	}()
	// Sent once the receive is parked or about to be: either way it must come.
	_, err := b.Send(ctx, protocol.Message{Topic: "T", Body: []byte("late")}, 1)
	require.NoError(t, err)
	select {
	case msgs := <-got:
		require.Len(t, msgs, 1)
		assert.Equal(t, "late", string(msgs[0].Body))
	case <-time.After(30 * time.Second):
		t.Fatal("the parked receive did not get the message")
	}

	// A receive ends with its context: no error, no message.
	cctx, cancel := context.WithCancel(ctx)
	go func() { time.Sleep(100 * time.Millisecond); cancel() }()
	msgs, err := c.Receive(cctx, 32)
	require.NoError(t, err)
	assert.Empty(t, msgs)
}
