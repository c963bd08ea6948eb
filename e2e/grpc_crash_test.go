package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// nodeDir is the Node.js driver of the official RocketMQ 5 client, with its pinned
// dependency installed by `npm ci` there.
const nodeDir = "../internal/grpcserver/testdata/node"

// runNodeClient runs the driver with spec against endpoints and returns the bodies of the messages it
// received, failing the test if it failed. Skipped without node or the client, except under
// CI=true.
func runNodeClient(t *testing.T, endpoints string, spec map[string]any) []string {
	t.Helper()
	bin, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(nodeDir, "node_modules", "rocketmq-client-nodejs", "package.json"))
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("node or rocketmq-client-nodejs missing: %v", err)
		}
		t.Skipf("node or rocketmq-client-nodejs missing: %v", err)
	}
	spec["endpoints"] = endpoints
	arg, err := json.Marshal(spec)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "client.js", string(arg))
	cmd.Dir = nodeDir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "node %v: %s", spec["mode"], stderr.String())
	var bodies []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var l struct {
			ID, Body string
		}
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.ID != "" {
			bodies = append(bodies, l.Body)
		}
	}
	sort.Strings(bodies)
	return bodies
}

// A daemon killed with SIGKILL while a 5.x consumer group has messages acknowledged and
// messages in flight: after the restart nothing acknowledged comes back and everything
// unacknowledged does.
func TestKilledDaemonKeepsPopAcknowledgements(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, "A", dir, "")
	d.ctl("topic", "create", "popcrash", "--queues", "2")
	var msgs []map[string]any
	var acked, unacked []string
	for i := range 10 {
		body := fmt.Sprintf("m-%02d", i)
		msgs = append(msgs, map[string]any{"body": body})
		if i%2 == 0 {
			acked = append(acked, body)
		} else {
			unacked = append(unacked, body)
		}
	}
	runNodeClient(t, d.grpc, map[string]any{"mode": "produce", "topic": "popcrash", "messages": msgs})
	got := runNodeClient(t, d.grpc, map[string]any{"mode": "simple", "topic": "popcrash", "group": "crash-g", "count": 10,
		"ackBodies": acked, "invisibleMs": 3000})
	require.Len(t, got, 10)
	d.kill()
	require.Error(t, d.err, "SIGKILL")

	d = startDaemon(t, "A restarted", dir, "")
	// The unacknowledged ones come back once their invisibility ends; no acknowledged one
	// does (the receive goes on for seconds past the last, asking for one more).
	got = runNodeClient(t, d.grpc, map[string]any{"mode": "simple", "topic": "popcrash", "group": "crash-g", "count": len(unacked) + 1,
		"timeoutMs": 10000})
	require.Equal(t, unacked, got)
}
