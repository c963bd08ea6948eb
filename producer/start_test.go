package producer_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/producer"
)

func TestStartHonoursItsContext(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "start-ctx", 1)
	p, err := producer.New("start-ctx", producer.WithClientOptions(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet())))
	require.NoError(t, err)
	t.Cleanup(func() { p.Close(context.Background()) })

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, p.Start(ctx), context.Canceled)
	_, err = p.Send(context.Background(), &producer.Message{Topic: "start-ctx", Body: []byte("x")})
	require.ErrorIs(t, err, producer.ErrNotStarted, "a failed Start starts nothing")

	require.NoError(t, p.Start(context.Background()), "a failed Start can be retried")
	_, err = p.Send(context.Background(), &producer.Message{Topic: "start-ctx", Body: []byte("x")})
	require.NoError(t, err)
}
