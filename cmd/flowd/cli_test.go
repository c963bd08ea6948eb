package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/config"
	"github.com/flowd-io/flowd/control"
)

// served is a flowd serve running in the test process.
type served struct {
	logs            *syncBuffer
	broker, namesrv string
	nats            string
	dataDir         string
	stop            func()
}

// startServed runs `flowd serve --config FILE` on free ports with the given extra YAML
// (appended after the nats section's listen key) and waits until it logs its addresses.
func startServed(t *testing.T, extraYAML string, args ...string) *served {
	t.Helper()
	return startServedIn(t, t.TempDir(), extraYAML, args...)
}

// startServedIn is startServed with the configuration file and the data directory (data)
// in dir, so that a test can serve the same data twice.
func startServedIn(t *testing.T, dir, extraYAML string, args ...string) *served {
	t.Helper()
	cfgFile := filepath.Join(dir, "flowd.yaml")
	yaml := fmt.Sprintf("data_dir: %s\nlisten:\n  broker: 127.0.0.1:0\n  namesrv: 127.0.0.1:0\n  grpc: 127.0.0.1:0\nhttp:\n  listen: 127.0.0.1:0\nnats:\n  listen: 127.0.0.1:0\n%s", filepath.Join(dir, "data"), extraYAML)
	require.NoError(t, os.WriteFile(cfgFile, []byte(yaml), 0o600))
	ctx, cancel := context.WithCancel(context.Background())
	d := &served{logs: &syncBuffer{}, dataDir: filepath.Join(dir, "data")}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"serve", "--config", cfgFile}, args...), d.logs, d.logs)
	}()
	// Text or JSON log lines.
	re := regexp.MustCompile(`broker"?[=:]"?(127\.0\.0\.1:\d+)"?[ ,]"?namesrv"?[=:]"?(127\.0\.0\.1:\d+)"?[ ,]"?nats"?[=:]"?(nats://127\.0\.0\.1:\d+)`)
	require.Eventually(t, func() bool {
		select {
		case err := <-done:
			done <- err
			return true
		default:
		}
		return re.MatchString(d.logs.String())
	}, 15*time.Second, 10*time.Millisecond, "flowd logs its addresses: %s", d.logs.String())
	m := re.FindStringSubmatch(d.logs.String())
	require.NotNil(t, m, "flowd did not start: %s", d.logs.String())
	d.broker, d.namesrv, d.nats = m[1], m[2], m[3]
	d.stop = func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Fatal("flowd did not stop")
		}
	}
	t.Cleanup(func() {
		if ctx.Err() == nil {
			d.stop()
		}
	})
	return d
}

// cli runs one flowd command line and returns its standard output.
func cli(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	root := newRoot(nil, nil)
	var out, errs bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errs)
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(args)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := root.ExecuteContext(ctx)
	return out.String(), err
}

func TestCLIAgainstARunningDaemon(t *testing.T) {
	d := startServed(t, "cluster: e2e\nlog:\n  format: json\n")
	assert.Contains(t, d.logs.String(), `"msg":"flowd serving"`, "log.format json from the file")
	ctl := []string{"--nats", d.nats, "--cluster", "e2e"}

	out, err := cli(t, "", append([]string{"topic", "create", "orders", "--queues", "2"}, ctl...)...)
	require.NoError(t, err)
	assert.Regexp(t, `orders\s+2\s+2\s+rw\s+false\s+user`, out)

	out, err = cli(t, "", append([]string{"topic", "list"}, ctl...)...)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^TOPIC\s+READ\s+WRITE`, out)
	assert.Regexp(t, `(?m)^orders\s+2\s+2`, out)

	out, err = cli(t, "", "produce", "orders", "--namesrv", d.namesrv, "--keys", "k1", "--tag", "red")
	require.NoError(t, err)
	require.Empty(t, out, "no input, no message")
	out, err = cli(t, "one\ntwo\nthree\n", "produce", "orders", "--namesrv", d.namesrv, "--keys", "k1", "--tag", "red")
	require.NoError(t, err)
	var ids, offsetIDs []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		require.Len(t, f, 2, "a message id and an offset message id per message: %q", out)
		ids, offsetIDs = append(ids, f[0]), append(offsetIDs, f[1])
	}
	require.Len(t, ids, 3, "one message per line of input: %q", out)

	// The consume queues are written behind the commit log: wait until they show all three.
	var desc control.TopicDescribeReply
	require.Eventually(t, func() bool {
		out, err = cli(t, "", append([]string{"topic", "describe", "orders", "--json"}, ctl...)...)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal([]byte(out), &desc), out)
		return desc.Messages == 3
	}, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, "e2e", desc.Cluster)
	out, err = cli(t, "", append([]string{"topic", "describe", "orders"}, ctl...)...)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^messages\s+3$`, out)
	assert.Regexp(t, `(?m)^QUEUE\s+MIN OFFSET\s+MAX OFFSET$`, out)

	out, err = cli(t, "", "consume", "orders", "--namesrv", d.namesrv, "--from", "first", "--max", "3", "--group", "tail", "--tag", "red")
	require.NoError(t, err)
	lines := strings.Fields(out)
	assert.ElementsMatch(t, []string{"one", "two", "three"}, lines)

	out, err = cli(t, "", "consume", "orders", "--namesrv", d.namesrv, "--from", "first", "--max", "1", "--output", "json", "--sql", "TAGS = 'red'")
	require.NoError(t, err)
	var msg consumedMessage
	require.NoError(t, json.Unmarshal([]byte(out), &msg), out)
	assert.Equal(t, "orders", msg.Topic)
	assert.Contains(t, ids, msg.MsgID)

	out, err = cli(t, "", append([]string{"group", "describe", "tail"}, ctl...)...)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^TOPIC\s+QUEUE\s+COMMITTED\s+MAX OFFSET\s+LAG\s+OWNER$`, out)

	out, err = cli(t, "", append([]string{"group", "list"}, ctl...)...)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^GROUP\s+CONFIGURED\s+MEMBERS\s+LAG\s+TOPICS`, out)
	assert.Regexp(t, `(?m)^tail\s+\S+\s+\d+\s+0\s+\S*orders`, out, "the tailing group committed all three")

	out, err = cli(t, "", append([]string{"message", "get", offsetIDs[0]}, ctl...)...)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^topic\s+orders$`, out)
	assert.Regexp(t, `(?m)^body\s+"one"$`, out)

	out, err = cli(t, "", append([]string{"message", "query", "orders", "k1"}, ctl...)...)
	require.NoError(t, err)
	assert.Equal(t, 4, strings.Count(out, "\n"), "a header and three messages: %s", out)

	_, err = cli(t, "", append([]string{"topic", "describe", "nope"}, ctl...)...)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "404")
}

func TestSecondDaemonOnTheSameDataDirIsRefused(t *testing.T) {
	d := startServed(t, "")
	var logs bytes.Buffer
	// No command means serve, with serve's flags.
	err := run(context.Background(), []string{"--data-dir", d.dataDir, "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
		"--namesrv-listen", "off", "--grpc-listen", "off", "--nats=false"}, &logs, &logs)
	require.ErrorIs(t, err, errDataDirInUse)
	assert.Contains(t, err.Error(), "locked by another flowd")
	assert.Contains(t, err.Error(), d.dataDir)
}

func TestClientCommandWithoutDaemonSaysSo(t *testing.T) {
	// A NATS URL nothing listens on: the port of a listener just closed.
	d := startServed(t, "")
	url := d.nats
	d.stop()
	_, err := cli(t, "", "topic", "list", "--nats", url, "--timeout", "2s")
	require.ErrorIs(t, err, errNoDaemon)
	assert.Contains(t, err.Error(), "no flowd answers on "+url+": is `flowd serve` running?")
}

func TestConfigDefaultsAndValidate(t *testing.T) {
	out, err := cli(t, "", "config", "defaults")
	require.NoError(t, err)
	cfg, err := config.Decode([]byte(out))
	require.NoError(t, err)
	assert.Equal(t, config.Default(), cfg)

	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	require.NoError(t, os.WriteFile(good, []byte(out), 0o600))
	var stdout bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"config", "validate", good}, &stdout, &stdout))
	assert.Contains(t, stdout.String(), "ok")

	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("cluster: x\nlimits:\n  max_grops: 3\nlog:\n  level: loud\n"), 0o600))
	err = run(context.Background(), []string{"config", "validate", bad}, &stdout, &stdout)
	require.ErrorIs(t, err, config.ErrInvalid)
	assert.Contains(t, err.Error(), "line 3")
	assert.Contains(t, err.Error(), "max_grops")

	bad2 := filepath.Join(dir, "bad2.yaml")
	require.NoError(t, os.WriteFile(bad2, []byte("log:\n  level: loud\n"), 0o600))
	err = run(context.Background(), []string{"config", "validate", bad2}, &stdout, &stdout)
	require.ErrorIs(t, err, config.ErrInvalid)
	assert.Contains(t, err.Error(), "log.level")
}

// Flags beat FLOWD_* variables, which beat the file, which beats the defaults.
func TestServeSettingPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "flowd.yaml")
	require.NoError(t, os.WriteFile(file, []byte("cluster: fromfile\nbroker_name: fromfile\ndata_dir: fromfile\n"), 0o600))
	t.Setenv("FLOWD_BROKER_NAME", "fromenv")
	t.Setenv("FLOWD_DATA_DIR", "fromenv")
	serve := &cobra.Command{Use: "serve"}
	sv := &serveCmd{}
	sv.addFlags(serve)
	require.NoError(t, serve.Flags().Parse([]string{"--config", file, "--data-dir", "fromflag", "--nats=false"}))
	cfg, err := sv.load()
	require.NoError(t, err)
	assert.Equal(t, "fromfile", cfg.Cluster)
	assert.Equal(t, "fromenv", cfg.BrokerName)
	assert.Equal(t, "fromflag", cfg.DataDir)
	assert.False(t, cfg.NATS.Enabled)
	assert.Equal(t, config.Default().Listen, cfg.Listen)
}

// The single-dash long flags serve and bench took before still work.
func TestSingleDashServeFlags(t *testing.T) {
	root := newRoot(nil, nil)
	assert.Equal(t, []string{"serve", "--data-dir", "d", "--nats=false", "-c", "f", "--", "-x"},
		longFlags(root, []string{"serve", "-data-dir", "d", "-nats=false", "-c", "f", "--", "-x"}))
	assert.Equal(t, []string{"--listen", "a"}, longFlags(root, []string{"-listen", "a"}))
	assert.Equal(t, []string{"bench", "--size", "3", "-h"}, longFlags(root, []string{"bench", "-size", "3", "-h"}), "bench's Go-flag spelling")
	assert.Equal(t, []string{"topic", "create", "-queues"}, longFlags(root, []string{"topic", "create", "-queues"}), "only serve's and bench's")
	var out bytes.Buffer
	err := run(context.Background(), []string{"serve", "-log-level", "loud"}, &out, &out)
	require.ErrorContains(t, err, `(--log-level): "loud"`)
}

// SIGHUP applies a new log level and list of disabled commands, and reports a change that
// needs a restart.
func TestServeReloadsOnSIGHUP(t *testing.T) {
	d := startServed(t, "log:\n  level: info\n", "--nats-disable", "topic.list")
	require.NotContains(t, d.logs.String(), "level=DEBUG")
	_, err := cli(t, "", "topic", "list", "--nats", d.nats)
	require.ErrorContains(t, err, "403")

	cfgFile := filepath.Join(filepath.Dir(d.dataDir), "flowd.yaml")
	raw, err := os.ReadFile(cfgFile)
	require.NoError(t, err)
	updated := strings.Replace(string(raw), "level: info", "level: debug", 1) + "limits:\n  max_groups: 5\n"
	require.NoError(t, os.WriteFile(cfgFile, []byte(updated), 0o600))
	// The flag stays in force over the file: a reload re-reads the file under the same flags.
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool {
		return strings.Contains(d.logs.String(), "reload: applied")
	}, 10*time.Second, 10*time.Millisecond, d.logs.String())
	assert.Contains(t, d.logs.String(), "settings=limits.max_groups")
	assert.Contains(t, d.logs.String(), "settings=log.level")
	_, err = cli(t, "", "topic", "list", "--nats", d.nats)
	require.ErrorContains(t, err, "403", "--nats-disable still applies")
	d.stop()
	assert.Contains(t, d.logs.String(), "level=DEBUG", "the new level is in force")
}

func TestServeReloadsDisabledCommands(t *testing.T) {
	// The extra YAML continues the nats section startServed writes last.
	d := startServed(t, "  disabled_commands: [topic.list]\n")
	_, err := cli(t, "", "topic", "list", "--nats", d.nats)
	require.ErrorContains(t, err, "403")
	cfgFile := filepath.Join(filepath.Dir(d.dataDir), "flowd.yaml")
	raw, err := os.ReadFile(cfgFile)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(cfgFile, []byte(strings.Replace(string(raw), "[topic.list]", "[topic.delete]", 1)), 0o600))
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool {
		return strings.Contains(d.logs.String(), "settings=nats.disabled_commands")
	}, 10*time.Second, 10*time.Millisecond, d.logs.String())
	out, err := cli(t, "", "topic", "list", "--nats", d.nats)
	require.NoError(t, err)
	assert.Contains(t, out, "TOPIC")
	_, err = cli(t, "", "topic", "delete", "x", "--nats", d.nats)
	require.ErrorContains(t, err, "403")
}

// Every command answers --help, and completion scripts are generated.
func TestHelpAndCompletion(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"serve", "--help"}, {"topic", "create", "--help"}, {"group", "reset", "--help"},
		{"message", "query", "--help"}, {"plugin", "deploy", "--help"}, {"produce", "--help"}, {"consume", "--help"},
		{"config", "validate", "--help"}, {"bench", "--help"}, {"help", "topic"}} {
		var out bytes.Buffer
		require.NoError(t, run(context.Background(), args, &out, &out), "%v", args)
		assert.Contains(t, strings.ToLower(out.String()), "usage", "%v", args)
	}
	out, err := cli(t, "", "completion", "bash")
	require.NoError(t, err)
	assert.Contains(t, out, "bash completion")
}

func TestPluginCommandsDeployActivateListRemove(t *testing.T) {
	d := startServed(t, "")
	dir := t.TempDir()
	mod := filepath.Join(dir, "propfilter.wasm")
	require.NoError(t, os.WriteFile(mod, propfilter(t), 0o600))
	manifest := func(version string) string {
		p := filepath.Join(dir, version+".json")
		require.NoError(t, os.WriteFile(p, []byte(`{"name":"region","kind":"filter","version":"`+version+
			`","abi":1,"parameters":{"property":"region","value":"eu"}}`), 0o600))
		return p
	}
	ctl := []string{"--nats", d.nats}
	out, err := cli(t, "", append([]string{"plugin", "deploy", mod, manifest("1.0.0"), "--activate"}, ctl...)...)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^region\s+1\.0\.0\s+filter\s+true$`, out)
	_, err = cli(t, "", append([]string{"plugin", "deploy", mod, manifest("2.0.0")}, ctl...)...)
	require.NoError(t, err)
	out, err = cli(t, "", append([]string{"plugin", "activate", "region", "2.0.0"}, ctl...)...)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^region\s+2\.0\.0\s+filter\s+true$`, out)
	out, err = cli(t, "", append([]string{"plugin", "remove", "region", "1.0.0"}, ctl...)...)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^region\s+1\.0\.0\s+filter\s+false$`, out)
	out, err = cli(t, "", append([]string{"plugin", "list"}, ctl...)...)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^NAME\s+VERSION\s+KIND\s+ACTIVE\nregion\s+2\.0\.0\s+filter\s+true\n$`, out)
	_, err = cli(t, "", append([]string{"plugin", "remove", "region", "2.0.0"}, ctl...)...)
	require.ErrorContains(t, err, "409", "the active version cannot be removed")
}

// produce --file reads one message per line, with properties; consume --output json shows them.
func TestProduceFromAFileWithProperties(t *testing.T) {
	d := startServed(t, "")
	file := filepath.Join(t.TempDir(), "in.txt")
	require.NoError(t, os.WriteFile(file, []byte("a\n\nb\n"), 0o600))
	out, err := cli(t, "", "produce", "lines", "--namesrv", d.namesrv, "--file", file, "-p", "region=eu", "-p", "n=1", "--quiet")
	require.NoError(t, err)
	assert.Empty(t, out)
	_, err = cli(t, "", "produce", "lines", "--namesrv", d.namesrv, "-p", "broken")
	require.ErrorContains(t, err, `--property "broken"`)
	out, err = cli(t, "", "consume", "lines", "--namesrv", d.namesrv, "--from", "first", "--max", "2", "-o", "json", "--sql", "region = 'eu'")
	require.NoError(t, err)
	var bodies []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var m consumedMessage
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		assert.Equal(t, "eu", m.Properties["region"])
		bodies = append(bodies, m.Body)
	}
	assert.ElementsMatch(t, []string{"a", "b"}, bodies, "the empty line is skipped")
}

// flowd serve answers Prometheus scrapes and health checks on its HTTP listener, with the
// broker's traffic counted.
func TestServeServesMetricsAndHealth(t *testing.T) {
	d := startServed(t, "")
	m := regexp.MustCompile(`http"?[=:]"?(127\.0\.0\.1:\d+)`).FindStringSubmatch(d.logs.String())
	require.NotNil(t, m, "flowd logs its HTTP address: %s", d.logs.String())
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + m[1] + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	code, _ := get("/healthz")
	assert.Equal(t, http.StatusOK, code)
	code, body := get("/readyz")
	assert.Equal(t, http.StatusOK, code, body)

	_, err := cli(t, "one\ntwo\n", "produce", "metered", "--namesrv", d.namesrv)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, body := get("/metrics")
		return strings.Contains(body, `flowd_messages_in_total{topic="metered"} 2`)
	}, 10*time.Second, 20*time.Millisecond, "the two sends are counted")
}

// consume --wasm subscribes through a Wasm filter deployed on the daemon (expression type
// WASM): only what the filter keeps is printed, and the daemon's /metrics times its calls.
func TestConsumeThroughAWasmFilter(t *testing.T) {
	d := startServed(t, "", "--flush", "sync") // every send is flushed: the flush histogram counts
	dir := t.TempDir()
	mod := filepath.Join(dir, "propfilter.wasm")
	require.NoError(t, os.WriteFile(mod, propfilter(t), 0o600))
	manifest := filepath.Join(dir, "region.json")
	require.NoError(t, os.WriteFile(manifest, []byte(`{"name":"region","kind":"filter","version":"1.0.0","abi":1,"parameters":{"property":"region","value":"eu"}}`), 0o600))
	_, err := cli(t, "", "plugin", "deploy", mod, manifest, "--activate", "--nats", d.nats)
	require.NoError(t, err)
	for _, region := range []string{"us", "eu", "us", "eu", "ap"} {
		_, err := cli(t, "", "produce", "regions", region+"-order", "-p", "region="+region, "--namesrv", d.namesrv, "--quiet")
		require.NoError(t, err)
	}
	for _, sel := range []string{"region", "region@1.0.0"} {
		out, err := cli(t, "", "consume", "regions", "--namesrv", d.namesrv, "--from", "first", "--max", "2", "--wasm", sel)
		require.NoError(t, err, sel)
		assert.Equal(t, "eu-order\neu-order\n", out, sel)
	}
	_, err = cli(t, "", "consume", "regions", "--namesrv", d.namesrv, "--wasm", "region", "--sql", "a = 1")
	require.ErrorContains(t, err, "cannot be combined")

	m := regexp.MustCompile(`http"?[=:]"?(127\.0\.0\.1:\d+)`).FindStringSubmatch(d.logs.String())
	require.NotNil(t, m, "flowd logs its HTTP address: %s", d.logs.String())
	resp, err := http.Get("http://" + m[1] + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^flowd_plugin_call_duration_seconds_count\{plugin="region"\} [1-9]`, string(body))
	assert.Regexp(t, `(?m)^flowd_store_flush_duration_seconds_count [1-9]`, string(body))
}

// flowd events prints the daemon's events as they happen, narrowed by kind.
func TestEventsPrintsWhatHappens(t *testing.T) {
	d := startServed(t, "")
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := cli(t, "", "events", "topic", "--max", "1", "--nats", d.nats)
		done <- result{out, err}
	}()
	// The subscription starts at some point: create topics until one is seen.
	var got result
	n := 0
	require.Eventually(t, func() bool {
		select {
		case got = <-done:
			return true
		default:
		}
		n++
		_, err := cli(t, "", "topic", "create", fmt.Sprintf("watched-%d", n), "--nats", d.nats)
		assert.NoError(t, err)
		return false
	}, wait, 50*time.Millisecond)
	require.NoError(t, got.err)
	assert.Regexp(t, `^flowd\.evt\.local\.topic\.created \{.*"topic":"watched-\d+".*\}\n$`, got.out)
}

// produce draws its progress bar on standard error only when that is a terminal, or with
// --progress: a large file into a pipe or a buffer draws nothing; --progress draws for
// standard input too, whose size is not known.
func TestProduceProgressBar(t *testing.T) {
	d := startServed(t, "")
	line := strings.Repeat("x", 100<<10)
	big := strings.Repeat(line+"\n", 12) // 1.2 MiB: past the size that draws a bar
	file := filepath.Join(t.TempDir(), "big.txt")
	require.NoError(t, os.WriteFile(file, []byte(big), 0o600))
	run := func(stdin string, args ...string) (string, string) {
		t.Helper()
		root := newRoot(nil, nil)
		var out, errs bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&errs)
		root.SetIn(strings.NewReader(stdin))
		root.SetArgs(append([]string{"produce", "bulk", "--namesrv", d.namesrv, "--quiet"}, args...))
		require.NoError(t, root.ExecuteContext(context.Background()))
		return out.String(), errs.String()
	}
	_, stderr := run("", "--file", file)
	assert.Empty(t, stderr, "standard error is not a terminal: no bar")
	_, stderr = run("", "--file", file, "--progress")
	assert.Contains(t, stderr, "produce bulk")
	assert.Regexp(t, `\d+% \|`, stderr, "a bar with the share of the file sent (how often it is redrawn is throttled)")
	_, stderr = run(big, "--progress")
	assert.Contains(t, stderr, "produce bulk", "standard input, size unknown")
	_, stderr = run("a\nb\n")
	assert.Empty(t, stderr)
}

// config validate reports every mistake of a file at once, each with its line and key path,
// an unknown key with the key meant, and exits non-zero.
func TestConfigValidateReportsEveryMistake(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte(`listen:
  brokr: 127.0.0.1:10911
log:
  level: loud
pipelines:
  - name: eu
    topics: [orders]
    sink: {type: topic}
  - name: us
    topics: [orders]
    selector: {type: SQL92}
    sink: {type: nats, subjet: us}
`), 0o600))
	var out syncBuffer
	err := run(context.Background(), []string{"config", "validate", bad}, &out, &out)
	require.ErrorIs(t, err, config.ErrInvalid)
	assert.Equal(t, "config "+bad+": invalid configuration:\n"+
		"  line 2: listen.brokr: unknown key; did you mean \"broker\"?\n"+
		"  line 4: log.level: \"loud\" is not debug, info, warn or error\n"+
		"  line 8: pipelines[0].sink.topic: \"\" is not a valid topic name\n"+
		"  line 11: pipelines[1].selector.expression: required for type SQL92\n"+
		"  line 12: pipelines[1].sink.subjet: unknown key; did you mean \"subject\"?\n"+
		"  line 12: pipelines[1].sink.subject: \"\" is not a valid NATS subject: empty", err.Error())
	assert.NotContains(t, out.String(), "ok")
}
