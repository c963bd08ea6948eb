package main

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Parts stop last built first, all with the one context close is given; a part that fails
// is logged and reported by name and the others still stop.
func TestClosersStopInReverseWithOneContext(t *testing.T) {
	var logs syncBuffer
	cl := &closers{log: slog.New(slog.NewTextHandler(&logs, nil))}
	type ctxKey struct{}
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), ctxKey{}, "shutdown"), time.Hour)
	defer cancel()
	want, _ := ctx.Deadline()
	var order []string
	boom := errors.New("boom")
	stop := func(name string, err error) func(context.Context) error {
		return func(c context.Context) error {
			order = append(order, name)
			got, ok := c.Deadline()
			assert.True(t, ok && got.Equal(want), "%s gets the shutdown deadline", name)
			assert.Equal(t, "shutdown", c.Value(ctxKey{}), name)
			return err
		}
	}
	cl.push("plugins", stop("plugins", nil))
	cl.push("broker", stop("broker", boom))
	cl.push("pipelines", stop("pipelines", nil))
	cl.stopAfter("broker", "publisher", stop("publisher", nil))

	err := cl.close(ctx)
	assert.Equal(t, []string{"pipelines", "broker", "publisher", "plugins"}, order)
	require.ErrorIs(t, err, boom)
	assert.EqualError(t, err, "stop broker: boom")
	assert.Contains(t, logs.String(), `msg="stop failed" part=broker err=boom`)

	order = nil
	require.NoError(t, cl.close(ctx))
	assert.Empty(t, order, "close empties the stack")
}

func TestClosersStopAfterAPartNotPushedIsAWiringMistake(t *testing.T) {
	cl := &closers{log: slog.New(slog.DiscardHandler)}
	cl.push("plugins", noErr(func() {}))
	assert.PanicsWithValue(t, `closers: "publisher" stops after "broker", which was not pushed`, func() {
		cl.stopAfter("broker", "publisher", noCtx(func() error { return nil }))
	})
}
