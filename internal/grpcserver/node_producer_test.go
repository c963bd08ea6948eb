package grpcserver_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestNodeProducerFIFOKeepsAGroupInOneQueueInOrder(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "node-fifo", 4)
	var msgs []map[string]any
	for i := range 12 {
		msgs = append(msgs, map[string]any{"body": strconv.Itoa(i), "messageGroup": "g" + strconv.Itoa(i%2)})
	}
	runNode(t, e, map[string]any{"mode": "produce", "topic": "node-fifo", "messages": msgs}).all(t)
	queue := map[string]int32{}
	last := map[string]int{}
	got := e.stored(t, "node-fifo", 12)
	for _, m := range got {
		g := m.Properties["__SHARDINGKEY"]
		require.NotEmpty(t, g)
		if q, seen := queue[g]; seen {
			require.Equal(t, q, m.QueueID, "group %s in one queue", g)
		}
		queue[g] = m.QueueID
		n, _ := strconv.Atoi(string(m.Body))
		if l, seen := last[g]; seen {
			require.Greater(t, n, l, "group %s in send order", g)
		}
		last[g] = n
	}
}

func TestNodeProducerDelayedMessageWaitsForItsTime(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "node-delay", 1)
	sent := time.Now()
	runNode(t, e, map[string]any{"mode": "produce", "topic": "node-delay", "messages": []map[string]any{{"body": "later", "delay": 1500}}}).all(t)
	got := e.stored(t, "node-delay", 1)
	require.Equal(t, "later", string(got[0].Body))
	require.GreaterOrEqual(t, time.Since(sent), 1500*time.Millisecond, "not delivered before its time")
}

func TestNodeTransactionalProducerCommitsAndRollsBack(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "node-tx", 1)
	runNode(t, e, map[string]any{"mode": "produce", "topic": "node-tx", "transaction": "commit", "messages": []map[string]any{{"body": "committed"}}}).all(t)
	runNode(t, e, map[string]any{"mode": "produce", "topic": "node-tx", "transaction": "rollback", "messages": []map[string]any{{"body": "rolled back"}}}).all(t)
	got := e.stored(t, "node-tx", 1)
	require.Equal(t, "committed", string(got[0].Body))
	require.Equal(t, 0, e.b.PendingTransactions())
}

// A half message the producer leaves open is checked back over its Telemetry session; the
// client's checker commits it with EndTransaction (source SOURCE_SERVER_CHECK).
func TestNodeTransactionalProducerIsCheckedBack(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "node-check", 1)
	lines := runNode(t, e, map[string]any{"mode": "produce", "topic": "node-check", "transaction": "check", "messages": []map[string]any{{"body": "orphan"}}}).all(t)
	var sent, checked string
	for _, l := range lines {
		if l.MessageID != "" {
			sent = l.MessageID
		}
		if l.Checked != "" {
			checked = l.Checked
			require.Equal(t, "orphan", l.Body)
		}
	}
	require.NotEmpty(t, sent)
	require.Equal(t, sent, checked, "the checker saw the half message")
	got := e.stored(t, "node-check", 1)
	require.Equal(t, "orphan", string(got[0].Body))
	require.Equal(t, 0, e.b.PendingTransactions())
}
