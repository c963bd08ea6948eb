package grpcserver_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
)

func TestInteropGRPCProducerToLitePullConsumer(t *testing.T) {
	e := start(t, withNamesrv)
	e.topic(t, "interop-5tolite", 2)
	sent := sendTagged(t, e, "interop-5tolite", 10)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := client.New(client.WithNameServers(e.b.NamesrvAddr()), client.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	require.NoError(t, err)
	defer cl.Close(context.Background())
	c, err := consumer.NewLitePull("lite", consumer.WithClient(cl), consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
	require.NoError(t, err)
	require.NoError(t, c.Subscribe("interop-5tolite", "tag1"))
	require.NoError(t, c.Start(ctx))
	defer c.Close(context.Background())
	got := map[string]*consumer.Message{}
	for len(got) < 5 && ctx.Err() == nil {
		msgs, err := c.Poll(ctx)
		require.NoError(t, err)
		for _, m := range msgs {
			got[m.MsgID] = m
		}
	}
	require.Len(t, got, 5, "the tag filter selects the tag1 half")
	for id, m := range got {
		s := sent[id]
		require.NotNil(t, s)
		require.Equal(t, "tag1", m.Tags)
		require.Equal(t, s.SystemProperties.Keys, m.Keys)
		require.Equal(t, s.UserProperties["n"], m.Property("n"))
		require.Equal(t, string(s.Body), string(m.Body))
	}
}
