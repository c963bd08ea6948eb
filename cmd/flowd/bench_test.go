package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The smoke run of flowd bench measures flowd and the embedded JetStream peer in one run and
// prints the --json document: every scenario once, with a baseline and a ratio where the run
// had one.
func TestBenchSmokeJSONAgainstJetStream(t *testing.T) {
	var out, errs bytes.Buffer
	err := bench(context.Background(), []string{"--json", "--data-dir", t.TempDir(), "--messages", "2000", "--inflight", "64",
		"--latency-samples", "20", "--queues", "2", "--batch", "16"}, &out, &errs)
	require.NoError(t, err, errs.String())

	var doc map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(out.Bytes(), &doc), "stdout is one JSON document: %s", out.String())
	assert.ElementsMatch(t, []string{"messages", "size", "inflight", "queues", "results"}, keys(doc))

	var report benchReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &report))
	assert.Equal(t, 2000, report.Messages)
	assert.Equal(t, 1024, report.Size)
	assert.Equal(t, 64, report.InFlight)
	var scenarios []string
	for _, r := range report.Results {
		scenarios = append(scenarios, r.Scenario)
		assert.Positive(t, r.Flowd, r.Scenario)
		switch r.Scenario {
		case "produce", "produce-batched", "consume":
			require.NotNil(t, r.Baseline, r.Scenario)
			require.NotNil(t, r.Ratio, r.Scenario)
			assert.Equal(t, "jetstream", r.BaselineName)
			assert.Positive(t, *r.Baseline)
			assert.InDelta(t, r.Flowd / *r.Baseline, *r.Ratio, 1e-9)
		default:
			assert.Nil(t, r.Ratio, r.Scenario)
		}
	}
	assert.Equal(t, []string{"produce", "produce-batched", "consume", "send-to-poll-p50", "send-to-poll-p99", "send-round-trip-p50"}, scenarios)

	var raw []map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(doc["results"], &raw))
	for _, r := range raw {
		for _, k := range []string{"scenario", "unit", "flowd", "baseline", "ratio"} {
			assert.Contains(t, r, k, "every result has %q, null when there is no baseline", k)
		}
	}
}

func TestBenchRefusesAnUnknownBaseline(t *testing.T) {
	var out, errs bytes.Buffer
	err := bench(context.Background(), []string{"--baseline", "kafka"}, &out, &errs)
	require.ErrorContains(t, err, "--baseline")
}

func keys(m map[string]json.RawMessage) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
