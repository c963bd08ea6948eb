package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
)

// closedAddr is a loopback address nothing listens on: the port of a listener just closed.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// A subscription the broker refuses ends consume with the broker's reason and an error (a
// non-zero exit), instead of a warning a second forever: a SQL92 syntax error, a Wasm filter
// that is not deployed.
func TestConsumeEndsWhenTheBrokerRefusesItsFilter(t *testing.T) {
	d := startServed(t, "")
	_, err := cli(t, "", "topic", "create", "filtered", "--queues", "2", "--nats", d.nats)
	require.NoError(t, err)
	for _, c := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--sql", "a >"}, `SQL92 expression "a >"`},
		{[]string{"--wasm", "nosuchfilter"}, `no filter plugin "nosuchfilter" is deployed`},
		{[]string{"--sql", "a >", "--group", "g1"}, `SQL92 expression "a >"`},
	} {
		_, err := cli(t, "", append([]string{"consume", "filtered", "--namesrv", d.namesrv}, c.flags...)...)
		require.Error(t, err, "%v", c.flags)
		assert.Contains(t, err.Error(), "the broker refused the filter", "%v", c.flags)
		assert.Contains(t, err.Error(), c.want, "%v", c.flags)
	}
}

// consume of a topic that does not exist fails at once, naming it and the option that waits
// for it; with --wait-for-topic it reads the topic once it is created, from its first message.
func TestConsumeOfATopicThatDoesNotExist(t *testing.T) {
	d := startServed(t, "")
	_, err := cli(t, "", "consume", "later", "--namesrv", d.namesrv)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `topic "later" does not exist`)
	assert.Contains(t, err.Error(), "--wait-for-topic")

	for _, group := range []string{"", "waiter"} {
		topic := "later" + group
		args := []string{"consume", topic, "--namesrv", d.namesrv, "--wait-for-topic", "-n", "2"}
		if group != "" {
			args = append(args, "--group", group)
		}
		out, errs, done := cliAsync(t, args...)
		require.Eventually(t, func() bool { return strings.Contains(errs.String(), "waiting for it") }, wait, 10*time.Millisecond,
			"consume says it waits: %s", errs.String())
		// The topic is created by the first send, after consume started waiting: it prints
		// both messages whenever it notices the topic.
		_, err = cli(t, "", "produce", topic, "first", "second", "--namesrv", d.namesrv, "-q")
		require.NoError(t, err)
		select {
		case err := <-done:
			require.NoError(t, err, group)
			assert.ElementsMatch(t, []string{"first", "second"}, strings.Fields(out.String()), group)
		case <-time.After(wait):
			t.Fatalf("consume --wait-for-topic (group %q) did not read the topic once it existed: %s", group, errs.String())
		}
	}
}

// cliAsync runs one flowd command line on a goroutine; done gets its error.
func cliAsync(t *testing.T, args ...string) (stdout, stderr *syncBuffer, done <-chan error) {
	t.Helper()
	root := newRoot(nil, nil)
	stdout, stderr = &syncBuffer{}, &syncBuffer{}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetIn(strings.NewReader(""))
	root.SetArgs(args)
	ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
	t.Cleanup(cancel)
	ch := make(chan error, 1)
	go func() { ch <- root.ExecuteContext(ctx) }()
	return stdout, stderr, ch
}

// consume and produce with no daemon on --namesrv say so, as the NATS commands do.
func TestConsumeAndProduceWithoutDaemonSaySo(t *testing.T) {
	addr := closedAddr(t)
	for _, args := range [][]string{
		{"consume", "orders", "--namesrv", addr},
		{"consume", "orders", "--namesrv", addr, "--group", "g", "--wait-for-topic"},
		{"produce", "orders", "hello", "--namesrv", addr},
	} {
		_, err := cli(t, "", args...)
		require.Error(t, err, "%v", args)
		require.ErrorIs(t, err, errNoDaemon, "%v", args)
		assert.Contains(t, err.Error(), "no flowd answers on "+addr+": is `flowd serve` running?", "%v", args)
	}
}

// committed returns the committed offset of queue 0 of topic for group (-1: none).
func committed(t *testing.T, d *served, group, topic string) int64 {
	t.Helper()
	out, err := cli(t, "", "group", "describe", group, "--json", "--nats", d.nats)
	require.NoError(t, err)
	var r control.GroupDescribeReply
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	for _, tp := range r.Topics {
		if tp.Topic != topic {
			continue
		}
		for _, q := range tp.Queues {
			if q.Queue == 0 && q.Committed != nil {
				return *q.Committed
			}
		}
	}
	return -1
}

// consume --group -n N commits exactly what it printed: the rest of the last batch it pulled
// is printed by the next consume of the group, not lost.
func TestConsumeGroupCommitsWhatItPrinted(t *testing.T) {
	d := startServed(t, "")
	_, err := cli(t, "", "topic", "create", "counted", "--queues", "1", "--nats", d.nats)
	require.NoError(t, err)
	var lines []string
	for i := range 16 {
		lines = append(lines, fmt.Sprintf("m%02d", i))
	}
	_, err = cli(t, strings.Join(lines, "\n")+"\n", "produce", "counted", "--namesrv", d.namesrv, "-q")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		out, err := cli(t, "", "topic", "describe", "counted", "--json", "--nats", d.nats)
		require.NoError(t, err)
		var desc control.TopicDescribeReply
		require.NoError(t, json.Unmarshal([]byte(out), &desc), out)
		return desc.Messages == 16
	}, wait, 20*time.Millisecond)

	out, err := cli(t, "", "consume", "counted", "--namesrv", d.namesrv, "--group", "tally", "--from", "first", "-n", "5")
	require.NoError(t, err)
	assert.Equal(t, strings.Join(lines[:5], "\n")+"\n", out)
	assert.Equal(t, int64(5), committed(t, d, "tally", "counted"), "what was printed, not the whole batch")

	out, err = cli(t, "", "consume", "counted", "--namesrv", d.namesrv, "--group", "tally", "-n", "11")
	require.NoError(t, err)
	assert.Equal(t, strings.Join(lines[5:], "\n")+"\n", out, "the next consume of the group goes on where the first stopped")
	assert.Equal(t, int64(16), committed(t, d, "tally", "counted"))
}

// consume without --group leaves no group, no retry topic and no offsets behind.
func TestConsumeWithoutGroupLeavesNothingBehind(t *testing.T) {
	d := startServed(t, "")
	_, err := cli(t, "one\ntwo\nthree\n", "produce", "tour", "--namesrv", d.namesrv, "-q", "--tag", "t")
	require.NoError(t, err)
	for _, c := range []struct {
		flags []string
		n     int
	}{{[]string{"-n", "3"}, 3}, {[]string{"-n", "1", "--tag", "t"}, 1}, {[]string{"-n", "2", "--sql", "TAGS = 't'", "-o", "json"}, 2}} {
		out, err := cli(t, "", append([]string{"consume", "tour", "--namesrv", d.namesrv, "--from", "first"}, c.flags...)...)
		require.NoError(t, err, "%v", c.flags)
		assert.Len(t, strings.Split(strings.TrimSpace(out), "\n"), c.n, "%v: %s", c.flags, out)
	}
	out, err := cli(t, "", "group", "list", "--json", "--nats", d.nats)
	require.NoError(t, err)
	var groups control.GroupListReply
	require.NoError(t, json.Unmarshal([]byte(out), &groups), out)
	assert.Empty(t, groups.Groups, "no group is left behind")
	out, err = cli(t, "", "topic", "list", "--nats", d.nats)
	require.NoError(t, err)
	assert.NotContains(t, out, "%RETRY%", "no retry topic is left behind")
	assert.Regexp(t, `(?m)^tour\s`, out)
}

// The README's first lines build and test; the tour says that the first build takes a
// while and builds the binary once for the commands that follow.
func TestREADMESaysTheFirstBuildTakesAWhile(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	readme := string(raw)
	head, _, ok := strings.Cut(readme, "## A first tour")
	require.True(t, ok, "the README has its tour")
	assert.Regexp(t, "(?s)```sh\ngo run ./cmd/flowd .*\ngo test ./\\.\\.\\. ", head, "the first lines: run and test")
	assert.Contains(t, head, "go build -o flowd ./cmd/flowd", "how to build once")
	assert.Regexp(t, `(?i)first (build|run)[^.]*(minutes|a while)`, head, "that the first build takes a while")
}
