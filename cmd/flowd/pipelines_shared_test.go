package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/pipeline"
)

// listed returns the daemon's pipelines by name, from pipeline list --json.
func listed(t *testing.T, ctl []string) map[string]pipeline.Status {
	t.Helper()
	raw, err := cli(t, "", append([]string{"pipeline", "list", "--json"}, ctl...)...)
	require.NoError(t, err)
	var r control.PipelineListReply
	require.NoError(t, json.Unmarshal([]byte(raw), &r))
	out := map[string]pipeline.Status{}
	for _, p := range r.Pipelines {
		out[p.Name] = p
	}
	return out
}

func awaitState(t *testing.T, ctl []string, name string, want pipeline.State) {
	t.Helper()
	require.Eventually(t, func() bool { return listed(t, ctl)[name].State == want }, 20*time.Second, 20*time.Millisecond,
		"pipeline %s is %s: %+v", name, want, listed(t, ctl)[name])
}

// A single node with no cluster runs the pipelines created with `flowd pipeline create`
// (a YAML file or a JSON one) beside those of its configuration file, keeps them across a
// restart in its data directory, and stops one at `flowd pipeline delete`; a bad definition
// is refused naming the field, and a name of the configuration file's refused plainly.
func TestServeRunsCreatedPipelinesOnASingleNode(t *testing.T) {
	dir := t.TempDir()
	const yamlPipeline = "pipelines:\n  - {name: from-file, topics: [orders], sink: {type: stdout}}\n"
	d := startServedIn(t, dir, "cluster: e2e\n"+yamlPipeline)
	ctl := []string{"--nats", d.nats, "--cluster", "e2e"}
	_, err := cli(t, "", append([]string{"topic", "create", "orders", "--queues", "2"}, ctl...)...)
	require.NoError(t, err)
	_, err = cli(t, "", append([]string{"topic", "create", "copies", "--queues", "1"}, ctl...)...)
	require.NoError(t, err)

	defYAML := filepath.Join(dir, "copy.yaml")
	require.NoError(t, os.WriteFile(defYAML, []byte("name: copy\ntopics: [orders]\nretry_backoff: 250ms\nsink:\n  type: topic\n  topic: copies\n"), 0o600))
	out, err := cli(t, "", append([]string{"pipeline", "create", "-f", defYAML}, ctl...)...)
	require.NoError(t, err)
	assert.Contains(t, out, "copy")
	defJSON := filepath.Join(dir, "audit.json")
	require.NoError(t, os.WriteFile(defJSON, []byte(`{"name":"audit","topics":["orders"],"sink":{"type":"stdout"}}`), 0o600))
	_, err = cli(t, "", append([]string{"pipeline", "create", "-f", defJSON}, ctl...)...)
	require.NoError(t, err)
	awaitState(t, ctl, "copy", pipeline.StateRunning)
	awaitState(t, ctl, "audit", pipeline.StateRunning)
	assert.Equal(t, pipeline.Duration(250*time.Millisecond), listed(t, ctl)["copy"].Definition.RetryBackoff)
	assert.Equal(t, pipeline.StateRunning, listed(t, ctl)["from-file"].State)

	// Refused, nothing stored: a field at fault, an unknown key, a name taken by the file
	// or by a created pipeline.
	bad := filepath.Join(dir, "bad.yaml")
	for _, tc := range []struct{ def, want string }{
		{"name: b\ntopics: [orders]\nsink: {type: topic}\n", `field "definition.sink.topic"`},
		{"name: b\ntopics: [orders]\ncolour: red\nsink: {type: stdout}\n", `field "definition.colour": unknown field`},
		{"name: from-file\ntopics: [orders]\nsink: {type: stdout}\n", "configuration file"},
		{"name: copy\ntopics: [orders]\nsink: {type: stdout}\n", "409"},
	} {
		require.NoError(t, os.WriteFile(bad, []byte(tc.def), 0o600))
		_, err = cli(t, "", append([]string{"pipeline", "create", "-f", bad}, ctl...)...)
		require.ErrorContains(t, err, tc.want, tc.def)
	}
	_, err = cli(t, "", append([]string{"pipeline", "create"}, ctl...)...)
	require.ErrorContains(t, err, "-f")
	_, err = cli(t, "", append([]string{"pipeline", "delete", "nope"}, ctl...)...)
	require.ErrorContains(t, err, "404")
	_, err = cli(t, "", append([]string{"pipeline", "delete", "from-file"}, ctl...)...)
	require.ErrorContains(t, err, "configuration file")
	assert.NotContains(t, listed(t, ctl), "b")

	// A restart keeps the created pipelines.
	d.stop()
	d = startServedIn(t, dir, "cluster: e2e\n"+yamlPipeline)
	ctl = []string{"--nats", d.nats, "--cluster", "e2e"}
	awaitState(t, ctl, "copy", pipeline.StateRunning)
	awaitState(t, ctl, "audit", pipeline.StateRunning)
	assert.Equal(t, []string{"orders"}, listed(t, ctl)["copy"].Definition.Topics)

	out, err = cli(t, "", append([]string{"pipeline", "delete", "audit"}, ctl...)...)
	require.NoError(t, err)
	assert.Contains(t, out, "audit")
	require.Eventually(t, func() bool { _, ok := listed(t, ctl)["audit"]; return !ok }, 20*time.Second, 20*time.Millisecond, "audit stopped")
	assert.True(t, strings.Contains(d.logs.String(), "pipeline stopped"), "drained, not killed")
	d.stop()
	d = startServedIn(t, dir, "cluster: e2e\n"+yamlPipeline)
	ctl = []string{"--nats", d.nats, "--cluster", "e2e"}
	awaitState(t, ctl, "copy", pipeline.StateRunning)
	assert.NotContains(t, listed(t, ctl), "audit", "the deletion holds across a restart")
}
