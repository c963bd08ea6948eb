package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// flowdBin is the flowd binary TestMain builds; read-only once the tests run.
var flowdBin string

// wait bounds every condition the tests wait for; tick is how often it is checked.
const (
	wait = 30 * time.Second
	tick = 20 * time.Millisecond
)

// cluster is the cluster name of every daemon: the <cluster> token of the NATS subjects.
const cluster = "e2e"

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "flowd-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	flowdBin = filepath.Join(dir, "flowd")
	// No -race: the daemon's races are the package tests' business; here it must be quick.
	cmd := exec.Command("go", "build", "-o", flowdBin, "../cmd/flowd")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: build flowd:", err)
		return 1
	}
	return m.Run()
}

// syncBuffer is a bytes.Buffer the child's output and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// daemon is one `flowd serve` child process.
type daemon struct {
	t       *testing.T
	name    string // for failure messages: "A", "B"
	dir     string // holds flowd.yaml and data/
	cfgPath string
	cmd     *exec.Cmd
	logs    *syncBuffer
	exited  chan struct{} // closed once the process is reaped; err is set then
	err     error

	broker, namesrv, nats, http, grpc string
}

// baseConfig is the configuration every daemon gets: its data directory and port 0 for every
// listener (each daemon logs the addresses it bound).
func baseConfig(dir string) string {
	return fmt.Sprintf(`data_dir: %s
cluster: %s
listen: {broker: "127.0.0.1:0", namesrv: "127.0.0.1:0", grpc: "127.0.0.1:0"}
nats: {listen: "127.0.0.1:0"}
http: {listen: "127.0.0.1:0"}
`, filepath.Join(dir, "data"), cluster)
}

// servingLine is the daemon's "flowd serving" log line with the addresses it bound.
var servingLine = regexp.MustCompile(`msg="flowd serving".* broker=(\S+) namesrv=(\S+) nats=(\S+) http=(\S+) grpc=(\S+)`)

// startDaemon starts `flowd serve --config <dir>/flowd.yaml` with baseConfig and extra, and
// waits until it logs its addresses and answers /readyz. The process is killed (SIGKILL) when
// the test ends if it still runs; its log is printed when the test failed.
func startDaemon(t *testing.T, name, dir, extra string) *daemon {
	t.Helper()
	d := launch(t, name, dir, extra)
	d.awaitServing()
	return d
}

// launch starts `flowd serve --config <dir>/flowd.yaml` with baseConfig and extra, and the
// flags args, without waiting for it: awaitServing does. The process is killed (SIGKILL)
// when the test ends if it still runs; its log is printed when the test failed.
func launch(t *testing.T, name, dir, extra string, args ...string) *daemon {
	t.Helper()
	d := &daemon{t: t, name: name, dir: dir, cfgPath: filepath.Join(dir, "flowd.yaml"), logs: &syncBuffer{}, exited: make(chan struct{})}
	d.writeConfig(extra)
	d.cmd = exec.Command(flowdBin, append([]string{"serve", "--config", d.cfgPath}, args...)...)
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	require.NoError(t, d.cmd.Start())
	go func() {
		d.err = d.cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		d.kill()
		if t.Failed() {
			t.Logf("flowd %s (pid %d) log:\n%s", d.name, d.cmd.Process.Pid, d.logs.String())
		}
	})
	return d
}

// awaitServing waits until the daemon logs its addresses and answers /readyz. A daemon
// that runs itself again in place (a replica cutting a diverged log) logs its addresses once
// a run: the last serving line with no stop after it is the one that counts.
func (d *daemon) awaitServing() {
	t, name := d.t, d.name
	t.Helper()
	var m []string
	current := func() []string {
		logs := d.logs.String()
		all := servingLine.FindAllStringSubmatchIndex(logs, -1)
		if len(all) == 0 {
			return nil
		}
		last := all[len(all)-1]
		if strings.Contains(logs[last[1]:], `msg="flowd stopping"`) {
			return nil
		}
		var sub []string
		for i := 0; i < len(last); i += 2 {
			sub = append(sub, logs[last[i]:last[i+1]])
		}
		return sub
	}
	require.Eventually(t, func() bool {
		if d.gone() {
			return true
		}
		m = current()
		return m != nil
	}, wait, tick, "flowd %s logs its addresses", name)
	if m == nil {
		<-d.exited // it is gone: d.err is set
		t.Fatalf("flowd %s did not start (%v): %s", name, d.err, d.logs.String())
	}
	require.Eventually(t, func() bool {
		if m = current(); m == nil {
			return false
		}
		resp, err := http.Get("http://" + m[4] + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, wait, tick, "flowd %s is ready", name)
	d.broker, d.namesrv, d.nats, d.http, d.grpc = m[1], m[2], m[3], m[4], m[5]
}

// writeConfig writes the configuration file: baseConfig, then extra.
func (d *daemon) writeConfig(extra string) {
	d.t.Helper()
	require.NoError(d.t, os.WriteFile(d.cfgPath, []byte(baseConfig(d.dir)+extra), 0o600))
}

// reload writes the configuration file with extra and sends SIGHUP.
func (d *daemon) reload(extra string) {
	d.t.Helper()
	d.writeConfig(extra)
	require.NoError(d.t, d.cmd.Process.Signal(syscall.SIGHUP))
}

func (d *daemon) gone() bool {
	select {
	case <-d.exited:
		return true
	default:
		return false
	}
}

func (d *daemon) pid() int { return d.cmd.Process.Pid }

// kill ends the process with SIGKILL, as a crash would, and reaps it.
func (d *daemon) kill() {
	if !d.gone() {
		_ = d.cmd.Process.Kill()
	}
	<-d.exited
}

// terminate sends SIGTERM and requires a clean exit within wait.
func (d *daemon) terminate() {
	d.t.Helper()
	require.NoError(d.t, d.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-d.exited:
	case <-time.After(wait):
		d.t.Fatalf("flowd %s did not stop on SIGTERM", d.name)
	}
	require.NoError(d.t, d.err, "flowd %s exits 0 on SIGTERM", d.name)
}

// flowd runs the binary with args and returns its standard output; a non-zero exit is an
// error carrying its standard error.
func flowd(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	cmd := exec.CommandContext(ctx, flowdBin, args...)
	var out, errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("flowd %s: %w: %s", strings.Join(args, " "), err, errs.String())
	}
	return out.String(), nil
}

// ctl runs a client command against d's control plane and requires it to succeed.
func (d *daemon) ctl(args ...string) string {
	d.t.Helper()
	out, err := flowd(append(args, "--nats", d.nats, "--cluster", cluster)...)
	require.NoError(d.t, err)
	return out
}

// ctlJSON runs a client command with --json and decodes the daemon's reply into out.
func (d *daemon) ctlJSON(out any, args ...string) error {
	raw, err := flowd(append(args, "--nats", d.nats, "--cluster", cluster, "--json")...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(raw), out); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, raw)
	}
	return nil
}

// produce sends each body as one message to topic with `flowd produce`, with the extra
// flags (properties, tag, keys).
func (d *daemon) produce(topic string, flags []string, bodies ...string) {
	d.t.Helper()
	args := append([]string{"produce", topic, "--namesrv", d.namesrv, "-q"}, flags...)
	_, err := flowd(append(args, bodies...)...)
	require.NoError(d.t, err)
}

// produceFile sends each line of lines as one message to topic with `flowd produce --file`.
func (d *daemon) produceFile(topic string, flags []string, lines []string) {
	d.t.Helper()
	f, err := os.CreateTemp(d.t.TempDir(), "messages-*.txt")
	require.NoError(d.t, err)
	_, err = f.WriteString(strings.Join(lines, "\n") + "\n")
	require.NoError(d.t, errors.Join(err, f.Close()))
	_, err = flowd(append([]string{"produce", topic, "--namesrv", d.namesrv, "-q", "--file", f.Name()}, flags...)...)
	require.NoError(d.t, err)
}
