package control_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/control"
)

// withTopics writes a topic table of n topics (t-00000 …) into a fresh data directory, as a
// broker that has served them for long would have it, and starts the broker on it.
func withTopics(t *testing.T, n int) func(*broker.Config) {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "config"), 0o755))
	table := map[string]broker.TopicConfig{}
	for i := range n {
		name := fmt.Sprintf("t-%05d", i)
		table[name] = broker.TopicConfig{Name: name, ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}
	}
	raw, err := json.Marshal(map[string]any{"topicConfigTable": table})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config", "topics.json"), raw, 0o644))
	return func(c *broker.Config) { c.DataDir = dir }
}

func TestTopicListPagesTenThousandTopics(t *testing.T) {
	b := startBroker(t, withTopics(t, 10_000))
	ns := startNATS(t)
	svc, err := control.StartService(context.Background(), connect(t, ns), b, control.ServiceConfig{Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, svc.Stop()) })
	e := &env{t: t, b: b, ns: ns, svc: svc, cl: connect(t, ns)}
	require.GreaterOrEqual(t, len(b.Topics()), 10_000)

	var p control.TopicListReply
	e.ok("topic.list", `{"prefix":"t-","limit":100}`, &p)
	require.Len(t, p.Topics, 100)
	assert.Equal(t, 10_000, *p.Total, "the prefix keeps the 10 000, not the broker's own")
	assert.Equal(t, 0, *p.Offset)
	assert.Equal(t, "t-00000", p.Topics[0].Topic)
	assert.Equal(t, "t-00099", p.Topics[99].Topic)
	assert.Len(t, p.Stats, 100, "the page's stats, not every topic's")
	assert.Contains(t, p.Stats, "t-00050")

	// Every page in turn: each topic once, in name order.
	seen := 0
	for off := 0; off < 10_000; off += 1000 {
		var pg control.TopicListReply
		e.ok("topic.list", fmt.Sprintf(`{"prefix":"t-","offset":%d,"limit":1000}`, off), &pg)
		require.Len(t, pg.Topics, 1000)
		assert.Equal(t, fmt.Sprintf("t-%05d", off), pg.Topics[0].Topic)
		seen += len(pg.Topics)
	}
	assert.Equal(t, 10_000, seen)

	e.ok("topic.list", `{"prefix":"t-","offset":9990,"limit":100}`, &p)
	assert.Len(t, p.Topics, 10, "the last page is short")
	e.ok("topic.list", `{"prefix":"t-","offset":20000,"limit":100}`, &p)
	assert.Empty(t, p.Topics)
	assert.Equal(t, 10_000, *p.Total)
	e.ok("topic.list", `{"contains":"-0999","limit":100}`, &p)
	assert.Equal(t, 10, *p.Total, "t-09990 … t-09999")

	// Without paging fields the reply is the whole list, without total or stats.
	raw := e.request("topic.list", ``)
	var whole map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(raw.Data, &whole))
	assert.NotContains(t, whole, "total")
	assert.NotContains(t, whole, "stats")
	var all control.TopicListReply
	require.NoError(t, json.Unmarshal(raw.Data, &all))
	assert.GreaterOrEqual(t, len(all.Topics), 10_000)

	assert.Contains(t, e.fail("topic.list", `{"limit":0}`, control.CodeBadRequest), `field "limit": must be within 1..1000`)
	assert.Contains(t, e.fail("topic.list", `{"limit":1001}`, control.CodeBadRequest), `field "limit": `)
	assert.Contains(t, e.fail("topic.list", `{"offset":-1}`, control.CodeBadRequest), `field "offset": `)
}
