package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/pipeline"
)

// answeredBy runs a client command through n's NATS until n itself answers (every node
// serves the cluster's command subjects, and any may answer a request) and decodes the
// reply into out; false when n did not answer within a few tries.
func answeredBy(n *node, out any, args ...string) bool {
	for range 30 {
		raw, err := flowd(append(args, "--nats", n.nats, "--cluster", cluster, "--json")...)
		if err != nil {
			return false
		}
		var origin control.Origin
		if json.Unmarshal([]byte(raw), &origin) != nil {
			return false
		}
		if origin.Node == n.broker {
			return json.Unmarshal([]byte(raw), out) == nil
		}
	}
	return false
}

// nodePipelines is n's own pipeline list, by name; nil when n did not answer.
func nodePipelines(n *node) map[string]pipeline.Status {
	var r control.PipelineListReply
	if !answeredBy(n, &r, "pipeline", "list") {
		return nil
	}
	out := map[string]pipeline.Status{}
	for _, p := range r.Pipelines {
		out[p.Name] = p
	}
	return out
}

// sourceQueues is what each node's pipeline name owns of topic, as "broker/queue", by node;
// a node whose pipeline is not running owns nothing.
func sourceQueues(nodes []*node, name, topic string) map[string][]string {
	out := map[string][]string{}
	for _, n := range nodes {
		st := nodePipelines(n)[name]
		if st.State != pipeline.StateRunning {
			continue
		}
		for _, q := range st.Queues {
			if q.Queue.Topic == topic {
				out[n.broker] = append(out[n.broker], fmt.Sprintf("%s/%d", q.Queue.BrokerName, q.Queue.QueueID))
			}
		}
	}
	return out
}

// split reports whether the pipeline runs on every node and the topic's queues (total of
// them) are shared between the nodes, each owning some and none owned twice, in two
// readings in a row (a rebalance under way may show a queue on two nodes for a moment).
func split(nodes []*node, name, topic string, total int) bool {
	for range 2 {
		if !splitOnce(nodes, name, topic, total) {
			return false
		}
	}
	return true
}

func splitOnce(nodes []*node, name, topic string, total int) bool {
	owned := sourceQueues(nodes, name, topic)
	var all []string
	for _, n := range nodes {
		if len(owned[n.broker]) == 0 {
			return false
		}
		all = append(all, owned[n.broker]...)
	}
	slices.Sort(all)
	return len(all) == total && len(slices.Compact(all)) == total
}

// clusterMessages is the number of messages topic holds on all the nodes' brokers, each
// node telling its own; -1 when one did not answer.
func clusterMessages(nodes []*node, topic string) int64 {
	var sum int64
	for _, n := range nodes {
		var r control.TopicDescribeReply
		if !answeredBy(n, &r, "topic", "describe", topic) {
			return -1
		}
		sum += r.Messages
	}
	return sum
}

// awaitCopied waits until the output topic holds want messages on the cluster's brokers,
// requires it to stay at that (no copy delivered twice), and requires the bodies to be
// exactly those sent.
func awaitCopied(t *testing.T, nodes []*node, topic string, want []string, readBack bool) {
	t.Helper()
	require.Eventually(t, func() bool { return clusterMessages(nodes, topic) >= int64(len(want)) }, wait, tick,
		"%s holds %d messages", topic, len(want))
	time.Sleep(time.Second) // what a duplicate would take to arrive
	require.Equal(t, int64(len(want)), clusterMessages(nodes, topic), "no message copied twice")
	if !readBack {
		return
	}
	out, err := flowd("consume", topic, "--namesrv", nodes[0].namesrv, "--from", "first", "-n", strconv.Itoa(len(want)))
	require.NoError(t, err)
	assert.ElementsMatch(t, want, strings.Fields(out))
}

// A pipeline created once, through one node's CLI, runs on all three nodes of a cluster:
// the source topic's queues are split between them through the pipeline's consumer group,
// each node copies its share, and nothing is copied twice. It survives a restart of all
// three nodes, and a deletion through another node stops it on all of them.
func TestClusterRunsACreatedPipelineOnEveryNode(t *testing.T) {
	nodes := startCluster(t, "broker-1", "broker-2", "broker-3")
	a, b, c := nodes[0], nodes[1], nodes[2]
	all := []string{"broker-1", "broker-2", "broker-3"}
	a.ctl("topic", "create", "clicks", "--queues", "2")
	a.ctl("topic", "create", "clicks-out", "--queues", "1")
	for _, n := range nodes {
		routed(t, n.namesrv, "clicks", wait, all...)
		routed(t, n.namesrv, "clicks-out", wait, all...)
	}

	def := filepath.Join(t.TempDir(), "copy.yaml")
	require.NoError(t, os.WriteFile(def, []byte("name: copy\ntopics: [clicks]\nstart_from: first\nsink: {type: topic, topic: clicks-out}\n"), 0o600))
	created := time.Now()
	// The bucket may still be forming just after the cluster starts: the command says so,
	// and succeeds once JetStream answers.
	require.Eventually(t, func() bool {
		_, err := flowd("pipeline", "create", "-f", def, "--nats", b.nats, "--cluster", cluster)
		return err == nil
	}, wait, 200*time.Millisecond, "pipeline create through %s", b.broker)
	require.Eventually(t, func() bool { return split(nodes, "copy", "clicks", 6) }, wait, 100*time.Millisecond,
		"the six queues of clicks split between the three nodes: %v", sourceQueues(nodes, "copy", "clicks"))
	t.Logf("pipeline created through %s runs on every node after %v: %v", b.broker, time.Since(created).Round(time.Millisecond), sourceQueues(nodes, "copy", "clicks"))

	_, err := flowd("pipeline", "create", "-f", def, "--nats", c.nats, "--cluster", cluster)
	require.ErrorContains(t, err, "409", "a second creation of the name, through another node")

	first := bodies("click", 30)
	c.produce("clicks", nil, first...)
	awaitCopied(t, nodes, "clicks-out", first, true)
	for _, n := range nodes {
		st := nodePipelines(n)["copy"]
		assert.Positive(t, st.Counters.Out, "%s copied its share: %+v", n.broker, st.Counters)
	}

	// All three stop, then start again: the pipeline runs again on each, from the offsets
	// committed, so only the new messages are copied.
	for _, n := range nodes {
		require.NoError(t, n.cmd.Process.Signal(syscall.SIGTERM))
	}
	for _, n := range nodes {
		select {
		case <-n.exited:
		case <-time.After(2 * wait):
			t.Fatalf("flowd %s did not stop on SIGTERM", n.broker)
		}
		// The last nodes to leave may find JetStream without a quorum to deregister from,
		// which their exit status reports; the pipeline's offsets are committed before that.
		t.Logf("%s stopped: %v", n.broker, n.err)
	}
	for _, n := range nodes {
		n.daemon = launch(t, n.broker+" restarted", n.dir, "", n.args...)
	}
	for _, n := range nodes {
		n.awaitServing()
	}
	require.Eventually(t, func() bool { return split(nodes, "copy", "clicks", 6) }, 2*wait, 100*time.Millisecond,
		"after the restart the queues split again: %v", sourceQueues(nodes, "copy", "clicks"))
	second := bodies("again", 15)
	a.produce("clicks", nil, second...)
	// Counted, not read back: a fresh reader of the restarted cluster's output is not what
	// this test is about.
	awaitCopied(t, nodes, "clicks-out", append(slices.Clone(first), second...), false)

	// Deleted through C: every node stops it.
	c.ctl("pipeline", "delete", "copy")
	require.Eventually(t, func() bool {
		for _, n := range nodes {
			if ps := nodePipelines(n); ps == nil || len(ps) > 0 {
				return false
			}
		}
		return true
	}, wait, 100*time.Millisecond, "the pipeline stopped on every node")
	_, err = flowd("pipeline", "delete", "copy", "--nats", a.nats, "--cluster", cluster)
	require.ErrorContains(t, err, "404")
}
