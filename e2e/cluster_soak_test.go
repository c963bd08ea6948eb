package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/producer"
)

// soakRounds is how many kill -9 and restart rounds TestClusterSoakKillRestart runs:
// FLOWD_SOAK=1 turns it on (5 rounds), FLOWD_SOAK=N runs N; unset, the test is skipped (the
// one-round version runs in TestClusterLitePullGroupConsumesAcrossKill9, one kill without a
// group in TestRocketMQInteropThreeNodeCluster and TestThreeNodesServeOneCluster).
func soakRounds(t *testing.T) int {
	v := os.Getenv("FLOWD_SOAK")
	if v == "" {
		t.Skip("a soak of minutes: set FLOWD_SOAK=1 (or the number of rounds) to run it")
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, "FLOWD_SOAK")
	if n == 1 {
		n = 5
	}
	return n
}

// A three-node cluster under a steady producer and a consuming lite-pull group of two
// members, with a random node killed with SIGKILL and restarted on its data directory, round
// after round: every route drops the killed node and lists it again once it is back, and at
// the end every acknowledged send is read back from the cluster, and the group has received
// each at least once (after a crash it may receive some twice: at-least-once).
func TestClusterSoakKillRestart(t *testing.T) {
	soakKillRestart(t, soakRounds(t))
}

// The soak's one-round version, for every run: one node killed with SIGKILL and restarted
// while the group consumes, and the group still receives every acknowledged send.
func TestClusterLitePullGroupConsumesAcrossKill9(t *testing.T) {
	soakKillRestart(t, 1)
}

func soakKillRestart(t *testing.T, rounds int) {
	all := []string{"broker-1", "broker-2", "broker-3"}
	nodes := startCluster(t, all...)
	// A node comes back on the addresses it had, as a deployed one does: the clients know
	// the name services by address, and a client whose name services all moved elsewhere
	// keeps its last routes, pointing at brokers that are gone, for good.
	for _, n := range nodes {
		n.args = append(n.args, "--listen", n.daemon.broker, "--namesrv-listen", n.namesrv)
	}
	awaitJoined(t, nodes, all...)
	const topic = "soak"
	nodes[0].ctl("topic", "create", topic, "--queues", "2")
	for _, n := range nodes {
		routed(t, n.namesrv, topic, wait, all...)
	}
	var namesrvs []string
	for _, n := range nodes {
		namesrvs = append(namesrvs, n.namesrv)
	}
	p, err := producer.New("soak-producers", producer.WithClientOptions(append(clientOpts(nodes[0].namesrv, "soak-producer"),
		client.WithNameServers(namesrvs...))...), producer.WithRetries(2), producer.WithSendTimeout(3*time.Second))
	require.NoError(t, err)
	require.NoError(t, p.Start(context.Background()))
	defer p.Close(context.Background())

	got := newBodyCounts()
	groupLogs := &syncBuffer{}
	closeGroup := startGroup(groupLogs, t, namesrvs, "soak-pullers", topic, 2, got)

	var mu sync.Mutex
	var acked []string
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			body := fmt.Sprintf("soak-%06d", i)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := p.Send(ctx, &producer.Message{Topic: topic, Body: []byte(body)})
			cancel()
			if err == nil {
				mu.Lock()
				acked = append(acked, body)
				mu.Unlock()
			}
			time.Sleep(5 * time.Millisecond) // a steady trickle, not a benchmark
		}
	}()

	for round := range rounds {
		time.Sleep(time.Duration(1+rand.IntN(3)) * time.Second)
		victim := nodes[rand.IntN(len(nodes))]
		var rest []string
		var others []*node
		for _, n := range nodes {
			if n != victim {
				rest = append(rest, n.broker)
				others = append(others, n)
			}
		}
		victim.kill()
		killed := time.Now()
		for _, n := range others {
			// wait: on a loaded machine detection can take longer; this test is about losing
			// nothing, and how long detection takes is logged by the interop test.
			routed(t, n.namesrv, topic, wait, rest...)
		}
		t.Logf("round %d: %s killed, left every route after %v", round, victim.broker, time.Since(killed).Round(time.Millisecond))
		time.Sleep(time.Second)
		victim.restart(t)
		for _, n := range nodes {
			routed(t, n.namesrv, topic, wait, all...)
		}
	}
	close(stop)
	<-done
	mu.Lock()
	want := append([]string(nil), acked...)
	mu.Unlock()
	t.Logf("%d sends acknowledged over %d rounds", len(want), rounds)
	readAll(t, nodes[2].namesrv, topic, want)
	assert.NotEmpty(t, want)
	drained := assert.Eventually(t, func() bool { return got.has(want) }, 2*wait, tick, "the group receives every acknowledged send")
	if !drained {
		t.Logf("the group misses %d of %d", len(missingFrom(got, want)), len(want))
		t.Logf("first missing: %v", first(missingFrom(got, want), 20))
		lines := strings.Split(groupLogs.String(), "\n")
		t.Logf("the group's last warnings:\n%s", strings.Join(lines[max(0, len(lines)-30):], "\n"))
	} else {
		t.Logf("the group received every one, %d of them more than once (at-least-once across a crash)", len(got.duplicates()))
	}
	closeGroup()
}

// startGroup starts n members of a lite-pull group of topic that know every name service
// of namesrvs (a killed node's name service is gone with it), each polling into got until
// closed; closeGroup closes them, and fails the test if a close fails.
func startGroup(logs *syncBuffer, t *testing.T, namesrvs []string, group, topic string, n int, got *bodyCounts) (closeGroup func()) {
	t.Helper()
	var closers []func() error
	for i := range n {
		name := fmt.Sprintf("soak-puller-%d", i)
		c, err := consumer.NewLitePull(group, consumer.WithClientOptions(append(clientOpts(namesrvs[0], name),
			client.WithNameServers(namesrvs...), client.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))))...), consumer.WithConsumeFrom(consumer.ConsumeFromFirst),
			consumer.WithRebalanceInterval(time.Second), consumer.WithPollTimeout(200*time.Millisecond))
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
		var once sync.Once
		var closeErr error
		closers = append(closers, func() error {
			once.Do(func() {
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				defer cancel()
				closeErr = c.Close(ctx)
				<-done
			})
			return closeErr
		})
	}
	// A test that failed midway stops its nodes first (they were started, or restarted,
	// later): the close then finds no broker, which says nothing.
	t.Cleanup(func() {
		for _, c := range closers {
			_ = c()
		}
	})
	return func() {
		for _, c := range closers {
			assert.NoError(t, c(), "close a member of %s", group)
		}
	}
}

// missingFrom lists the bodies of want that got has not received.
func missingFrom(got *bodyCounts, want []string) []string {
	got.mu.Lock()
	defer got.mu.Unlock()
	var out []string
	for _, b := range want {
		if got.n[b] == 0 {
			out = append(out, b)
		}
	}
	return out
}

func first(s []string, n int) []string {
	return s[:min(n, len(s))]
}
