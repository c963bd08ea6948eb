package broker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Closing the bus (the broker shutting down) delivers what subscribers have queued: the last
// events of a stop, members leaving as their connections close, are not thrown away.
func TestEventBusCloseDeliversQueuedEvents(t *testing.T) {
	bus := newEventBus("c", "b", 16)
	gate := make(chan struct{})
	var got atomic.Int64
	bus.subscribe(func(Event) {
		<-gate
		got.Add(1)
	})
	for range 5 {
		bus.emit(Event{Type: MemberLeft})
	}
	go func() {
		// Open the gate only once close has taken the subscribers away.
		for {
			bus.mu.Lock()
			closed := bus.closed
			bus.mu.Unlock()
			if closed {
				close(gate)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bus.close(ctx)
	require.NoError(t, ctx.Err(), "close returned because every queued event was delivered")
	assert.Equal(t, int64(5), got.Load())
}

// A subscriber stuck in its callback cannot hold up the shutdown past its context.
func TestEventBusCloseGivesUpOnAStuckSubscriber(t *testing.T) {
	bus := newEventBus("c", "b", 16)
	stuck := make(chan struct{})
	defer close(stuck)
	bus.subscribe(func(Event) { <-stuck })
	bus.emit(Event{Type: MemberLeft})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	bus.close(ctx)
	assert.Error(t, ctx.Err())
}
