package e2e

import (
	"bytes"
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
)

// In a three-node cluster, the list and status commands through any node answer for the
// whole cluster: `flowd topic list` against C lists a topic created on A with the queues of
// every broker, `flowd group describe` against C shows the group's lag on every broker,
// `flowd broker status` one line per broker; a killed node is named as missing while the
// registry still lists it.
func TestClusterCommandsGatherEveryNode(t *testing.T) {
	nodes := startCluster(t, "broker-1", "broker-2", "broker-3")
	a, b, c := nodes[0], nodes[1], nodes[2]
	all := []string{"broker-1", "broker-2", "broker-3"}
	for _, n := range nodes {
		var st control.ClusterStatusReply
		require.Eventually(t, func() bool {
			require.NoError(t, n.ctlJSON(&st, "cluster", "status", "--local"))
			return slices.Equal(brokerNames(st), all)
		}, wait, 100*time.Millisecond, "%s sees every broker: %+v", n.broker, st)
	}

	const topic = "orders"
	a.ctl("topic", "create", topic, "--queues", "2")
	routed(t, c.namesrv, topic, wait, all...)

	var list control.TopicListReply
	require.NoError(t, c.ctlJSON(&list, "topic", "list"))
	assert.Equal(t, all, list.Answered)
	assert.Empty(t, list.Missing)
	i := slices.IndexFunc(list.Topics, func(v control.TopicView) bool { return v.Topic == topic })
	require.GreaterOrEqual(t, i, 0, "%+v", list.Topics)
	var brokers []string
	for _, bv := range list.Topics[i].Brokers {
		brokers = append(brokers, bv.Broker)
		assert.Equal(t, 2, bv.WriteQueues, bv.Broker)
		assert.Equal(t, 2, bv.ReadQueues, bv.Broker)
	}
	assert.Equal(t, all, brokers, "the topic created on A has queues on every broker")
	assert.Regexp(t, `(?m)^orders\s+2\s+2\s+rw\s+false\s+user\s+broker-1,broker-2,broker-3$`, c.ctl("topic", "list"))

	// The group consumes the first six messages (two on each broker), then six more arrive.
	first := produceIDs(t, b.namesrv, topic, bodies("first", 6)...)
	require.Len(t, perPort(first), 3, "sends on every broker")
	out, err := flowd("consume", topic, "--namesrv", c.namesrv, "--group", "billing", "--from", "first", "-n", "6")
	require.NoError(t, err)
	assert.ElementsMatch(t, bodies("first", 6), strings.Fields(out))
	produceIDs(t, a.namesrv, topic, bodies("second", 6)...)

	var d control.GroupDescribeReply
	require.Eventually(t, func() bool {
		require.NoError(t, c.ctlJSON(&d, "group", "describe", "billing"))
		return d.Lag == 6
	}, wait, 100*time.Millisecond, "the lag of every broker: %+v", d)
	assert.Equal(t, all, d.Answered)
	lagBy := map[string]int64{}
	for _, tv := range d.Topics {
		if tv.Topic != topic {
			continue
		}
		for _, q := range tv.Queues {
			lagBy[q.Broker] += q.Lag
		}
	}
	assert.Equal(t, map[string]int64{"broker-1": 2, "broker-2": 2, "broker-3": 2}, lagBy, "two unconsumed messages on each broker")
	table := c.ctl("group", "describe", "billing")
	assert.Regexp(t, `(?m)^lag\s+6$`, table)
	for _, name := range all {
		assert.Regexp(t, `(?m)^orders\s+`+name+`\s+\d\s+\d+\s+\d+\s+\d+`, table)
	}
	assert.Regexp(t, `(?m)^billing\s+(true|false)\s+\d+\s+6\s+\S+\s+broker-1,broker-2,broker-3$`, c.ctl("group", "list"))
	var local control.GroupDescribeReply
	require.NoError(t, c.ctlJSON(&local, "group", "describe", "billing", "--local"))
	assert.Empty(t, local.Answered, "a local answer is the node's own")

	status := c.ctl("broker", "status")
	for _, name := range all {
		assert.Regexp(t, `(?m)^`+name+`( \*)?\s+`+name+`\s+127\.0\.0\.1:\d+\s`, status)
	}
	var cs control.ClusterStatusReply
	require.NoError(t, c.ctlJSON(&cs, "cluster", "status"))
	require.Len(t, cs.Nodes, 3)
	for _, n := range cs.Nodes {
		assert.Equal(t, all, n.Brokers, "%s's registry copy", n.Node)
		require.NotNil(t, n.NATS, n.Node)
		assert.Len(t, n.NATS.Routes, 2, n.Node)
	}

	// B crashes: until its registry entry expires, the others name it as missing, and the
	// CLI warns of it.
	b.kill()
	killed := time.Now()
	stdout, stderr, err := flowdOutputs("topic", "list", "--nats", a.nats, "--cluster", cluster)
	require.NoError(t, err)
	require.NoError(t, a.ctlJSON(&list, "topic", "list"))
	require.Less(t, time.Since(killed), brokerTTL, "asked while the registry still lists broker-2")
	assert.Regexp(t, `(?m)^orders\s+2\s+2\s+rw\s+false\s+user\s+broker-1,broker-3$`, stdout)
	assert.Contains(t, stderr, "warning: node broker-2 did not answer: no responders")
	assert.Equal(t, []string{"broker-2"}, list.Missing)
	assert.Contains(t, list.MissingReasons["broker-2"], "no responders")
	assert.Equal(t, []string{"broker-1", "broker-3"}, list.Answered)
}

// flowdOutputs runs the binary with args and returns its standard output and error.
func flowdOutputs(args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	cmd := exec.CommandContext(ctx, flowdBin, args...)
	var out, errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	err := cmd.Run()
	return out.String(), errs.String(), err
}
