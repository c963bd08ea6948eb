package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The smoke run of flowd bench measures flowd and the embedded JetStream peer in one run and
// prints the --json document: every selected scenario once, with a baseline and a ratio where
// the run had one, and the durability each side acknowledged at.
func TestBenchSmokeJSONAgainstJetStream(t *testing.T) {
	var out, errs bytes.Buffer
	err := bench(context.Background(), []string{"--deploy", "in-process", "--json", "--data-dir", t.TempDir(), "--messages", "500", "--inflight", "16",
		"--latency-samples", "50", "--rate", "2000", "--queues", "2", "--batch", "16", "--producers", "2", "--sync-producers", "4",
		"--sizes", "128", "--scenarios", "disk-*,produce-128-async*,consume-128,produce-128-batched,produce-1024-syncflush-*,e2e-delay-p99"}, &out, &errs)
	require.NoError(t, err, errs.String())
	assert.Empty(t, errs.String(), "no progress bar when stderr is not a terminal")

	var doc map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(out.Bytes(), &doc), "stdout is one JSON document: %s", out.String())
	assert.ElementsMatch(t, []string{"messages", "size", "sizes", "inflight", "queues", "producers", "rate", "deploy", "results"}, keys(doc))

	var report benchReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &report))
	assert.Equal(t, 500, report.Messages)
	assert.Equal(t, 128, report.Size)
	assert.Equal(t, []int{128}, report.Sizes)
	assert.Equal(t, 16, report.InFlight)
	var scenarios []string
	for _, r := range report.Results {
		scenarios = append(scenarios, r.Scenario)
		assert.Positive(t, r.Flowd, r.Scenario)
		switch {
		case strings.HasPrefix(r.Scenario, "produce-128-"), r.Scenario == "consume-128":
			require.NotNil(t, r.Ratio, r.Scenario)
			assert.Equal(t, "jetstream", r.BaselineName)
			assert.Positive(t, *r.Baseline)
			assert.InDelta(t, r.Flowd / *r.Baseline, *r.Ratio, 1e-9)
		case r.Scenario == "produce-1024-syncflush-p4":
			require.NotNil(t, r.Ratio, r.Scenario)
			assert.Equal(t, "disk-fsync", r.BaselineName)
			assert.Equal(t, durSyncFlush, r.Durability)
			assert.Equal(t, 4, r.Producers)
			assert.Positive(t, r.MessagesPerFsync, "the broker's fsyncs during the run are counted")
			require.Positive(t, r.BaselineBefore, "the disk's fsync rate is measured before the run")
			require.Positive(t, r.BaselineAfter, "and after it")
			assert.InDelta(t, 2/(1/r.BaselineBefore+1/r.BaselineAfter), *r.Baseline, 1e-6*(*r.Baseline))
		default:
			assert.Nil(t, r.Ratio, r.Scenario)
		}
		if r.Scenario == "e2e-delay-p99" {
			assert.Positive(t, r.MaxSendLateness, "how punctual the sends were is reported")
			assert.LessOrEqual(t, r.LateSends, 1.0)
			assert.Positive(t, r.SchedLatencyMax, "the runtime's scheduling latencies are reported")
			assert.LessOrEqual(t, r.SchedLatencyP99, r.SchedLatencyMax)
		}
		if strings.HasPrefix(r.Scenario, "e2e-delay-") {
			// Due no later than sent: the delay from the schedule is never the shorter.
			assert.GreaterOrEqual(t, r.FromSchedule, r.Flowd, r.Scenario)
		}
		if strings.HasPrefix(r.Scenario, "produce-128-") || r.Scenario == "consume-128" {
			assert.Positive(t, r.ProcessCPU, "%s: the one process's CPU per message", r.Scenario)
			assert.Positive(t, r.BaselineProcessCPU, "%s: and in JetStream's run", r.Scenario)
			assert.Zero(t, r.BrokerCPU, "%s: no broker process apart", r.Scenario)
		}
		if strings.HasPrefix(r.Scenario, "produce-") {
			assert.NotEmpty(t, r.Durability, r.Scenario)
			assert.NotEmpty(t, r.BaselineDurability, r.Scenario)
		}
	}
	assert.Equal(t, []string{"disk-write-128", "disk-fsync-1024", "produce-128-async", "produce-128-async-p2", "consume-128",
		"produce-128-batched", "produce-1024-syncflush-p4", "e2e-delay-p50", "e2e-delay-p99", "e2e-delay-p999"}, scenarios)

	var raw []map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(doc["results"], &raw))
	for _, r := range raw {
		for _, k := range []string{"scenario", "unit", "flowd", "baseline", "ratio"} {
			assert.Contains(t, r, k, "every result has %q, null when there is no baseline", k)
		}
	}
}

// A consume scenario picked alone still has something to read: the bench writes it first,
// unmeasured, and reports only what was asked for.
func TestBenchConsumeAloneWritesWhatItReads(t *testing.T) {
	var out, errs bytes.Buffer
	err := bench(context.Background(), []string{"--deploy", "in-process", "--json", "--data-dir", t.TempDir(), "--messages", "300", "--queues", "2",
		"--sizes", "256", "--scenarios", "consume-*"}, &out, &errs)
	require.NoError(t, err, errs.String())
	var report benchReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &report))
	require.Len(t, report.Results, 1)
	assert.Equal(t, "consume-256", report.Results[0].Scenario)
	require.NotNil(t, report.Results[0].Ratio)
}

func TestBenchScenarioSelection(t *testing.T) {
	var out, errs bytes.Buffer
	require.NoError(t, bench(context.Background(), []string{"--list", "--sizes", "128,1024", "--producers", "4"}, &out, &errs))
	names := strings.Fields(out.String())
	for _, want := range []string{"disk-write-128", "disk-write-1024", "disk-fsync-1024", "produce-128-sync", "produce-128-sync-p4",
		"produce-1024-async", "produce-1024-async-p4", "produce-1024-batched", "produce-1024-batched-p4", "consume-1024",
		"produce-1024-syncflush-p64", "e2e-delay"} {
		assert.Contains(t, names, want)
	}

	err := bench(context.Background(), []string{"--scenarios", "kafka-*"}, &out, &errs)
	require.ErrorContains(t, err, "matches none")
	err = bench(context.Background(), []string{"--scenarios", "produce-[", "--baseline", "none"}, &out, &errs)
	require.ErrorContains(t, err, "--scenarios")
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

// The delay scenario's pacer schedules send i at start + i×interval and counts the sends
// made more than 2 ms late, the catch-up bursts of a sender that did not run.
func TestBenchPacerCountsLateSends(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	p := &pacer{start: start, interval: 100 * time.Microsecond}
	assert.Equal(t, start.Add(250*time.Millisecond), p.due(2500))
	assert.Zero(t, p.lateShare(), "no sends yet")

	p.sent(0, start.Add(40*time.Microsecond))      // on time within a timer's resolution
	p.sent(1, p.due(1).Add(1900*time.Microsecond)) // a timer's late wake-up, not a stall
	p.sent(2, p.due(1).Add(3*time.Millisecond))    // a stall: sends 2 to 4 go at once
	p.sent(3, p.due(1).Add(3*time.Millisecond))
	p.sent(4, p.due(1).Add(3*time.Millisecond))
	assert.InDelta(t, 3.0/5, p.lateShare(), 1e-9)
	assert.Equal(t, 2900*time.Microsecond, p.maxLate, "send 2 was due at 200 µs and went at 3.1 ms")

	line := formatResult(benchResult{Scenario: "e2e-delay-p99", Unit: "ns", Flowd: 2e6, FromSchedule: 4.5e6,
		LateSends: p.lateShare(), MaxSendLateness: int64(p.maxLate)})
	assert.Contains(t, line, "(from schedule 4.5ms)")
	assert.Contains(t, line, "(60.0 % of sends >2 ms late, the latest by 2.9ms)")
}

// The scheduling latencies of the delay run are the difference of two readings of the
// runtime's histogram: its p99 and largest bucket, by their upper bounds.
func TestBenchRuntimeDelta(t *testing.T) {
	buckets := []float64{0, 1e-6, 1e-3, 1e-2, math.Inf(1)}
	a := runtimeSample{sched: &metrics.Float64Histogram{Buckets: buckets, Counts: []uint64{5, 5, 0, 0}}, gcs: 3}
	b := runtimeSample{sched: &metrics.Float64Histogram{Buckets: buckets, Counts: []uint64{5, 104, 1, 0}}, gcs: 7}
	d := a.until(b)
	assert.Equal(t, time.Millisecond, d.schedP99, "99 of the 100 new waits were under 1 ms")
	assert.Equal(t, 10*time.Millisecond, d.schedMax, "the longest was under 10 ms")
	assert.Equal(t, uint64(4), d.gcs)

	b.sched.Counts[3] = 2 // two waits in the last, unbounded bucket: its lower bound is said
	d = a.until(b)
	assert.Equal(t, 10*time.Millisecond, d.schedP99)
	assert.Equal(t, 10*time.Millisecond, d.schedMax)
	assert.Zero(t, a.until(a).schedMax, "nothing happened")
}

// Without --json the bench prints a header of the configuration and what each side
// acknowledges in, then one table row a result, in the order the scenarios ran.
func TestBenchTextTable(t *testing.T) {
	var out, errs bytes.Buffer
	err := bench(context.Background(), []string{"--deploy", "in-process", "--data-dir", t.TempDir(), "--messages", "200", "--baseline", "none",
		"--sizes", "128,1024", "--scenarios", "disk-*"}, &out, &errs)
	require.NoError(t, err, errs.String())
	assert.Empty(t, errs.String(), "no progress bar when stderr is not a terminal")
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	require.Len(t, lines, 6, out.String())
	assert.Regexp(t, `^flowd bench: 200 messages of \[128 1024\] B per scenario, 64 in flight per producer, 1 and 8 producers, 8 queues, name server 127\.0\.0\.1:\d+$`, lines[0])
	assert.Equal(t, "flowd acknowledges in the "+durAsync+"; JetStream in the "+durJetStream, lines[1])
	assert.Equal(t, "brokers and clients in this one process (--deploy in-process)", lines[2])
	for i, name := range []string{"disk-write-128", "disk-write-1024", "disk-fsync-1024"} {
		row := lines[3+i]
		assert.Regexp(t, `^  `+name+` +\d+ rec/s$`, row)
		assert.Len(t, row, 2+30+1+12+1+5, "the columns are aligned: %q", row)
	}
}
