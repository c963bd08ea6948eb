package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/producer"
)

// The tests of a cluster's clients: flowd's producer and lite-pull consumers, and (in
// cluster_interop_test.go) rocketmq-client-go's.

// awaitJoined waits until every node's log shows every broker of names joined.
func awaitJoined(t *testing.T, nodes []*node, names ...string) {
	t.Helper()
	for _, n := range nodes {
		for _, name := range names {
			want := "type=cluster.broker_joined broker=" + name
			require.Eventually(t, func() bool { return strings.Contains(n.logs.String(), want) }, wait, tick, "%s sees %s join", n.broker, name)
		}
	}
}

// clientOpts are the client settings of the tests' flowd clients: the name service of
// namesrv, routes refreshed every second (a killed broker leaves them quickly), quiet.
func clientOpts(namesrv, instance string) []client.Option {
	return []client.Option{client.WithNameServers(namesrv), client.WithRouteRefreshInterval(time.Second), client.WithInstanceName(instance),
		client.WithLogger(slog.New(slog.DiscardHandler))}
}

// bodyCounts counts received bodies under a lock.
type bodyCounts struct {
	mu sync.Mutex
	n  map[string]int
	by map[string]map[string]int // receiver → body → count
}

func newBodyCounts() *bodyCounts {
	return &bodyCounts{n: map[string]int{}, by: map[string]map[string]int{}}
}

func (c *bodyCounts) add(receiver, body string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[body]++
	if c.by[receiver] == nil {
		c.by[receiver] = map[string]int{}
	}
	c.by[receiver][body]++
}

// has reports whether every body of want was received.
func (c *bodyCounts) has(want []string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range want {
		if c.n[b] == 0 {
			return false
		}
	}
	return true
}

// duplicates lists the bodies received more than once.
func (c *bodyCounts) duplicates() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for b, n := range c.n {
		if n > 1 {
			out = append(out, fmt.Sprintf("%s×%d", b, n))
		}
	}
	return out
}

// receivers lists who received at least one of prefix's bodies.
func (c *bodyCounts) receivers(prefix string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for r, bs := range c.by {
		for b := range bs {
			if strings.HasPrefix(b, prefix) {
				out = append(out, r)
				break
			}
		}
	}
	return out
}

// readAll reads topic from its first message on every queue the name service at namesrv
// routes, with a stateless reader, until every body of want was read, and returns what it
// read. It fails the test if want is not read within wait.
func readAll(t *testing.T, namesrv, topic string, want []string) *bodyCounts {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	r, err := consumer.NewReader(consumer.WithClientOptions(clientOpts(namesrv, "reader")...), consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	defer r.Close(context.Background())
	qs, err := r.FetchMessageQueues(ctx, topic)
	require.NoError(t, err)
	require.NoError(t, r.Assign(qs))
	got := newBodyCounts()
	for !got.has(want) {
		ms, err := r.Poll(ctx)
		if ctx.Err() != nil {
			break
		}
		require.NoError(t, err)
		for _, m := range ms {
			got.add("reader", string(m.Body))
		}
	}
	var missing []string
	for _, b := range want {
		if got.n[b] == 0 {
			missing = append(missing, b)
		}
	}
	require.Empty(t, missing, "messages of %q not read through %s", topic, namesrv)
	return got
}

// startPullers starts n members of a lite-pull group of topic on namesrv, each polling into
// got until its context ends or it is closed; stop closes member i and waits for its poller.
func startPullers(t *testing.T, namesrv, group, topic string, n int, got *bodyCounts) (stop func(i int)) {
	t.Helper()
	type member struct {
		c    *consumer.LitePull
		done chan struct{}
	}
	members := make([]member, n)
	for i := range n {
		name := fmt.Sprintf("puller-%d", i)
		c, err := consumer.NewLitePull(group, consumer.WithClientOptions(clientOpts(namesrv, name)...),
			consumer.WithConsumeFrom(consumer.ConsumeFromFirst), consumer.WithRebalanceInterval(time.Second),
			consumer.WithPollTimeout(200*time.Millisecond))
		require.NoError(t, err)
		require.NoError(t, c.Subscribe(topic, "*"))
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		require.NoError(t, c.Start(ctx))
		cancel()
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				ms, err := c.Poll(context.Background())
				if errors.Is(err, consumer.ErrNotRunning) || c.State() != consumer.Running {
					return
				}
				for _, m := range ms {
					got.add(name, string(m.Body))
				}
			}
		}()
		members[i] = member{c: c, done: done}
	}
	stopped := make([]bool, n)
	stop = func(i int) {
		if stopped[i] {
			return
		}
		stopped[i] = true
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		assert.NoError(t, members[i].c.Close(ctx))
		<-members[i].done
	}
	t.Cleanup(func() {
		for i := range members {
			stop(i)
		}
	})
	return stop
}

// sendAll sends each body to topic with p and returns the broker that stored each.
func sendAll(t *testing.T, p *producer.Producer, topic string, bodies []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, b := range bodies {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		res, err := p.Send(ctx, &producer.Message{Topic: topic, Body: []byte(b)})
		cancel()
		require.NoError(t, err, "send %s", b)
		out[b] = res.Queue.BrokerName
	}
	return out
}

func newProducer(t *testing.T, namesrv, instance string) *producer.Producer {
	t.Helper()
	p, err := producer.New("e2e-producers", producer.WithClientOptions(clientOpts(namesrv, instance)...), producer.WithRetries(2),
		producer.WithSendTimeout(3*time.Second))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, p.Start(ctx))
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

// Three nodes, flowd's clients: a lite-pull group of three members on one node's name
// service shares the queues of all three brokers, and receives every message a producer on
// another node sends exactly once, also across the hand-over when one member leaves; a
// restart of all three nodes keeps every topic and group on every node, and their messages.
func TestClusterLitePullGroupHandsOverWithoutDuplicates(t *testing.T) {
	all := []string{"broker-1", "broker-2", "broker-3"}
	nodes := startCluster(t, all...)
	a, b, c := nodes[0], nodes[1], nodes[2]
	awaitJoined(t, nodes, all...)

	const topic, group = "ledger", "pullers"
	a.ctl("topic", "create", topic, "--queues", "2")
	for _, n := range nodes {
		routed(t, n.namesrv, topic, wait, all...)
	}
	got := newBodyCounts()
	stop := startPullers(t, c.namesrv, group, topic, 3, got)
	p := newProducer(t, b.namesrv, "producer")

	first := bodies("first", 60)
	where := sendAll(t, p, topic, first)
	spread := map[string]int{}
	for _, br := range where {
		spread[br]++
	}
	assert.Equal(t, map[string]int{"broker-1": 20, "broker-2": 20, "broker-3": 20}, spread, "sends by broker")
	require.Eventually(t, func() bool { return got.has(first) }, wait, tick, "the group receives every message")
	assert.Len(t, got.receivers("first"), 3, "each member has queues")

	stop(0) // a member leaves: its queues pass to the other two
	second := bodies("second", 60)
	sendAll(t, p, topic, second)
	require.Eventually(t, func() bool { return got.has(second) }, wait, tick, "the two left receive every later message")
	assert.NotContains(t, got.receivers("second"), "puller-0")
	assert.Empty(t, got.duplicates(), "no message twice, hand-over included")
	for i := range 3 {
		stop(i)
	}

	// Every node stops, and all three start again on their data directories.
	for _, n := range nodes {
		n.terminate()
	}
	for _, n := range nodes {
		n.daemon = launch(t, n.broker+" restarted", n.dir, "", n.args...)
	}
	for _, n := range nodes {
		n.awaitServing()
	}
	awaitJoined(t, nodes, all...)
	for _, n := range nodes {
		var topics control.TopicListReply
		require.NoError(t, n.ctlJSON(&topics, "topic", "list"))
		var names []string
		for _, tv := range topics.Topics {
			names = append(names, tv.Topic)
		}
		assert.Contains(t, names, topic, "%s keeps the topic", n.broker)
		var groups control.GroupListReply
		require.NoError(t, n.ctlJSON(&groups, "group", "list"))
		var gs []string
		for _, g := range groups.Groups {
			gs = append(gs, g.Group)
		}
		assert.Contains(t, gs, group, "%s keeps the group", n.broker)
		routed(t, n.namesrv, topic, wait, all...)
	}
	readAll(t, a.namesrv, topic, append(first, second...))
}
