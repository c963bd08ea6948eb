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

// runGRPCBench runs the gRPC scenarios tiny with args besides and returns the report.
func runGRPCBench(t *testing.T, args ...string) benchReport {
	t.Helper()
	var stdout, errs bytes.Buffer
	args = append([]string{"--json", "--data-dir", t.TempDir(), "--messages", "300", "--producers", "2", "--queues", "2",
		"--scenarios", "grpc-send-1024*,pop-1024,pop-floor-1024,pop-remoting-1024*"}, args...)
	require.NoError(t, bench(context.Background(), args, &stdout, &errs), errs.String())
	var report benchReport
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &report), "stdout is one JSON document: %s", stdout.String())
	var names []string
	for _, r := range report.Results {
		names = append(names, r.Scenario)
		assert.Positive(t, r.Flowd, r.Scenario)
	}
	require.Equal(t, []string{"grpc-send-1024", "grpc-send-1024-p50", "grpc-send-1024-p99", "pop-1024", "pop-floor-1024", "pop-remoting-1024", "pop-remoting-1024-r4"}, names)
	send, p50, p99, pop, floor, rpop, rpop4 := report.Results[0], report.Results[1], report.Results[2], report.Results[3], report.Results[4], report.Results[5], report.Results[6]
	require.NotNil(t, send.Ratio)
	assert.Equal(t, "remoting", send.BaselineName, "gRPC sends are compared with remoting sends")
	assert.Equal(t, 2, send.Producers)
	assert.Equal(t, "ns", p50.Unit)
	assert.LessOrEqual(t, p50.Flowd, p99.Flowd)
	require.NotNil(t, pop.Ratio)
	assert.Equal(t, "jetstream", pop.BaselineName, "pop is compared with JetStream's fetch + explicit ack")
	assert.InDelta(t, pop.Flowd / *pop.Baseline, *pop.Ratio, 1e-9)
	require.NotNil(t, floor.Ratio)
	assert.Equal(t, "jetstream", floor.BaselineName, "the floor has pop-1024's baseline")
	require.NotNil(t, rpop.Ratio)
	assert.Equal(t, "jetstream", rpop.BaselineName, "remoting pop has pop-1024's baseline")
	require.NotNil(t, rpop4.Ratio)
	assert.Equal(t, "jetstream", rpop4.BaselineName, "four receive loops against four JetStream fetch loops")
	return report
}

// The gRPC scenarios in one process: the broker's RocketMQ 5 endpoint on a free port, the
// generated client sending and receiving through it.
func TestBenchGRPCScenariosInProcess(t *testing.T) {
	report := runGRPCBench(t, "--deploy", "in-process")
	for _, r := range []benchResult{report.Results[0], report.Results[3], report.Results[4], report.Results[5], report.Results[6]} {
		assert.Positive(t, r.ProcessCPU, r.Scenario)
		assert.Positive(t, r.BaselineProcessCPU, r.Scenario)
	}
}

// The gRPC scenarios against a `flowd serve` child whose gRPC listener is on a free port,
// with each process's cost per message, and their lines in the text output.
func TestBenchGRPCScenariosSeparate(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "flowd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "build flowd: %s", out)
	report := runGRPCBench(t, "--deploy", "separate", "--flowd-binary", bin)
	for _, r := range []benchResult{report.Results[0], report.Results[3], report.Results[4], report.Results[5], report.Results[6]} {
		assert.Positive(t, r.ClientCPU, r.Scenario)
		assert.Positive(t, r.BrokerCPU, "%s: the broker's (the floor's) process", r.Scenario)
		assert.Positive(t, r.BaselineClientCPU, r.Scenario)
		assert.Positive(t, r.BrokerSyscalls, r.Scenario)
	}
	assert.Positive(t, report.Results[3].BaselineServerCPU, "the JetStream process")
	line := formatResult(report.Results[0])
	assert.Contains(t, line, "remoting:", "the baseline's costs are labelled with its name")
	assert.False(t, strings.Contains(line, "jetstream"), line)
}

func TestBenchGRPCScenariosListed(t *testing.T) {
	var out, errs bytes.Buffer
	require.NoError(t, bench(context.Background(), []string{"--list", "--scenarios", "grpc-*,pop-*"}, &out, &errs))
	assert.Equal(t, "grpc-send-1024\npop-1024\npop-floor-1024\npop-remoting-1024\npop-remoting-1024-r4\n", out.String())
	out.Reset()
	require.NoError(t, bench(context.Background(), []string{"--list", "--scenarios", "grpc-send-1024-p99"}, &out, &errs))
	assert.Equal(t, "grpc-send-1024\n", out.String(), "a result's name selects its scenario")
}

// Against a broker named by --namesrv the bench knows no gRPC endpoint: no gRPC scenario.
func TestBenchGRPCScenariosNeedTheBenchsBroker(t *testing.T) {
	var out, errs bytes.Buffer
	require.NoError(t, bench(context.Background(), []string{"--list", "--namesrv", "127.0.0.1:9"}, &out, &errs))
	assert.NotContains(t, out.String(), "grpc-send")
	assert.NotContains(t, out.String(), "pop-1024")
	assert.Contains(t, out.String(), "e2e-delay")
}
