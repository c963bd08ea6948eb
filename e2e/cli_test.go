package e2e

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
)

// tail starts `flowd consume topic` with flags as a child process and waits until it reads:
// it sends "live" messages to topic until one is printed. exit returns its exit error, once
// it exited.
func (d *daemon) tail(topic string, flags ...string) (cmd *exec.Cmd, exit func() error) {
	d.t.Helper()
	out, errs := &syncBuffer{}, &syncBuffer{}
	cmd = exec.Command(flowdBin, append([]string{"consume", topic, "--namesrv", d.namesrv}, flags...)...)
	cmd.Stdout, cmd.Stderr = out, errs
	require.NoError(d.t, cmd.Start())
	exited := make(chan struct{})
	var err error
	go func() {
		err = cmd.Wait()
		close(exited)
	}()
	d.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	require.Eventually(d.t, func() bool {
		d.produce(topic, nil, "live")
		return strings.Contains(out.String(), "live")
	}, wait, 200*time.Millisecond, "flowd consume reads: %s", errs.String())
	return cmd, func() error {
		d.t.Helper()
		select {
		case <-exited:
			return err
		case <-time.After(wait):
			d.t.Fatalf("flowd consume %s did not exit: %s", topic, errs.String())
			return nil
		}
	}
}

// topicNames lists the daemon's topics with `flowd topic list`.
func (d *daemon) topicNames() []string {
	d.t.Helper()
	var r control.TopicListReply
	require.NoError(d.t, d.ctlJSON(&r, "topic", "list"))
	var names []string
	for _, tv := range r.Topics {
		names = append(names, tv.Topic)
	}
	return names
}

// `flowd consume` without --group leaves nothing on the daemon: after a read to its end, one
// interrupted with Ctrl-C (SIGINT) and one killed, `flowd topic list` shows no retry topic and
// `flowd group list` no group.
func TestConsumeWithoutGroupLeavesNothingBehind(t *testing.T) {
	d := startDaemon(t, "A", t.TempDir(), "")
	d.ctl("topic", "create", "tour", "--queues", "2")
	d.produce("tour", []string{"--tag", "t"}, "one", "two", "three")
	before := d.topicNames()
	out, err := flowd("consume", "tour", "--namesrv", d.namesrv, "--from", "first", "-n", "3", "--tag", "t")
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"one", "two", "three"}, strings.Fields(out))

	cmd, exit := d.tail("tour", "--sql", "TAGS IS NULL")
	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	require.NoError(t, exit(), "an interrupted consume exits 0")
	cmd, exit = d.tail("tour")
	require.NoError(t, cmd.Process.Kill())
	require.Error(t, exit())

	assert.Equal(t, before, d.topicNames(), "the same topics as before the reads: no retry topic")
	assert.NotContains(t, d.ctl("topic", "list"), "%RETRY%")
	var groups control.GroupListReply
	require.NoError(t, d.ctlJSON(&groups, "group", "list"))
	assert.Empty(t, groups.Groups, "no group")
	assert.Equal(t, "GROUP\tCONFIGURED\tMEMBERS\tLAG\tTOPICS", strings.Join(strings.Fields(d.ctl("group", "list")), "\t"), "group list shows its header alone")
}

// What the command line cannot do it says, with a non-zero exit status: a mistyped
// subcommand, a filter the broker refuses, a topic that does not exist, no daemon.
func TestCommandLineErrorsExitNonZero(t *testing.T) {
	d := startDaemon(t, "A", t.TempDir(), "")
	d.ctl("topic", "create", "orders", "--queues", "1")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"topic", "creat", "orders"}, `unknown command "creat" for "flowd topic"`},
		{[]string{"consume", "orders", "--namesrv", d.namesrv, "--sql", "a >"}, "the broker refused the filter"},
		{[]string{"consume", "orders", "--namesrv", d.namesrv, "--wasm", "nosuchfilter"}, `no filter plugin "nosuchfilter" is deployed`},
		{[]string{"consume", "missing", "--namesrv", d.namesrv}, `topic "missing" does not exist`},
		{[]string{"produce", "orders", "x", "--namesrv", "127.0.0.1:1"}, "no flowd answers on 127.0.0.1:1: is `flowd serve` running?"},
	} {
		_, err := flowd(c.args...)
		var exit *exec.ExitError
		require.True(t, errors.As(err, &exit), "%v exits non-zero: %v", c.args, err)
		assert.Equal(t, 1, exit.ExitCode(), "%v", c.args)
		assert.Contains(t, err.Error(), c.want, "%v", c.args)
	}
}
