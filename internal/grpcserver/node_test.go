package grpcserver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// nodeDir holds the Node.js driver of the official RocketMQ 5 client (client.js) and its
// pinned dependency (rocketmq-client-nodejs 1.0.8, installed by `npm ci` there).
const nodeDir = "testdata/node"

// needNode skips the test when node or the client is not installed, except under CI=true,
// where .ci/run installs them and their absence is a failure.
func needNode(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(nodeDir, "node_modules", "rocketmq-client-nodejs", "package.json"))
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("node or rocketmq-client-nodejs missing (.ci/run runs npm ci in %s): %v", nodeDir, err)
		}
		t.Skipf("node or rocketmq-client-nodejs missing (npm ci in %s): %v", nodeDir, err)
	}
	return node
}

// nodeLine is one JSON line client.js prints: a receipt, a received message or a mark.
type nodeLine struct {
	Started      bool              `json:"started"`
	Error        string            `json:"error"`
	MessageID    string            `json:"messageId"`
	Checked      string            `json:"checked"`
	ID           string            `json:"id"`
	Topic        string            `json:"topic"`
	Body         string            `json:"body"`
	Tag          string            `json:"tag"`
	Keys         []string          `json:"keys"`
	Properties   map[string]string `json:"properties"`
	MessageGroup string            `json:"messageGroup"`
	Attempt      int               `json:"attempt"`
	Corrupted    bool              `json:"corrupted"`
	Acked        bool              `json:"acked"`
}

// nodeRun is a running client.js.
type nodeRun struct {
	cmd    *exec.Cmd
	lines  chan nodeLine
	stderr *syncBuffer
	done   chan error
}

// syncBuffer is the script's stderr, written by exec's copier while the test reads it.
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

// runNode starts client.js with spec (its "endpoints" set to e's gRPC address).
func runNode(t *testing.T, e *env, spec map[string]any) *nodeRun {
	t.Helper()
	node := needNode(t)
	spec["endpoints"] = e.addr
	arg, err := json.Marshal(spec)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, node, "client.js", string(arg))
	cmd.Dir = nodeDir
	r := &nodeRun{cmd: cmd, lines: make(chan nodeLine, 1024), stderr: &syncBuffer{}, done: make(chan error, 1)}
	cmd.Stderr = r.stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var l nodeLine
			if json.Unmarshal(sc.Bytes(), &l) == nil {
				r.lines <- l
			}
		}
		close(r.lines)
		r.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("node %v stderr:\n%s", spec["mode"], r.stderr.String())
		}
	})
	return r
}

// all waits for the script to end and returns its lines, failing the test if it failed.
func (r *nodeRun) all(t *testing.T) []nodeLine {
	t.Helper()
	var out []nodeLine
	for l := range r.lines {
		require.Empty(t, l.Error, "node: %s", r.stderr.String())
		out = append(out, l)
	}
	require.NoError(t, <-r.done, "node: %s", r.stderr.String())
	return out
}

// messages are the received messages among lines.
func messages(lines []nodeLine) []nodeLine {
	var out []nodeLine
	for _, l := range lines {
		if l.ID != "" {
			out = append(out, l)
		}
	}
	return out
}

func TestNodeProducerSendsNormalMessages(t *testing.T) {
	e := start(t, nil)
	e.topic(t, "node-normal", 4)
	lines := runNode(t, e, map[string]any{"mode": "produce", "topic": "node-normal", "messages": []map[string]any{
		{"body": "one", "tag": "TagA", "keys": []string{"k1"}, "properties": map[string]string{"color": "red"}},
		{"body": "two", "tag": "TagB"},
	}}).all(t)
	var ids []string
	for _, l := range lines {
		if l.MessageID != "" {
			ids = append(ids, l.MessageID)
		}
	}
	require.Len(t, ids, 2)
	got := e.stored(t, "node-normal", 2)
	byID := map[string]string{}
	for _, m := range got {
		byID[m.Properties["UNIQ_KEY"]] = string(m.Body)
		if string(m.Body) == "one" {
			require.Equal(t, "TagA", m.Tags())
			require.Equal(t, []string{"k1"}, m.Keys())
			require.Equal(t, "red", m.Properties["color"])
		}
	}
	require.Equal(t, "one", byID[ids[0]], "the client's message id is the stored UNIQ_KEY")
	require.Equal(t, "two", byID[ids[1]])
}
