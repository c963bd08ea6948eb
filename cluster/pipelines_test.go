package cluster_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/cluster"
	"github.com/flowd-io/flowd/fields"
	"github.com/flowd-io/flowd/pipeline/definition"
)

// defsSeen records every set of definitions a store reports, the last one readable.
type defsSeen struct {
	mu   sync.Mutex
	last map[string]definition.Definition
	n    int
}

func (d *defsSeen) set(defs []definition.Definition) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.last = map[string]definition.Definition{}
	for _, def := range defs {
		d.last[def.Name] = def
	}
	d.n++
}

func (d *defsSeen) names() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for n := range d.last {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func (d *defsSeen) get(name string) (definition.Definition, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	def, ok := d.last[name]
	return def, ok
}

func openStore(t *testing.T, nc *nats.Conn, node string) (*cluster.PipelineStore, *defsSeen) {
	t.Helper()
	seen := &defsSeen{}
	s, err := cluster.OpenPipelines(context.Background(), cluster.PipelineOptions{
		Conn: nc, Node: node, Logger: quiet, RetryInterval: 100 * time.Millisecond, OnChange: seen.set,
	})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s, seen
}

func readyStore(t *testing.T, s *cluster.PipelineStore) {
	t.Helper()
	require.Eventually(t, s.Ready, wait, 10*time.Millisecond, "the pipelines bucket is bound")
}

func def(name, topic string) definition.Definition {
	return definition.Definition{Name: name, Topics: []string{topic}, Sink: definition.SinkDefinition{Type: definition.SinkStdout}}
}

// A definition created through one member reaches the other's watched copy; a deletion on
// the second removes it from both; a second creation of one name is refused, the first kept.
func TestPipelineDefinitionsAreSharedThroughTheBucket(t *testing.T) {
	s := startNATS(t, false)
	one, seen1 := openStore(t, connect(t, s), "broker-1")
	two, seen2 := openStore(t, connect(t, s), "broker-2")
	readyStore(t, one)
	readyStore(t, two)
	ctx := context.Background()

	require.NoError(t, one.Create(ctx, def("p1", "orders")))
	require.Eventually(t, func() bool { return slices.Equal(seen2.names(), []string{"p1"}) }, wait, 10*time.Millisecond, "member 2 sees p1")
	got, _ := seen2.get("p1")
	assert.Equal(t, def("p1", "orders"), got, "the definition as created")
	// The creator's copy comes through its own watch, which may trail member 2's.
	require.Eventually(t, func() bool { return slices.Equal(seen1.names(), []string{"p1"}) }, wait, 10*time.Millisecond, "the creator's copy")
	rec, ok := two.Get("p1")
	require.True(t, ok)
	assert.Equal(t, "broker-1", rec.Creator)
	assert.False(t, rec.Created.IsZero())

	err := two.Create(ctx, def("p1", "payments"))
	require.ErrorIs(t, err, cluster.ErrPipelineExists)
	assert.Contains(t, err.Error(), `"p1"`)
	time.Sleep(100 * time.Millisecond)
	got, _ = seen1.get("p1")
	assert.Equal(t, []string{"orders"}, got.Topics, "the first creation holds")

	require.NoError(t, two.Delete(ctx, "p1"))
	for _, seen := range []*defsSeen{seen1, seen2} {
		require.Eventually(t, func() bool { return len(seen.names()) == 0 }, wait, 10*time.Millisecond, "deleted everywhere")
	}
	require.ErrorIs(t, one.Delete(ctx, "p1"), cluster.ErrPipelineNotFound)
	require.ErrorIs(t, one.Delete(ctx, "never"), cluster.ErrPipelineNotFound)

	// Created again after the deletion: a new definition, not the old one.
	require.NoError(t, two.Create(ctx, def("p1", "payments")))
	require.Eventually(t, func() bool { d, ok := seen1.get("p1"); return ok && d.Topics[0] == "payments" }, wait, 10*time.Millisecond)
}

// A bad definition is refused at Create with the field at fault, and nothing is stored.
func TestPipelineDefinitionRefusedWithItsField(t *testing.T) {
	s := startNATS(t, false)
	one, _ := openStore(t, connect(t, s), "broker-1")
	readyStore(t, one)
	bad := def("p2", "orders")
	bad.Sink = definition.SinkDefinition{Type: definition.SinkTopic}
	err := one.Create(context.Background(), bad)
	require.ErrorIs(t, err, definition.ErrInvalidDefinition)
	var fe *fields.Error
	require.True(t, errors.As(err, &fe), "a field error: %v", err)
	assert.Equal(t, "sink.topic", fe.Field)
	assert.Empty(t, one.Definitions())

	// A member opened later finds nothing either.
	_, seen := openStore(t, connect(t, s), "broker-2")
	time.Sleep(200 * time.Millisecond)
	assert.Empty(t, seen.names())
}

// The definitions outlive every member: a store opened after all closed loads them, and
// reports them once loaded even when there are none.
func TestPipelineDefinitionsOutliveTheMembers(t *testing.T) {
	s := startNATS(t, false)
	one, _ := openStore(t, connect(t, s), "broker-1")
	readyStore(t, one)
	require.NoError(t, one.Create(context.Background(), def("a", "t1")))
	require.NoError(t, one.Create(context.Background(), def("b", "t2")))
	one.Close()

	_, seen := openStore(t, connect(t, s), "broker-1")
	require.Eventually(t, func() bool { return slices.Equal(seen.names(), []string{"a", "b"}) }, wait, 10*time.Millisecond)
}

// Before the bucket can be reached, Create and Delete fail saying so, and the store keeps
// trying: once JetStream answers, it loads the bucket.
func TestPipelineStoreRetriesUntilJetStreamAnswers(t *testing.T) {
	s := startNATS(t, true)
	one, seen := openStore(t, connect(t, s), "broker-1")
	err := one.Create(context.Background(), def("a", "t1"))
	require.ErrorIs(t, err, cluster.ErrPipelinesNotReady)
	require.ErrorIs(t, one.Delete(context.Background(), "a"), cluster.ErrPipelinesNotReady)
	assert.False(t, one.Ready())
	seen.mu.Lock()
	assert.Zero(t, seen.n, "nothing reported before the bucket is loaded")
	seen.mu.Unlock()

	require.NoError(t, s.EnableJetStream(&natsserver.JetStreamConfig{StoreDir: t.TempDir()}))
	readyStore(t, one)
	require.Eventually(t, func() bool { seen.mu.Lock(); defer seen.mu.Unlock(); return seen.n > 0 }, wait, 10*time.Millisecond, "the empty bucket is reported once loaded")
	require.NoError(t, one.Create(context.Background(), def("a", "t1")))
	require.Eventually(t, func() bool { return slices.Equal(seen.names(), []string{"a"}) }, wait, 10*time.Millisecond)
}
