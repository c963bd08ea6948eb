package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/pipeline"
)

// buildGoPlugin builds the Go package at pkg (relative to this directory) as a wasip1
// reactor, the way a plugin author does, and returns the module's path.
func buildGoPlugin(t *testing.T, pkg string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), filepath.Base(pkg)+".wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	o, err := cmd.CombinedOutput()
	require.NoError(t, err, string(o))
	return out
}

// writeJSON writes v as JSON to a new file of the test and returns its path.
func writeJSON(t *testing.T, name string, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, b, 0o600))
	return path
}

// consumed is one line of `flowd consume -o json`.
type consumed struct {
	Queue      int               `json:"queue"`
	Offset     int64             `json:"offset"`
	Tags       string            `json:"tags"`
	Keys       []string          `json:"keys"`
	Properties map[string]string `json:"properties"`
	Body       string            `json:"body"`
}

// topicMessages is the number of messages topic holds, from `flowd topic describe`.
func (d *daemon) topicMessages(topic string) (int64, error) {
	var r control.TopicDescribeReply
	if err := d.ctlJSON(&r, "topic", "describe", topic); err != nil {
		return 0, err
	}
	return r.Messages, nil
}

// readTopic waits until topic holds exactly n messages and reads them all with `flowd
// consume` (a new group, from the first message).
func (d *daemon) readTopic(topic string, n int) []consumed {
	d.t.Helper()
	require.Eventually(d.t, func() bool {
		m, err := d.topicMessages(topic)
		return err == nil && m >= int64(n)
	}, wait, tick, "%s holds %d messages", topic, n)
	m, err := d.topicMessages(topic)
	require.NoError(d.t, err)
	require.Equal(d.t, int64(n), m, "%s holds exactly %d messages", topic, n)
	out, err := flowd("consume", topic, "--namesrv", d.namesrv, "--from", "first", "-o", "json", "-n", strconv.Itoa(n))
	require.NoError(d.t, err)
	var msgs []consumed
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var m consumed
		require.NoError(d.t, json.Unmarshal([]byte(line), &m), line)
		msgs = append(msgs, m)
	}
	return msgs
}

// pipelines returns the daemon's pipelines by name, from `flowd pipeline list --json`.
func (d *daemon) pipelines() (map[string]pipeline.Status, error) {
	var r control.PipelineListReply
	if err := d.ctlJSON(&r, "pipeline", "list"); err != nil {
		return nil, err
	}
	out := map[string]pipeline.Status{}
	for _, p := range r.Pipelines {
		out[p.Name] = p
	}
	return out, nil
}

// pipeline returns the status of the daemon's pipeline name; a daemon that does not answer
// has none.
func (d *daemon) pipeline(name string) pipeline.Status {
	ps, _ := d.pipelines()
	return ps[name]
}

// userProps keeps the properties a producer's user set: those of `flowd produce -p`, and
// not the ones the client and the broker add (UNIQ_KEY, TAGS, KEYS, ...), which are upper
// case.
func userProps(props map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range props {
		if strings.ToUpper(k) != k {
			out[k] = v
		}
	}
	return out
}

// Two pipelines of a daemon, started by a SIGHUP reload, use plugins deployed with the CLI:
// one keeps the orders of the Wasm filter's region (c-propfilter) and redacts their card
// numbers (go-redact, built from source) into a topic; the other keeps the US orders (SQL92)
// and redacts them into a NATS subject, properties as headers. Each output holds exactly the
// messages it should, in order (the source topic has one queue).
func TestPipelinesFilterAndTransformIntoATopicAndNATS(t *testing.T) {
	redact := buildGoPlugin(t, "../examples/wasm/go-redact")
	d := startDaemon(t, "A", t.TempDir(), "")
	d.ctl("topic", "create", "orders", "--queues", "1")
	d.ctl("topic", "create", "eu-orders", "--queues", "1")

	region := writeJSON(t, "region.json", map[string]any{"name": "region", "kind": "filter", "version": "1.0.0", "abi": 1,
		"parameters": map[string]string{"property": "region", "value": "eu"}})
	out := d.ctl("plugin", "deploy", "../examples/wasm/c-propfilter/propfilter.wasm", region, "--activate")
	assert.Regexp(t, `region\s+1\.0\.0\s+filter\s+true`, out)
	cards := writeJSON(t, "redact.json", map[string]any{"name": "redact-cards", "kind": "transform", "version": "1.0.0", "abi": 1,
		"limits": map[string]any{"memory_pages": 512}, "parameters": map[string]string{"field": "card"}})
	out = d.ctl("plugin", "deploy", redact, cards, "--activate")
	assert.Regexp(t, `redact-cards\s+1\.0\.0\s+transform\s+true`, out)

	nc, err := nats.Connect(d.nats)
	require.NoError(t, err)
	defer nc.Close()
	us, err := nc.SubscribeSync("orders.us")
	require.NoError(t, err)
	require.NoError(t, nc.Flush())

	d.reload(`pipelines:
  - name: eu
    topics: [orders]
    selector: {type: WASM, expression: region}
    transforms: [redact-cards]
    start_from: first
    sink: {type: topic, topic: eu-orders}
  - name: us
    topics: [orders]
    selector: {type: SQL92, expression: "region = 'us'"}
    transforms: [redact-cards]
    start_from: first
    sink: {type: nats, subject: orders.us, jetstream: never}
`)
	require.Eventually(t, func() bool {
		return d.pipeline("eu").State == pipeline.StateRunning && d.pipeline("us").State == pipeline.StateRunning
	}, wait, tick, "the reload starts both pipelines")

	// One queue: the pipelines see the messages in this order. The last one each keeps is
	// the last of the topic it keeps, so once it is out nothing else can follow.
	d.produce("orders", []string{"-p", "region=eu", "-p", "tier=gold", "--tag", "new", "--keys", "k1"}, `{"id":1,"card":"4111-1111"}`)
	d.produce("orders", []string{"-p", "region=us", "-p", "tier=basic"}, `{"id":2,"card":"5500-0000","note":{"card":"x"}}`)
	d.produce("orders", []string{"-p", "region=EU"}, `{"id":3,"card":"3400"}`)
	d.produce("orders", nil, `{"id":4,"card":"6011"}`)
	d.produce("orders", []string{"-p", "region=eu", "--tag", "new"}, `{"id":5,"name":"no card"}`, `{"id":6, "card" : "30569309"}`)
	d.produce("orders", []string{"-p", "region=us"}, `{"id":7}`)

	got := d.readTopic("eu-orders", 3)
	wantBodies := []string{`{"id":1,"card":"***"}`, `{"id":5,"name":"no card"}`, `{"id":6, "card" : "***"}`}
	for i, m := range got {
		assert.Equal(t, wantBodies[i], m.Body, "eu-orders[%d]", i)
		assert.Equal(t, "new", m.Tags, "eu-orders[%d] keeps its tag", i)
	}
	assert.Equal(t, map[string]string{"region": "eu", "tier": "gold"}, userProps(got[0].Properties))
	assert.Equal(t, []string{"k1"}, got[0].Keys)
	assert.Equal(t, map[string]string{"region": "eu"}, userProps(got[2].Properties))

	var nmsgs []*nats.Msg
	for len(nmsgs) == 0 || !strings.Contains(string(nmsgs[len(nmsgs)-1].Data), `"id":7`) {
		m, err := us.NextMsg(wait)
		require.NoError(t, err, "the us pipeline publishes its last message; got %d", len(nmsgs))
		nmsgs = append(nmsgs, m)
	}
	require.Len(t, nmsgs, 2, "only the US orders reach NATS")
	assert.Equal(t, `{"id":2,"card":"***","note":{"card":"***"}}`, string(nmsgs[0].Data))
	assert.Equal(t, `{"id":7}`, string(nmsgs[1].Data))
	assert.Equal(t, nats.Header{"region": {"us"}, "tier": {"basic"}, "Flowd-Topic": {"orders"}}, nmsgs[0].Header,
		"the user properties as headers, and the source topic")
	assert.Equal(t, nats.Header{"region": {"us"}, "Flowd-Topic": {"orders"}}, nmsgs[1].Header)

	// A record is out before the pipeline counts it (the sink's acknowledgement is on its
	// way back): the counters are waited for, and must settle at exactly these.
	require.Eventually(t, func() bool {
		return d.pipeline("eu").Counters == pipeline.Counters{In: 3, Out: 3} && d.pipeline("us").Counters == pipeline.Counters{In: 2, Out: 2}
	}, wait, tick, "the broker's filters hand out only the selected orders")
}
