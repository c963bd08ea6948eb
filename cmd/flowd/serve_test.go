package main

import (
	"context"
	"net"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/metrics"
)

// stoppedParts lists the parts a debug log says were stopped, in its order.
func stoppedParts(logs string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`msg=stopped part=("[^"]*"|\S+)`).FindAllStringSubmatch(logs, -1) {
		out = append(out, strings.Trim(m[1], `"`))
	}
	return out
}

// serve stops its parts in the reverse of the order it built them, as start.go writes it:
// pipelines drain while the broker serves, the command service announces the stop before
// the broker shuts down, and the publisher outlives the broker.
func TestServeStopsItsPartsInReverseOrder(t *testing.T) {
	d := startServed(t, "log:\n  level: debug\n")
	d.stop()
	assert.Equal(t, []string{"plugin directory watch", "console event streams", "HTTP server", "metrics watch", "pipelines", "control service",
		"pipeline definitions", "gRPC server", "broker", "control plane", "gRPC listener", "HTTP listener", "plugins"}, stoppedParts(d.logs.String()), d.logs.String())
	assert.NotContains(t, d.logs.String(), "stop failed")
}

// A start that fails halfway stops what it had built, so the data directory can be served
// again at once.
func TestServeFailedStartStopsWhatItBuilt(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	dir := t.TempDir()
	args := []string{"serve", "--data-dir", dir, "--listen", "127.0.0.1:0", "--namesrv-listen", "127.0.0.1:0",
		"--http-listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--log-level", "debug"}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var logs syncBuffer
	err = run(ctx, append(args, "--nats-listen", ln.Addr().String()), &logs, &logs)
	require.ErrorIs(t, err, syscall.EADDRINUSE)
	assert.Equal(t, []string{"broker", "gRPC listener", "HTTP listener", "plugins"}, stoppedParts(logs.String()), logs.String())

	ln.Close()
	d := startServedIn(t, t.TempDir(), "", "--data-dir", dir)
	d.stop()
}

// A daemon that must run itself again is not ready from the moment that is asked for.
func TestRestartCheckIsNotReadyOnceARestartIsAsked(t *testing.T) {
	restart := make(chan struct{})
	check := restartCheck(restart)
	require.NoError(t, check.Fn(context.Background()))
	close(restart)
	err := check.Fn(context.Background())
	require.ErrorIs(t, err, metrics.ErrNotReady)
	require.Contains(t, err.Error(), "restarting")
}
