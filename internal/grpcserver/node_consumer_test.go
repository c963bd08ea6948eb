package grpcserver_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
)

func TestNodeSimpleConsumerReceivesAndAcks(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "node-simple", 4)
	sendN(t, e, "node-simple", 20, func(i int) string { return []string{"a", "b"}[i%2] })
	got := messages(runNode(t, e, map[string]any{"mode": "simple", "topic": "node-simple", "group": "node-g", "count": 20}).all(t))
	require.Len(t, got, 20, "every queue's messages, though the client receives from queue 0 only")
	seen := map[string]bool{}
	for _, m := range got {
		require.False(t, m.Corrupted, "the body digest matches")
		require.True(t, m.Acked)
		require.Equal(t, 1, m.Attempt)
		seen[m.ID] = true
	}
	require.Len(t, seen, 20)
	// All acknowledged: a second consumer of the group gets nothing.
	again := messages(runNode(t, e, map[string]any{"mode": "simple", "topic": "node-simple", "group": "node-g", "count": 1, "timeoutMs": 3000}).all(t))
	require.Empty(t, again)
}

func TestNodeSimpleConsumerFiltersByTag(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "node-tags", 2)
	sendN(t, e, "node-tags", 10, func(i int) string { return []string{"a", "b"}[i%2] })
	got := messages(runNode(t, e, map[string]any{"mode": "simple", "topic": "node-tags", "group": "node-tag-g", "filter": "b", "count": 5}).all(t))
	require.Len(t, got, 5)
	for _, m := range got {
		require.Equal(t, "b", m.Tag)
	}
}

func TestNodeSimpleConsumerUnackedMessageComesBack(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "node-redeliver", 1)
	sendN(t, e, "node-redeliver", 1, nil)
	first := messages(runNode(t, e, map[string]any{"mode": "simple", "topic": "node-redeliver", "group": "node-r", "count": 1, "ack": "none", "invisibleMs": 1000}).all(t))
	require.Len(t, first, 1)
	again := messages(runNode(t, e, map[string]any{"mode": "simple", "topic": "node-redeliver", "group": "node-r", "count": 1}).all(t))
	require.Len(t, again, 1)
	require.Equal(t, first[0].ID, again[0].ID)
	require.Equal(t, 2, again[0].Attempt)
}

func TestNodeSimpleConsumerChangesInvisibleDuration(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "node-change", 1)
	sendN(t, e, "node-change", 1, nil)
	// Received invisible for 60 s, then changed to 1 s: back within seconds, not a minute.
	first := messages(runNode(t, e, map[string]any{"mode": "simple", "topic": "node-change", "group": "node-c", "count": 1, "ack": "change", "invisibleMs": 60000, "changeMs": 1000}).all(t))
	require.Len(t, first, 1)
	t0 := time.Now()
	again := messages(runNode(t, e, map[string]any{"mode": "simple", "topic": "node-change", "group": "node-c", "count": 1, "timeoutMs": 15000}).all(t))
	require.Len(t, again, 1)
	require.Equal(t, first[0].ID, again[0].ID)
	require.Less(t, time.Since(t0), 30*time.Second)
}

func TestNodeSimpleConsumerFIFOOrderPerGroup(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "node-fifo-c", 2)
	_, err := e.b.PutGroup(broker.GroupConfig{Name: "node-fifo-g", ConsumeEnable: true, ConsumeOrderly: true, RetryMaxTimes: 16})
	require.NoError(t, err)
	var msgs []map[string]any
	for i := range 10 {
		msgs = append(msgs, map[string]any{"body": strconv.Itoa(i), "messageGroup": "mg" + strconv.Itoa(i%2)})
	}
	runNode(t, e, map[string]any{"mode": "produce", "topic": "node-fifo-c", "messages": msgs}).all(t)
	got := messages(runNode(t, e, map[string]any{"mode": "simple", "topic": "node-fifo-c", "group": "node-fifo-g", "count": 10, "batch": 4}).all(t))
	require.Len(t, got, 10)
	last := map[string]int{}
	for _, m := range got {
		n, _ := strconv.Atoi(m.Body)
		if l, seen := last[m.MessageGroup]; seen {
			require.Greater(t, n, l, "message group %s in order", m.MessageGroup)
		}
		last[m.MessageGroup] = n
	}
}

func TestNodePushConsumerConsumes(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "node-push", 4)
	sendN(t, e, "node-push", 20, nil)
	got := messages(runNode(t, e, map[string]any{"mode": "push", "topic": "node-push", "group": "node-push-g", "count": 20}).all(t))
	ids := map[string]bool{}
	for _, m := range got {
		ids[m.ID] = true
	}
	require.Len(t, ids, 20)
}
