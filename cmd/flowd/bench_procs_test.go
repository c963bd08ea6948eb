package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A separate run puts flowd's broker in a `flowd serve` child and JetStream in a
// `flowd bench-jetstream-server` child, the clients in the bench's process, and reports for
// each throughput scenario what each of the four processes spent per message: CPU time and
// context switches, and the ratio of the totals.
func TestBenchSeparateProcessesReportEachProcessCost(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "flowd")
	build := exec.Command("go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build flowd: %s", out)

	var stdout, errs bytes.Buffer
	err = bench(context.Background(), []string{"--deploy", "separate", "--flowd-binary", bin, "--data-dir", t.TempDir(), "--json",
		"--messages", "2000", "--inflight", "32", "--queues", "2", "--sizes", "1024", "--sync-producers", "4",
		"--scenarios", "produce-1024-async,consume-1024,produce-1024-syncflush-*"}, &stdout, &errs)
	require.NoError(t, err, errs.String())
	var report benchReport
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &report), "stdout is one JSON document: %s", stdout.String())
	assert.Equal(t, deploySeparate, report.Deploy)
	require.Len(t, report.Results, 3)
	for _, r := range report.Results {
		assert.Positive(t, r.Flowd, r.Scenario)
		assert.Positive(t, r.ClientCPU, "%s: the clients' process", r.Scenario)
		assert.Positive(t, r.BrokerCPU, "%s: the broker's process", r.Scenario)
		assert.Positive(t, r.ClientCtxSwitches+r.BrokerCtxSwitches, r.Scenario)
		assert.Positive(t, r.ClientSyscalls, "%s: the clients write their requests", r.Scenario)
		assert.Positive(t, r.BrokerSyscalls, "%s: the broker reads them", r.Scenario)
		assert.Zero(t, r.ProcessCPU, "%s: no one-process figure in a separate run", r.Scenario)
		if r.Scenario == "produce-1024-syncflush-p4" {
			assert.Positive(t, r.MessagesPerFsync, "the child's fsyncs are read through its control plane")
			assert.Zero(t, r.BaselineServerCPU, "the disk baseline has no server")
			continue
		}
		assert.Positive(t, r.BaselineClientCPU, "%s: the clients' process in the JetStream run", r.Scenario)
		assert.Positive(t, r.BaselineServerCPU, "%s: the JetStream process", r.Scenario)
		assert.InDelta(t, (r.ClientCPU+r.BrokerCPU)/(r.BaselineClientCPU+r.BaselineServerCPU), r.CPURatio, 1e-9)
	}
}

// readProc counts the CPU time a process spends: a busy loop in this one shows up, and
// another process's counts are read by its pid.
func TestReadProcCountsCPUTime(t *testing.T) {
	before, err := readProc(0)
	require.NoError(t, err)
	x := 0
	for i := range 50_000_000 {
		x ^= i
	}
	runtime.KeepAlive(x)
	after, err := readProc(0)
	require.NoError(t, err)
	assert.Greater(t, after.sub(before).cpu.Nanoseconds(), int64(1_000_000), "a busy loop of 50 M rounds takes well over a millisecond")
	byPid, err := readProc(os.Getpid())
	require.NoError(t, err)
	assert.GreaterOrEqual(t, byPid.cpu, after.cpu)
	_, err = readProc(1 << 30)
	assert.Error(t, err, "no such process")
}
