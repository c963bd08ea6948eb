package main

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// syncBuffer is a bytes.Buffer safe for the server's logger and the test to share.
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

func TestServeAnswersRouteQueriesAndStopsCleanly(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	var logs syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--data-dir", dir, "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--grpc-listen", "off", "--namesrv-listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0"}, &logs, &logs)
	}()
	re := regexp.MustCompile(`namesrv=(127\.0\.0\.1:\d+)`)
	var ns string
	require.Eventually(t, func() bool {
		m := re.FindStringSubmatch(logs.String())
		if m != nil {
			ns = m[1]
		}
		return m != nil
	}, 10*time.Second, 10*time.Millisecond, "flowd logs its addresses: %s", logs.String())

	cl := remoting.NewClient(remoting.ClientOptions{})
	defer cl.Close()
	resp, err := cl.Invoke(ctx, ns, protocol.NewRequestWith(protocol.GetRouteInfoByTopic, &protocol.GetRouteInfoRequestHeader{Topic: protocol.AutoCreateTopicKey}, nil))
	require.NoError(t, err)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	route, err := protocol.DecodeTopicRouteData(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, "local", route.BrokerDatas[0].Cluster)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("flowd did not stop")
	}
	assert.Contains(t, logs.String(), "flowd stopping")
}

// flowd serve runs the embedded NATS server by default: events of the broker reach a client
// of its listener, from "started" to "stopping".
func TestServePublishesEventsOnNATS(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--data-dir", dir, "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--grpc-listen", "off", "--namesrv-listen", "off",
			"--nats-listen", "127.0.0.1:0", "--nats-events-stream", "--nats-disable", "topic.delete"}, &logs, &logs)
	}()
	re := regexp.MustCompile(`broker=(127\.0\.0\.1:\d+) .*nats=(nats://127\.0\.0\.1:\d+)`)
	var m []string
	require.Eventually(t, func() bool {
		m = re.FindStringSubmatch(logs.String())
		return m != nil
	}, 10*time.Second, 10*time.Millisecond, "flowd logs its addresses: %s", logs.String())
	assert.DirExists(t, filepath.Join(dir, "nats"), "JetStream keeps its data under the data directory")

	nc, err := nats.Connect(m[2])
	require.NoError(t, err)
	defer nc.Close()
	sub, err := nc.SubscribeSync("flowd.evt.local.>")
	require.NoError(t, err)
	require.NoError(t, nc.Flush())

	cl := remoting.NewClient(remoting.ClientOptions{})
	defer cl.Close()
	resp, err := cl.Invoke(ctx, m[1], protocol.NewRequestWith(protocol.UpdateAndCreateTopic,
		&protocol.CreateTopicRequestHeader{Topic: "served", ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermRead | protocol.PermWrite}, nil))
	require.NoError(t, err)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	next := func() *nats.Msg {
		t.Helper()
		msg, err := sub.NextMsg(10 * time.Second)
		require.NoError(t, err)
		return msg
	}
	msg := next()
	assert.Equal(t, "flowd.evt.local.topic.created", msg.Subject)
	assert.Equal(t, "io.flowd.topic.v1.created", msg.Header.Get("ce-type"))
	assert.Equal(t, "served", msg.Header.Get("ce-subject"))

	// Commands are served over the same connection: a topic created with a NATS request is
	// announced like any other, and a disabled command says so.
	reply, err := nc.Request("flowd.ctl.v1.local.topic.create", []byte(`{"topic":"bynats","queues":2}`), 10*time.Second)
	require.NoError(t, err)
	assert.Empty(t, reply.Header.Get("Nats-Service-Error-Code"), string(reply.Data))
	assert.Contains(t, string(reply.Data), `"node":"broker-a"`)
	msg = next()
	assert.Equal(t, "flowd.evt.local.topic.created", msg.Subject)
	assert.Equal(t, "bynats", msg.Header.Get("ce-subject"))
	reply, err = nc.Request("flowd.ctl.v1.local.topic.delete", []byte(`{"topic":"bynats"}`), 10*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "403", reply.Header.Get("Nats-Service-Error-Code"))

	cancel()
	msg = next()
	assert.Equal(t, "flowd.evt.local.broker.stopping", msg.Subject)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("flowd did not stop")
	}
}

func TestBadFlagsAndCommandsAreErrors(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), []string{"serve", "--log-level", "loud"}, &out, &out)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "loud")

	// An open NATS listener without authentication is refused before anything binds it.
	err = run(context.Background(), []string{"serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--grpc-listen", "off", "--namesrv-listen", "off",
		"--nats-listen", "0.0.0.0:4222"}, &out, &out)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--nats-token")

	err = run(context.Background(), []string{"frobnicate"}, &out, &out)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "frobnicate")

	out.Reset()
	require.NoError(t, run(context.Background(), []string{"version"}, &out, &out))
	assert.True(t, strings.HasPrefix(out.String(), "flowd "))
}

func TestBenchRunsAgainstAnEmbeddedBroker(t *testing.T) {
	var out, errs bytes.Buffer
	err := run(context.Background(), []string{"bench", "--deploy", "in-process", "--data-dir", t.TempDir(), "--messages", "300", "--latency-samples", "20", "--queues", "2",
		"--sizes", "128", "--baseline", "none", "--scenarios", "disk-write-*,produce-*-async,consume-*,e2e-delay"}, &out, &errs)
	require.NoError(t, err, errs.String())
	for _, want := range []string{"disk-write-128", "produce-128-async", "consume-128", "e2e-delay-p99"} {
		assert.Contains(t, out.String(), want)
	}
	err = run(context.Background(), []string{"bench", "--size", "3"}, &out, &errs)
	assert.ErrorContains(t, err, "--size 3")
}
