package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --replica-set swaps the single-broker scenarios for the replica-set ones; --scenarios
// selects among them by scenario or result name; the flags that make no such run are
// refused.
func TestBenchReplicaSetScenarioSelection(t *testing.T) {
	list := func(args ...string) []string {
		t.Helper()
		var out, errs bytes.Buffer
		require.NoError(t, bench(context.Background(), append([]string{"--list"}, args...), &out, &errs))
		return strings.Fields(out.String())
	}
	assert.Equal(t, []string{"replica-sync-produce-1024-p4", "replica-sync-send-1024", "replica-async-produce-1024-p4",
		"replica-async-send-1024", "replica-catchup"}, list("--replica-set", "3", "--producers", "4"))
	for _, n := range list() {
		assert.False(t, strings.HasPrefix(n, "replica-"), "the default set holds no replica-set scenario: %s", n)
	}
	assert.Equal(t, []string{"replica-sync-send-1024"}, list("--replica-set", "3", "--scenarios", "replica-sync-send-1024-p99"))
	assert.Equal(t, []string{"replica-catchup"}, list("--replica-set", "2", "--scenarios", "replica-catchup-time"))
	for _, bad := range [][]string{
		{"--replica-set", "1"}, {"--replica-set", "6"}, {"--replica-set", "3", "--cluster", "3"},
		{"--replica-set", "3", "--namesrv", "127.0.0.1:9876"}, {"--replica-set", "3", "--catchup-mb", "0"},
	} {
		var out, errs bytes.Buffer
		assert.Error(t, bench(context.Background(), bad, &out, &errs), "%v", bad)
	}
}

// A --replica-set 3 run with tiny counts starts one node, then a sync-mode and an
// async-mode replica set of three `flowd serve` children, and reports every figure: each
// mode's throughput and send latency next to the one node's, with the replicas' CPU, and
// the catch-up of a replica restarted behind the master.
func TestBenchReplicaSetSmoke(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "flowd")
	build := exec.Command("go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build flowd: %s", out)

	var stdout, errs bytes.Buffer
	err = bench(context.Background(), []string{"--replica-set", "3", "--flowd-binary", bin, "--data-dir", t.TempDir(), "--json",
		"--messages", "300", "--inflight", "16", "--queues", "2", "--producers", "2", "--latency-samples", "50", "--catchup-mb", "2"}, &stdout, &errs)
	require.NoError(t, err, errs.String())

	var report benchReport
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &report), "stdout is one JSON document: %s", stdout.String())
	assert.Equal(t, 3, report.ReplicaSet)
	byName := map[string]benchResult{}
	var names []string
	for _, r := range report.Results {
		byName[r.Scenario] = r
		names = append(names, r.Scenario)
		assert.Positive(t, r.Flowd, r.Scenario)
		assert.Equal(t, 3, r.Nodes, r.Scenario)
	}
	assert.Equal(t, []string{"replica-sync-produce-1024-p2", "replica-sync-send-1024-p50", "replica-sync-send-1024-p99",
		"replica-async-produce-1024-p2", "replica-async-send-1024-p50", "replica-async-send-1024-p99",
		"replica-catchup", "replica-catchup-time"}, names)
	for _, mode := range []string{"sync", "async"} {
		p := byName["replica-"+mode+"-produce-1024-p2"]
		assert.Equal(t, mode, p.Replication)
		assert.Equal(t, "msg/s", p.Unit)
		require.NotNil(t, p.Ratio)
		assert.Equal(t, "1-node", p.BaselineName)
		assert.Positive(t, p.BrokerCPU, "the master's CPU per message")
		assert.Positive(t, p.ReplicaCPU, "the replicas copied the messages")
		assert.Positive(t, p.BaselineServerCPU, "the one node's CPU per message")
		p50, p99 := byName["replica-"+mode+"-send-1024-p50"], byName["replica-"+mode+"-send-1024-p99"]
		assert.Equal(t, "ns", p50.Unit)
		require.NotNil(t, p50.Ratio)
		assert.LessOrEqual(t, p50.Flowd, p99.Flowd)
	}
	assert.Equal(t, "MB/s", byName["replica-catchup"].Unit)
	assert.Equal(t, "ns", byName["replica-catchup-time"].Unit)
	assert.Nil(t, byName["replica-catchup"].Ratio, "no one-node figure to compare with")
}
