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

// --cluster swaps the single-broker scenarios for the cluster ones, which the default set
// never holds; --scenarios selects among them by scenario or result name; the flags that make
// no cluster run are refused.
func TestBenchClusterScenarioSelection(t *testing.T) {
	list := func(args ...string) []string {
		t.Helper()
		var out, errs bytes.Buffer
		require.NoError(t, bench(context.Background(), append([]string{"--list"}, args...), &out, &errs))
		return strings.Fields(out.String())
	}
	all := []string{"cluster-produce-1024-async", "cluster-consume-1024", "cluster-route-convergence", "cluster-failure-detection"}
	assert.Equal(t, all, list("--cluster", "3"))
	for _, n := range list() {
		assert.False(t, strings.HasPrefix(n, "cluster-"), "the default set holds no cluster scenario: %s", n)
	}
	assert.Empty(t, list("--scenarios", "cluster-*"), "without --cluster there are none")
	assert.Equal(t, []string{"cluster-route-convergence"}, list("--cluster", "3", "--scenarios", "cluster-route-convergence-p99"))
	assert.Equal(t, []string{"cluster-failure-detection"}, list("--cluster", "2", "--cluster-kills", "2", "--scenarios", "cluster-failure-detection-2"))
	assert.Equal(t, all[:2], list("--cluster", "3", "--scenarios", "cluster-produce-*,cluster-consume-*"))

	for _, bad := range [][]string{
		{"--cluster", "1"}, {"--cluster", "10"}, {"--cluster", "3", "--namesrv", "127.0.0.1:9876"},
		{"--cluster", "3", "--cluster-topics", "0"}, {"--cluster", "3", "--cluster-kills", "0"},
	} {
		var out, errs bytes.Buffer
		assert.ErrorContains(t, bench(context.Background(), bad, &out, &errs), "--cluster", "%v", bad)
	}
}

// A --cluster 3 run with tiny counts starts three `flowd serve` children and one more for the
// one-node figures, and reports every cluster figure: throughput next to the one node's, the
// route convergence of each created topic, and the time a killed node takes to leave the
// routes, which the registry's TTL bounds from below (less a heartbeat interval, the most
// the last heartbeat can precede the kill).
func TestBenchClusterSmoke(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "flowd")
	build := exec.Command("go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build flowd: %s", out)

	var stdout, errs bytes.Buffer
	err = bench(context.Background(), []string{"--cluster", "3", "--flowd-binary", bin, "--data-dir", t.TempDir(), "--json",
		"--messages", "300", "--inflight", "16", "--queues", "2", "--cluster-topics", "5", "--cluster-kills", "1"}, &stdout, &errs)
	require.NoError(t, err, errs.String())

	var report benchReport
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &report), "stdout is one JSON document: %s", stdout.String())
	assert.Equal(t, 3, report.Cluster)
	byName := map[string]benchResult{}
	var names []string
	for _, r := range report.Results {
		byName[r.Scenario] = r
		names = append(names, r.Scenario)
		assert.Positive(t, r.Flowd, r.Scenario)
		assert.Equal(t, 3, r.Nodes, r.Scenario)
	}
	assert.Equal(t, []string{"cluster-produce-1024-async", "cluster-consume-1024", "cluster-route-convergence-p50",
		"cluster-route-convergence-p99", "cluster-route-convergence-max", "cluster-failure-detection-1", "cluster-failure-detection-mean"}, names)
	for _, n := range []string{"cluster-produce-1024-async", "cluster-consume-1024"} {
		r := byName[n]
		assert.Equal(t, "msg/s", r.Unit)
		require.NotNil(t, r.Ratio, n)
		assert.Equal(t, "1-node", r.BaselineName)
		assert.Positive(t, *r.Baseline, n)
	}
	conv := byName["cluster-route-convergence-p50"]
	assert.Equal(t, "ns", conv.Unit)
	assert.LessOrEqual(t, conv.Flowd, byName["cluster-route-convergence-max"].Flowd)
	gone := byName["cluster-failure-detection-1"]
	assert.Equal(t, int64(benchRegistryTTL), gone.TTL)
	assert.GreaterOrEqual(t, gone.Flowd, float64(benchRegistryTTL-benchRegistryTTL/3), "no node leaves the routes before its entry can expire")
	assert.Equal(t, gone.Flowd, byName["cluster-failure-detection-mean"].Flowd, "one round: its mean is itself")
}
