package allocate_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/consumer/allocate"
	"github.com/flowd-io/flowd/protocol"
)

// wholeGroup computes everything in one call and counts them.
type wholeGroup struct {
	allocate.Strategy
	calls int
}

func (w *wholeGroup) AllocateGroup(ctx context.Context, req allocate.Request) (map[string][]protocol.MessageQueue, error) {
	w.calls++
	out := map[string][]protocol.MessageQueue{}
	for _, id := range req.ClientIDs {
		req.ClientID = id
		share, err := w.Allocate(ctx, req)
		if err != nil {
			return nil, err
		}
		out[id] = share
	}
	return out, nil
}

func TestGroupCallsAGroupStrategyOnce(t *testing.T) {
	qs := []protocol.MessageQueue{{Topic: "t", BrokerName: "b", QueueID: 0}, {Topic: "t", BrokerName: "b", QueueID: 1}, {Topic: "t", BrokerName: "b", QueueID: 2}}
	req := allocate.Request{Group: "g", Queues: qs, ClientIDs: []string{"a", "b"}}
	w := &wholeGroup{Strategy: allocate.Averagely()}
	got, err := allocate.Group(context.Background(), allocate.WithIdentity(w, func() string { return "AVG+test" }), req)
	require.NoError(t, err)
	assert.Equal(t, 1, w.calls, "one call for the whole group, through WithIdentity too")
	want, err := allocate.Group(context.Background(), allocate.Averagely(), req)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	assert.Equal(t, map[string][]protocol.MessageQueue{"a": qs[:2], "b": qs[2:]}, want)
}

func TestIdentity(t *testing.T) {
	assert.Equal(t, allocate.NameAveragely, allocate.Identity(allocate.Averagely()))
	id := "WASM-sticky@1.0.0+sha256:00"
	s := allocate.WithIdentity(allocate.Sticky(allocate.Averagely()), func() string { return id })
	assert.Equal(t, id, allocate.Identity(s))
	assert.Equal(t, "STICKY-AVG", s.Name(), "the name stays the strategy's")
	id = "WASM-sticky@1.0.1+sha256:01"
	assert.Equal(t, id, allocate.Identity(s), "asked each time")
}
