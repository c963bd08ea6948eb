package e2e

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
)

// queueEnds returns each queue's max offset of topic, from `flowd topic describe`.
func (d *daemon) queueEnds(topic string) map[int32]int64 {
	d.t.Helper()
	var r control.TopicDescribeReply
	require.NoError(d.t, d.ctlJSON(&r, "topic", "describe", topic))
	out := map[int32]int64{}
	for _, q := range r.Queues {
		out[q.Queue] = q.MaxOffset
	}
	return out
}

// A daemon killed with SIGKILL in the middle of a stream (a `flowd produce` sending to the
// pipeline's source topic, the pipeline copying it) loses nothing once restarted, and
// delivers again exactly the messages it had delivered past the offsets its broker had
// written to disk: those of the batches in progress and of the commits since the broker's
// last offset flush (every 500ms, after an fsync of the store), a number that depends on the
// moment of the kill. So it is derived from what the kill left on disk: the source offsets
// of the outputs written before the kill, against the persisted offsets. The kill comes once
// the first commits are on disk, so that the restart resumes from them.
func TestKilledDaemonMidStreamLosesNothing(t *testing.T) {
	const (
		dropN, keepN, streamN = 300, 1500, 8000
		group                 = "pipeline-copy"
	)
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	d := startDaemon(t, "A", dir, "")
	d.ctl("topic", "create", "src", "--queues", "4")
	d.ctl("topic", "create", "out", "--queues", "2")
	lines := func(prefix string, n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("%s-%05d", prefix, i))
		}
		return out
	}
	d.produceFile("src", []string{"-p", "keep=no"}, lines("drop", dropN))
	d.produceFile("src", []string{"-p", "keep=yes"}, lines("keep", keepN))
	pipelines := `pipelines:
  - name: copy
    topics: [src]
    selector: {type: SQL92, expression: "keep = 'yes'"}
    start_from: first
    pull_batch_size: 16
    sink: {type: topic, topic: out}
`
	d.reload(pipelines)
	require.Eventually(t, func() bool {
		p, err := persisted(dataDir, group, "src")
		return err == nil && len(p) > 0
	}, wait, tick, "the broker writes the pipeline's first commits")

	// The stream: a producer prints a line per message sent; the daemon is killed once it
	// is under way, then the producer (failing by then) too.
	stream := filepath.Join(t.TempDir(), "stream.txt")
	require.NoError(t, os.WriteFile(stream, []byte(strings.Join(lines("stream", streamN), "\n")+"\n"), 0o600))
	prod := exec.Command(flowdBin, "produce", "src", "--namesrv", d.namesrv, "-p", "keep=yes", "--file", stream)
	sent := &syncBuffer{}
	prod.Stdout, prod.Stderr = sent, io.Discard
	require.NoError(t, prod.Start())
	prodDone := make(chan error, 1)
	go func() { prodDone <- prod.Wait() }()
	require.Eventually(t, func() bool { return strings.Count(sent.String(), "\n") >= 100 }, wait, tick, "the stream is under way")
	d.kill()
	_ = prod.Process.Kill()
	assert.Error(t, <-prodDone, "the producer had not sent the whole stream when the daemon died")
	onDisk, err := persisted(dataDir, group, "src")
	require.NoError(t, err)

	// Restarted without the pipeline first, to see what the source holds (what the stream
	// got stored) and what the outputs were at the kill.
	d = startDaemon(t, "A restarted", dir, "")
	type pos struct {
		queue  int32
		offset int64
	}
	src := map[string]pos{}
	var kept []string
	stored, err := d.topicMessages("src")
	require.NoError(t, err)
	for _, m := range d.readTopic("src", int(stored)) {
		src[m.Body] = pos{int32(m.Queue), m.Offset}
		if m.Properties["keep"] == "yes" {
			kept = append(kept, m.Body)
		}
	}
	atKill := d.queueEnds("out")
	d.reload(pipelines)
	require.Eventually(t, func() bool { return d.caughtUp(group, "src", 4) }, wait, tick, "the restarted pipeline catches up")

	before, dups := 0, 0
	for _, end := range atKill {
		before += int(end)
	}
	outs, err := d.topicMessages("out")
	require.NoError(t, err)
	got := d.readTopic("out", int(outs))
	times := map[string]int{}
	for _, m := range got {
		times[m.Body]++
		if m.Offset < atKill[int32(m.Queue)] {
			p := src[m.Body]
			if off, ok := onDisk[p.queue]; !ok || p.offset >= off {
				dups++
			}
		}
	}
	t.Logf("killed with %d of %d outputs written; persisted offsets %v; %d of those outputs past them", before, len(kept), onDisk, dups)
	var lost, wrong []string
	for _, b := range kept {
		if times[b] == 0 {
			lost = append(lost, b)
		}
	}
	for b := range times {
		if !strings.HasPrefix(b, "keep-") && !strings.HasPrefix(b, "stream-") {
			wrong = append(wrong, b)
		}
	}
	assert.Empty(t, lost, "every kept message is delivered")
	assert.Empty(t, wrong, "only kept messages are delivered")
	assert.Len(t, got, len(kept)+dups, "each kept message once, and those delivered past the persisted offsets twice")
}
