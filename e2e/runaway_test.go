package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// badGuest is the test plugin that misbehaves on demand (its "mode" parameter).
const badGuest = "../plugins/testdata/badguest"

// get fetches path from the daemon's HTTP listener, giving up after a few seconds: a daemon
// that stalls must fail the test, not hang it.
func (d *daemon) get(path string) (int, string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + d.http + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// pluginFaults is the plugin's count of faults of one kind (trap, timeout, memory), from
// /metrics; -1 while it has none.
func (d *daemon) pluginFaults(plugin, fault string) (int, error) {
	code, body, err := d.get("/metrics")
	if err != nil || code != http.StatusOK {
		return 0, fmt.Errorf("/metrics: %d %v", code, err)
	}
	re := regexp.MustCompile(`(?m)^flowd_plugin_faults_total\{[^}]*fault="` + fault + `"[^}]*plugin="` + regexp.QuoteMeta(plugin) + `"[^}]*\} (\d+)$`)
	m := re.FindStringSubmatch(body)
	if m == nil {
		return -1, nil
	}
	return strconv.Atoi(m[1])
}

// A filter that loops forever on the messages it is given, deployed with the default limits
// (no call_timeout) and reloaded after every fault, so that it loops again on every pull:
// each call is stopped at the filter's default limit, /healthz answers throughout, another
// subscription is served, and SIGTERM ends the daemon while the filter loops.
func TestLoopingFilterCostsOnlyItsSubscription(t *testing.T) {
	bad := buildGoPlugin(t, badGuest)
	d := startDaemon(t, "A", t.TempDir(), "")
	d.ctl("topic", "create", "orders", "--queues", "1")
	d.ctl("topic", "create", "audit", "--queues", "1")
	man := writeJSON(t, "looper.json", map[string]any{"name": "looper", "kind": "filter", "version": "1.0.0", "abi": 1,
		"parameters": map[string]string{"mode": "loop"}, "policy": map[string]any{"on_fault": "reload", "restart_budget": 1000}})
	d.ctl("plugin", "deploy", bad, man, "--activate")
	d.produce("orders", []string{"--tag", "boom"}, "boom") // the guest loops on a batch mentioning "boom"

	looping := exec.Command(flowdBin, "consume", "orders", "--namesrv", d.namesrv, "--wasm", "looper", "--from", "first")
	require.NoError(t, looping.Start())
	t.Cleanup(func() {
		_ = looping.Process.Kill()
		_ = looping.Wait()
	})

	// Two timeouts: the filter was stopped once and, reloaded, loops again. /healthz answers
	// all along.
	for deadline := time.Now().Add(wait); ; time.Sleep(tick) {
		code, _, err := d.get("/healthz")
		require.NoError(t, err, "/healthz answers while the filter loops")
		require.Equal(t, http.StatusOK, code)
		n, err := d.pluginFaults("looper", "timeout")
		require.NoError(t, err)
		if n >= 2 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the looping filter is stopped at its time limit (timeouts so far: %d)", n)
	}

	d.produce("audit", nil, "a1", "a2", "a3")
	out, err := flowd("consume", "audit", "--namesrv", d.namesrv, "--from", "first", "-n", "3")
	require.NoError(t, err, "another subscription is served while the filter loops")
	require.Equal(t, []string{"a1", "a2", "a3"}, strings.Fields(out))
	code, _, err := d.get("/healthz")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)

	d.terminate()
}

// A plugin whose self-test loops forever, deployed over NATS with the default limits, is
// refused within the self-test's limit; the next deploy goes through and SIGTERM ends the
// daemon.
func TestLoopingSelfTestFailsTheDeployInTime(t *testing.T) {
	bad := buildGoPlugin(t, badGuest)
	d := startDaemon(t, "A", t.TempDir(), "")
	// The same module, behaving: compiled once, so that the deploy below times its self-test.
	calm := writeJSON(t, "calm.json", map[string]any{"name": "calm", "kind": "filter", "version": "1.0.0", "abi": 1})
	d.ctl("plugin", "deploy", bad, calm)
	man := writeJSON(t, "spinner.json", map[string]any{"name": "spinner", "kind": "filter", "version": "1.0.0", "abi": 1,
		"parameters": map[string]string{"mode": "spin"}})
	start := time.Now()
	_, err := flowd("plugin", "deploy", bad, man, "--nats", d.nats, "--cluster", cluster, "--timeout", "60s")
	require.Error(t, err)
	require.ErrorContains(t, err, "self-test failed")
	require.ErrorContains(t, err, "timed out")
	require.Less(t, time.Since(start), wait, "the deploy is answered within the self-test's limit")

	region := writeJSON(t, "region.json", map[string]any{"name": "region", "kind": "filter", "version": "1.0.0", "abi": 1,
		"parameters": map[string]string{"property": "region", "value": "eu"}})
	out := d.ctl("plugin", "deploy", "../examples/wasm/c-propfilter/propfilter.wasm", region, "--activate")
	require.Regexp(t, `region\s+1\.0\.0\s+filter\s+true`, out)
	d.terminate()
}
