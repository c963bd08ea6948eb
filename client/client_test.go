package client_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/protocol"
)

// wait bounds every wait for something asynchronous: generous, for a loaded machine running
// the race detector; the waits end as soon as their condition holds.
const wait = 15 * time.Second

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func startBroker(t *testing.T) *broker.Broker {
	t.Helper()
	cfg := broker.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", NamesrvListen: "127.0.0.1:0", Logger: quiet()}
	cfg.Store.SegmentSize = 64 << 20
	b, err := broker.New(cfg)
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		require.NoError(t, b.Shutdown(ctx))
	})
	return b
}

func TestNewNeedsNameServers(t *testing.T) {
	for name, opts := range map[string][]client.Option{
		"none":  nil,
		"empty": {client.WithNameServers(), client.WithLogger(quiet())},
		"blank": {client.WithNameServers(" ; ")},
	} {
		_, err := client.New(opts...)
		require.ErrorIs(t, err, client.ErrInvalidOption, name)
		assert.ErrorContains(t, err, "WithNameServers is required", name)
	}
}

func TestDurationsMustBePositive(t *testing.T) {
	for name, opt := range map[string]func(time.Duration) client.Option{
		"heartbeat interval":     client.WithHeartbeatInterval,
		"route refresh interval": client.WithRouteRefreshInterval,
		"request timeout":        client.WithRequestTimeout,
		"dial timeout":           client.WithDialTimeout,
	} {
		for _, d := range []time.Duration{0, -time.Second} {
			_, err := client.New(client.WithNameServers("127.0.0.1:1"), opt(d))
			require.ErrorIs(t, err, client.ErrInvalidOption, name)
			assert.ErrorContains(t, err, name+" must be positive", name)
		}
		cl, err := client.New(client.WithNameServers("127.0.0.1:1"), opt(time.Second))
		require.NoError(t, err, name)
		require.NoError(t, cl.Close(context.Background()))
	}
}

// The defaults are documented with their values; keep the two in step.
func TestDocumentedDefaults(t *testing.T) {
	assert.Equal(t, 10*time.Second, client.DefaultHeartbeatInterval)
	assert.Equal(t, 30*time.Second, client.DefaultRouteRefreshInterval)
	assert.Equal(t, 3*time.Second, client.DefaultRequestTimeout)
	assert.Equal(t, 3*time.Second, client.DefaultDialTimeout)
}

func TestIDIsIPAndInstance(t *testing.T) {
	cl, err := client.New(client.WithNameServers("127.0.0.1:1"), client.WithClientIP("10.1.2.3"), client.WithInstanceName("billing"))
	require.NoError(t, err)
	defer cl.Close(context.Background())
	assert.Equal(t, "10.1.2.3@billing", cl.ID())
	other, err := client.New(client.WithNameServers("127.0.0.1:1"))
	require.NoError(t, err)
	defer other.Close(context.Background())
	mine, err := client.New(client.WithNameServers("127.0.0.1:1"))
	require.NoError(t, err)
	defer mine.Close(context.Background())
	assert.NotEqual(t, other.ID(), mine.ID(), "default instance names are unique per client")
}

// A producer and a consumer handed one Client are one client of the broker: one id, which
// names the consumer's membership. Closing them leaves the Client to its creator, open.
func TestProducerAndConsumerShareAClient(t *testing.T) {
	b := startBroker(t)
	require.NoError(t, b.CreateTopic(broker.TopicConfig{Name: "shared", ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermRead | protocol.PermWrite}))
	cl, err := client.New(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet()), client.WithInstanceName("shared-client"))
	require.NoError(t, err)
	defer cl.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	p, err := producer.New("shared-producers", producer.WithClient(cl))
	require.NoError(t, err)
	require.NoError(t, p.Start(ctx))
	c, err := consumer.NewLitePull("shared-consumers", consumer.WithClient(cl), consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
	require.NoError(t, err)
	require.NoError(t, c.Subscribe("shared", "*"))
	require.NoError(t, c.Start(ctx))
	assert.Equal(t, cl.ID(), p.ClientID())
	assert.Equal(t, cl.ID(), c.ClientID())
	assert.Equal(t, []string{cl.ID()}, b.GroupMembers("shared-consumers"))

	_, err = p.Send(ctx, &producer.Message{Topic: "shared", Body: []byte("one")})
	require.NoError(t, err)
	var got []*consumer.Message
	for len(got) == 0 && ctx.Err() == nil {
		msgs, err := c.Poll(ctx)
		require.NoError(t, err)
		got = append(got, msgs...)
	}
	require.Len(t, got, 1)
	assert.Equal(t, "one", string(got[0].Body))

	require.NoError(t, p.Close(ctx))
	require.NoError(t, c.Close(ctx))
	assert.Empty(t, b.GroupMembers("shared-consumers"), "the consumer left its group")
	// The Client is still open: a new producer on it sends.
	p2, err := producer.New("shared-producers", producer.WithClient(cl))
	require.NoError(t, err)
	require.NoError(t, p2.Start(ctx))
	_, err = p2.Send(ctx, &producer.Message{Topic: "shared", Body: []byte("two")})
	require.NoError(t, err)
	require.NoError(t, p2.Close(ctx))

	require.NoError(t, cl.Close(ctx))
	p3, err := producer.New("shared-producers", producer.WithClient(cl))
	require.NoError(t, err)
	assert.Error(t, p3.Start(ctx), "a closed Client serves no producer")
}

// A producer and a consumer need exactly one way to their client, and say what is wrong.
func TestProducerAndConsumerNeedOneClient(t *testing.T) {
	cl, err := client.New(client.WithNameServers("127.0.0.1:1"))
	require.NoError(t, err)
	defer cl.Close(context.Background())
	own := []client.Option{client.WithNameServers("127.0.0.1:1"), client.WithLogger(quiet())}
	for _, tc := range []struct {
		name, want string // want: "" for success
		p          []producer.Option
		c          []consumer.Option
	}{
		{"neither", "WithClient (with a non-nil client) or WithClientOptions", nil, nil},
		{"nil client", "non-nil client",
			[]producer.Option{producer.WithClient(nil)}, []consumer.Option{consumer.WithClient(nil)}},
		{"both", "exclude each other",
			[]producer.Option{producer.WithClient(cl), producer.WithClientOptions(own...)},
			[]consumer.Option{consumer.WithClient(cl), consumer.WithClientOptions(own...)}},
		{"no name servers", "WithNameServers is required",
			[]producer.Option{producer.WithClientOptions(client.WithLogger(quiet()))},
			[]consumer.Option{consumer.WithClientOptions(client.WithLogger(quiet()))}},
		{"bad client option", "heartbeat interval must be positive",
			[]producer.Option{producer.WithClientOptions(own...), producer.WithClientOptions(client.WithHeartbeatInterval(0))},
			[]consumer.Option{consumer.WithClientOptions(own...), consumer.WithClientOptions(client.WithHeartbeatInterval(0))}},
		{"shared", "", []producer.Option{producer.WithClient(cl)}, []consumer.Option{consumer.WithClient(cl)}},
		{"own", "", []producer.Option{producer.WithClientOptions(own...)}, []consumer.Option{consumer.WithClientOptions(own...)}},
	} {
		p, perr := producer.New("needs-one", tc.p...)
		c, cerr := consumer.NewLitePull("needs-one", tc.c...)
		if tc.want == "" {
			require.NoError(t, perr, tc.name)
			require.NoError(t, cerr, tc.name)
			require.NoError(t, p.Close(context.Background()))
			require.NoError(t, c.Close(context.Background()))
			continue
		}
		require.ErrorIs(t, perr, producer.ErrInvalidOption, tc.name)
		require.ErrorIs(t, cerr, consumer.ErrInvalidOption, tc.name)
		assert.ErrorContains(t, perr, tc.want, tc.name)
		assert.ErrorContains(t, cerr, tc.want, tc.name)
	}
	// A client option's error is the client's too.
	_, err = producer.New("needs-one", producer.WithClientOptions(client.WithLogger(quiet())))
	require.ErrorIs(t, err, client.ErrInvalidOption)
	_, err = consumer.NewLitePull("needs-one", consumer.WithClientOptions(client.WithLogger(quiet())))
	require.ErrorIs(t, err, client.ErrInvalidOption)
}
