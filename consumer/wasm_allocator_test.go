package consumer_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/consumer/allocate"
	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/runtime"
)

// wasmSticky builds examples/wasm/go-sticky and returns it behind allocate.Strategy, as an
// application would: plugins.AllocatorStrategy, identified by name, version and digest.
func wasmSticky(t *testing.T) (allocate.Strategy, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds a Wasm guest")
	}
	out := filepath.Join(t.TempDir(), "sticky.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, "../examples/wasm/go-sticky")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	o, err := cmd.CombinedOutput()
	require.NoError(t, err, "build go-sticky: %s", o)
	wasm, err := os.ReadFile(out)
	require.NoError(t, err)
	digest := sha256.Sum256(wasm)
	m := &plugins.Manifest{
		Name: "sticky", Kind: plugins.KindAllocator, Version: "1.0.0", ABI: plugins.ABIVersion,
		Limits: plugins.Limits{MemoryPages: 512, MaxInstances: 2},
		SHA256: hex.EncodeToString(digest[:]),
	}
	require.NoError(t, m.Validate())
	rt, err := runtime.New(context.Background(), runtime.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	mod, err := rt.Load(context.Background(), m.Spec(wasm))
	require.NoError(t, err)
	slot := &runtime.Slot{}
	require.NoError(t, slot.Swap(context.Background(), mod))
	t.Cleanup(func() { _ = slot.Close(context.Background()) })
	s := &plugins.AllocatorStrategy{Allocator: plugins.NewAllocator(slot)}
	identity := allocate.Identity(s)
	require.Equal(t, "WASM-sticky@1.0.0#"+m.SHA256, identity, "the strategy names its build")
	return s, identity
}

// TestWasmAllocatorSharedByTheGroup: three members allocate with the go-sticky Wasm example
// and read every queue exactly once; a member running the built-in averagely joins, and all
// four fall back to averagely; when it leaves, the three return to the Wasm allocator.
func TestWasmAllocatorSharedByTheGroup(t *testing.T) {
	strategy, identity := wasmSticky(t)
	b := startBroker(t, nil)
	topic := uniqueName(t)
	queues := createTopic(t, b, topic, 8)
	group := topic + "-group"
	var cs []*consumer.LitePull
	for range 3 {
		c := newConsumer(t, b, group, consumer.WithAllocateStrategy(strategy), consumer.WithRebalanceInterval(time.Hour))
		require.NoError(t, c.Subscribe(topic, "*"))
		require.NoError(t, c.Start(context.Background()))
		cs = append(cs, c)
	}
	exactlyOnce := func(members ...*consumer.LitePull) bool {
		seen := map[consumer.MessageQueue]int{}
		for _, c := range members {
			if len(c.OwnedQueues()) != len(c.ActiveQueues()) {
				return false
			}
			for _, mq := range c.ActiveQueues() {
				seen[mq]++
			}
		}
		for _, mq := range queues {
			if seen[mq] != 1 {
				return false
			}
		}
		return len(seen) == len(queues)
	}
	inUse := func(c *consumer.LitePull) string { return c.Hooks().RunningInfo().Properties["allocatorInUse"] }
	require.Eventually(t, func() bool {
		return exactlyOnce(cs...) && inUse(cs[0]) == identity && inUse(cs[1]) == identity && inUse(cs[2]) == identity
	}, wait, 5*time.Millisecond, "the group reads every queue once with the Wasm allocator")
	props := cs[0].Hooks().RunningInfo().Properties
	assert.Equal(t, identity, props["allocator"])
	assert.Contains(t, props["allocator"], "WASM-sticky@1.0.0#")

	odd := newConsumer(t, b, group, consumer.WithRebalanceInterval(time.Hour)) // built-in averagely
	require.NoError(t, odd.Subscribe(topic, "*"))
	require.NoError(t, odd.Start(context.Background()))
	all := append([]*consumer.LitePull{odd}, cs...)
	fallback := groupShares(t, allocate.Averagely(), queues, all...)
	require.Eventually(t, func() bool { return owns(fallback, all...) }, wait, 5*time.Millisecond,
		"all four allocate averagely while one member does not run the Wasm allocator")

	require.NoError(t, odd.Close(context.Background()))
	require.Eventually(t, func() bool {
		return exactlyOnce(cs...) && inUse(cs[0]) == identity && inUse(cs[1]) == identity && inUse(cs[2]) == identity
	}, wait, 5*time.Millisecond, "back to the Wasm allocator")
}
