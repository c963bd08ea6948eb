package e2e

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/pipeline"
)

// owners returns, for each daemon pid, the queues of topic its pipeline consumers hold the
// locks of in group, from `flowd group describe` on d (client ids are ip@pid#suffix), and
// the number of members of the group.
func (d *daemon) owners(group, topic string) (byPid map[int][]int32, members int, err error) {
	var r control.GroupDescribeReply
	if err := d.ctlJSON(&r, "group", "describe", group); err != nil {
		return nil, 0, err
	}
	byPid = map[int][]int32{}
	for _, tv := range r.Topics {
		if tv.Topic != topic {
			continue
		}
		for _, q := range tv.Queues {
			_, rest, _ := strings.Cut(q.Owner, "@")
			pid, _, _ := strings.Cut(rest, "#")
			n, err := strconv.Atoi(pid)
			if err != nil {
				n = 0 // no owner
			}
			byPid[n] = append(byPid[n], q.Queue)
		}
	}
	return byPid, len(r.Members), nil
}

// Two daemons run one pipeline whose source is a topic of the first (source_name_servers):
// they split its queues in the consumer group, and when the second stops (SIGTERM, draining)
// the first takes every queue at the committed offsets. The sink, a topic of the first,
// holds each message exactly once.
func TestTwoDaemonsSplitAPipelineAndHandOverOnSIGTERM(t *testing.T) {
	const (
		group        = "pipeline-split"
		first, later = 300, 100
	)
	a := startDaemon(t, "A", t.TempDir(), "")
	a.ctl("topic", "create", "src", "--queues", "4")
	a.ctl("topic", "create", "out", "--queues", "2")
	def := fmt.Sprintf(`pipelines:
  - name: split
    topics: [src]
    source_name_servers: [%q]
    start_from: first
    pull_batch_size: 8
    sink: {type: topic, topic: out, name_servers: [%q]}
`, a.namesrv, a.namesrv)
	a.reload(def)
	require.Eventually(t, func() bool { return a.pipeline("split").State == pipeline.StateRunning }, wait, tick)
	b := startDaemon(t, "B", t.TempDir(), def)

	require.Eventually(t, func() bool {
		byPid, members, err := a.owners(group, "src")
		return err == nil && members == 2 && len(byPid[a.pid()]) == 2 && len(byPid[b.pid()]) == 2
	}, wait, tick, "A and B own two queues each")
	bs := b.pipeline("split")
	assert.Len(t, bs.Queues, 2, "B reports the queues it reads")
	for _, q := range bs.Queues {
		assert.Equal(t, int64(-1), q.Lag, "B cannot see the lag of A's queues in its own store")
	}

	var bodies []string
	for i := range first + later {
		bodies = append(bodies, fmt.Sprintf("m-%03d", i))
	}
	a.produceFile("src", nil, bodies[:first])
	var bOut uint64
	require.Eventually(t, func() bool {
		bOut = b.pipeline("split").Counters.Out
		return bOut > 0
	}, wait, tick, "B delivers its share")
	b.terminate()
	assert.Contains(t, b.logs.String(), `msg="pipeline stopped"`)

	byPid, members, err := a.owners(group, "src")
	require.NoError(t, err)
	t.Logf("B stopped after delivering at least %d; then members %d, queues by pid %v (A %d, B %d)", bOut, members, byPid, a.pid(), b.pid())
	require.Eventually(t, func() bool {
		byPid, members, err := a.owners(group, "src")
		return err == nil && members == 1 && len(byPid[a.pid()]) == 4
	}, wait, tick, "A owns every queue once B left")
	a.produceFile("src", nil, bodies[first:])
	require.Eventually(t, func() bool {
		var r control.GroupDescribeReply
		return a.ctlJSON(&r, "group", "describe", group) == nil && r.Lag == 0
	}, wait, tick, "A's pipeline catches up")

	got := a.readTopic("out", first+later)
	out := make([]string, len(got))
	for i, m := range got {
		out[i] = m.Body
	}
	slices.Sort(out)
	assert.Equal(t, bodies, out, "each message exactly once")
}
