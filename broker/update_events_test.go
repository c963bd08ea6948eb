package broker

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// collectEvents subscribes to b and returns a function that waits for the next event of one
// of the types, skipping others.
func collectEvents(t *testing.T, b *Broker) func(types ...EventType) Event {
	t.Helper()
	ch := make(chan Event, 256)
	t.Cleanup(b.Subscribe(func(e Event) { ch <- e }))
	return func(types ...EventType) Event {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case e := <-ch:
				for _, typ := range types {
					if e.Type == typ {
						return e
					}
				}
			case <-timeout:
				t.Fatalf("no event of %v", types)
			}
		}
	}
}

// A change of an existing topic is an event of its own, so that what keeps topics in step
// elsewhere (a cluster member) learns of it; a put that changes nothing is not.
func TestTopicUpdateIsAnEvent(t *testing.T) {
	b := newTestBroker(t, nil)
	next := collectEvents(t, b)
	perm := protocol.PermRead | protocol.PermWrite
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "t", ReadQueueNums: 2, WriteQueueNums: 2, Perm: perm}))
	assert.Equal(t, TopicCreated, next(TopicCreated, TopicUpdated).Type)

	require.NoError(t, b.UpdateTopic(TopicConfig{Name: "t", ReadQueueNums: 2, WriteQueueNums: 2, Perm: perm})) // unchanged
	_, err := b.PutTopic(TopicConfig{Name: "t", ReadQueueNums: 6, WriteQueueNums: 6, Perm: perm})
	require.NoError(t, err)
	e := next(TopicCreated, TopicUpdated)
	assert.Equal(t, TopicUpdated, e.Type, "the unchanged update emitted nothing; the put did")
	assert.Equal(t, "t", e.Topic)
	assert.Equal(t, 6, e.Queues)
	assert.Equal(t, "topic.updated", TopicUpdated.String())
}

// PutGroup and DeleteGroup are the administrative API of the subscription groups: a
// creation, a change and a deletion are each an event, a put that changes nothing is not.
func TestGroupPutAndDeleteAreEvents(t *testing.T) {
	b := newTestBroker(t, nil)
	next := collectEvents(t, b)
	groupEvents := []EventType{GroupCreated, GroupUpdated, GroupDeleted}
	g := GroupConfig{Name: "g", ConsumeEnable: true, RetryQueueNums: 1, RetryMaxTimes: 16}
	created, err := b.PutGroup(g)
	require.NoError(t, err)
	assert.True(t, created)
	assert.Equal(t, GroupCreated, next(groupEvents...).Type)

	created, err = b.PutGroup(g) // unchanged
	require.NoError(t, err)
	assert.False(t, created)
	g.RetryMaxTimes = 3
	_, err = b.PutGroup(g)
	require.NoError(t, err)
	e := next(groupEvents...)
	assert.Equal(t, GroupUpdated, e.Type, "the unchanged put emitted nothing")
	assert.Equal(t, "g", e.Group)
	got, ok := b.Group("g")
	require.True(t, ok)
	assert.Equal(t, g, got)

	require.NoError(t, b.DeleteGroup("g", false))
	assert.Equal(t, GroupDeleted, next(groupEvents...).Type)
	_, ok = b.Group("g")
	assert.False(t, ok)
	assert.True(t, errors.Is(b.DeleteGroup("g", false), ErrNotFound))
	assert.Equal(t, "group.updated", GroupUpdated.String())

	_, err = b.PutGroup(GroupConfig{Name: "bad group"})
	assert.ErrorContains(t, err, `"bad group"`)
	_, err = b.PutGroup(GroupConfig{Name: "neg", RetryMaxTimes: -1})
	assert.ErrorContains(t, err, "must not be negative")
	assert.True(t, errors.Is(b.DeleteGroup(scheduleGroup, false), ErrReserved))
}
