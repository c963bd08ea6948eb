package control_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/producer"
)

// wait bounds how long a test waits for something that happens at once on a healthy machine.
const wait = 15 * time.Second

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startNATS runs an embedded NATS server on a free loopback port.
func startNATS(t testing.TB) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	require.NoError(t, err)
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	require.True(t, ns.ReadyForConnections(wait), "nats server ready")
	return ns
}

// startBroker runs a broker on free loopback ports with a fresh data directory.
func startBroker(t testing.TB, mod func(*broker.Config)) *broker.Broker {
	t.Helper()
	cfg := broker.Config{
		DataDir:       t.TempDir(),
		Listen:        "127.0.0.1:0",
		NamesrvListen: "127.0.0.1:0",
		Logger:        quiet(),
	}
	cfg.Store.SegmentSize = 8 << 20
	if mod != nil {
		mod(&cfg)
	}
	b, err := broker.New(cfg)
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, b.Shutdown(ctx))
	})
	return b
}

func connect(t testing.TB, ns *server.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// env is a broker, an embedded NATS server, the command service on one connection and a
// client connection to send requests on.
type env struct {
	t   *testing.T
	b   *broker.Broker
	ns  *server.Server
	svc *control.Service
	cl  *nats.Conn
	cfg control.ServiceConfig
	// replyWait bounds the wait for a reply; zero: wait. Commands that compile a Go guest
	// need longer under the race detector.
	replyWait time.Duration
}

func start(t *testing.T, mod func(*control.ServiceConfig)) *env {
	t.Helper()
	b := startBroker(t, nil)
	ns := startNATS(t)
	cfg := control.ServiceConfig{Logger: quiet()}
	if mod != nil {
		mod(&cfg)
	}
	svc, err := control.StartService(context.Background(), connect(t, ns), b, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, svc.Stop()) })
	return &env{t: t, b: b, ns: ns, svc: svc, cl: connect(t, ns), cfg: cfg}
}

// request sends a command ("topic.create") of the local cluster and returns the reply.
func (e *env) request(cmd, body string) *nats.Msg {
	e.t.Helper()
	d := e.replyWait
	if d == 0 {
		d = wait
	}
	msg, err := e.cl.Request("flowd.ctl.v1.local."+cmd, []byte(body), d)
	require.NoError(e.t, err, cmd)
	return msg
}

// ok sends a command that must succeed and decodes its reply into out (when not nil).
func (e *env) ok(cmd, body string, out any) {
	e.t.Helper()
	msg := e.request(cmd, body)
	require.Empty(e.t, msg.Header.Get(micro.ErrorCodeHeader), "%s %s: %s", cmd, body, msg.Header.Get(micro.ErrorHeader))
	var origin control.Origin
	require.NoError(e.t, json.Unmarshal(msg.Data, &origin))
	assert.Equal(e.t, control.Origin{Node: "broker-a", Cluster: "local"}, origin, "every reply names its node")
	if out != nil {
		require.NoError(e.t, json.Unmarshal(msg.Data, out), string(msg.Data))
	}
}

// fail sends a command that must fail with code and returns the error message, which the
// header and the body agree on.
func (e *env) fail(cmd, body string, code int) string {
	e.t.Helper()
	msg := e.request(cmd, body)
	require.Equal(e.t, strconv.Itoa(code), msg.Header.Get(micro.ErrorCodeHeader), "%s %s: %s %s", cmd, body, msg.Header.Get(micro.ErrorHeader), msg.Data)
	var reply control.ErrorReply
	require.NoError(e.t, json.Unmarshal(msg.Data, &reply))
	assert.Equal(e.t, code, reply.Error.Code)
	assert.Equal(e.t, msg.Header.Get(micro.ErrorHeader), reply.Error.Message)
	assert.Equal(e.t, "broker-a", reply.Node)
	return reply.Error.Message
}

var instSeq atomic.Int64

func uniqueName(t testing.TB) string { return fmt.Sprintf("%s-%d", t.Name(), instSeq.Add(1)) }

func newProducer(t testing.TB, b *broker.Broker) *producer.Producer {
	t.Helper()
	p, err := producer.New("control-test-producers", producer.WithClientOptions(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet()), client.WithInstanceName(uniqueName(t))))
	require.NoError(t, err)
	require.NoError(t, p.Start(context.Background()))
	t.Cleanup(func() { p.Close(context.Background()) })
	return p
}

// send stores n messages in topic and returns their send results.
func send(t testing.TB, b *broker.Broker, p *producer.Producer, topic string, n int) []producer.SendResult {
	t.Helper()
	var out []producer.SendResult
	for i := range n {
		res, err := p.Send(context.Background(), &producer.Message{Topic: topic, Body: fmt.Appendf(nil, "m-%d", i), Tags: "t"})
		require.NoError(t, err)
		out = append(out, res)
	}
	// The store dispatches to the consume queues after the send returns.
	for _, res := range out {
		require.Eventually(t, func() bool {
			return b.StoreMax(topic, int32(res.Queue.QueueID)) > res.QueueOffset
		}, wait, time.Millisecond)
	}
	return out
}

func newConsumer(t testing.TB, b *broker.Broker, group, topic string) *consumer.LitePull {
	t.Helper()
	c, err := consumer.NewLitePull(group,
		consumer.WithClientOptions(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet()), client.WithInstanceName(uniqueName(t))),
		consumer.WithConsumeFrom(consumer.ConsumeFromFirst),
		consumer.WithPollTimeout(100*time.Millisecond),
		consumer.WithLockRetryInterval(50*time.Millisecond),
		consumer.WithClientOptions(client.WithHeartbeatInterval(time.Second)),
		consumer.WithAutoCommit(false),
	)
	require.NoError(t, err)
	require.NoError(t, c.Subscribe(topic, "*"))
	require.NoError(t, c.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Close(ctx)
	})
	return c
}

// pollN polls until n messages arrived or wait passed.
func pollN(t testing.TB, c *consumer.LitePull, n int) []*consumer.Message {
	t.Helper()
	var out []*consumer.Message
	deadline := time.Now().Add(wait)
	for len(out) < n && time.Now().Before(deadline) {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		msgs, err := c.Poll(ctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			require.NoError(t, err)
		}
		out = append(out, msgs...)
	}
	require.Len(t, out, n)
	return out
}

func TestDiscoveryFindsOneFlowdServicePerNode(t *testing.T) {
	e := start(t, nil)

	msg, err := e.cl.Request("$SRV.PING.flowd", nil, wait)
	require.NoError(t, err)
	var ping micro.Ping
	require.NoError(t, json.Unmarshal(msg.Data, &ping))
	assert.Equal(t, "flowd", ping.Name)
	assert.Equal(t, map[string]string{"cluster": "local", "node": "broker-a"}, ping.Metadata)

	msg, err = e.cl.Request("$SRV.INFO.flowd", nil, wait)
	require.NoError(t, err)
	var info micro.Info
	require.NoError(t, json.Unmarshal(msg.Data, &info))
	subjects := map[string]string{}
	for _, ep := range info.Endpoints {
		subjects[ep.Subject] = ep.Metadata["read_only"]
	}
	assert.Equal(t, map[string]string{
		"flowd.ctl.v1.local.topic.create":       "false",
		"flowd.ctl.v1.local.topic.update":       "false",
		"flowd.ctl.v1.local.topic.delete":       "false",
		"flowd.ctl.v1.local.topic.list":         "true",
		"flowd.ctl.v1.local.topic.describe":     "true",
		"flowd.ctl.v1.local.group.list":         "true",
		"flowd.ctl.v1.local.group.describe":     "true",
		"flowd.ctl.v1.local.group.reset_offset": "false",
		"flowd.ctl.v1.local.message.get":        "true",
		"flowd.ctl.v1.local.message.query":      "true",
		"flowd.ctl.v1.local.message.browse":     "true",
		"flowd.ctl.v1.local.message.search":     "true",
		"flowd.ctl.v1.local.message.send":       "false",
		"flowd.ctl.v1.local.broker.status":      "true",
		"flowd.ctl.v1.local.cluster.status":     "true",
	}, subjects, "every command and nothing else (no stubs for commands not built)")
	assert.Equal(t, "flowd.ctl.v1.local.topic.list", e.svc.Subject("topic.list"))
	// The plugin commands are served only with a plugin registry (see cmd_plugin_test.go),
	// the pipeline commands only with a pipeline controller (cmd_pipeline_test.go).
	var served []string
	for _, name := range control.Commands() {
		if !strings.HasPrefix(name, "plugin.") && !strings.HasPrefix(name, "pipeline.") {
			served = append(served, name)
		}
	}
	assert.Len(t, served, len(subjects))
	for _, name := range served {
		assert.Contains(t, subjects, e.svc.Subject(name))
	}
}

func TestReadOnlyVerbs(t *testing.T) {
	assert.Equal(t, []string{"list", "describe", "get", "query", "status", "browse", "search"}, control.ReadOnlyVerbs())
	assert.True(t, control.IsReadOnly("describe"))
	assert.False(t, control.IsReadOnly("reset_offset"))
	v := control.ReadOnlyVerbs()
	v[0] = "create"
	assert.False(t, control.IsReadOnly("create"), "the returned slice is a copy")
}

func TestRequestsMustBeOneKnownJSONObject(t *testing.T) {
	e := start(t, nil)
	for _, tc := range []struct{ body, want string }{
		{`{"topic":"a","queues":1,"colour":"red"}`, `field "colour": unknown field`},
		{`{"topic":"a","queues":"4"}`, `field "queues": must be a number, not string`},
		{`{"topic":7,"queues":4}`, `field "topic": must be a string, not number`},
		{`{"topic":"a","queues":4,"order":"yes"}`, `field "order": must be true or false, not string`},
		{`{"topic":"a",`, `not valid JSON`},
		{`not json`, `not valid JSON`},
		{`[1,2]`, `must be a JSON object`},
		{`{"topic":"a","queues":1} {}`, `one JSON object, and nothing after it`},
	} {
		assert.Contains(t, e.fail("topic.create", tc.body, control.CodeBadRequest), tc.want, tc.body)
	}
	_, ok := e.b.Topic("a")
	assert.False(t, ok, "a refused request created the topic")
	// Commands without parameters take an empty body or {}, and nothing else.
	e.ok("topic.list", "", nil)
	e.ok("topic.list", "{}", nil)
	assert.Contains(t, e.fail("topic.list", `{"all":true}`, control.CodeBadRequest), `field "all": unknown field`)
}

func TestDisabledCommandsAnswer403(t *testing.T) {
	e := start(t, func(c *control.ServiceConfig) { c.Disabled = []string{"topic.delete", "group.*"} })
	e.ok("topic.create", `{"topic":"kept","queues":1}`, nil)
	msg := e.fail("topic.delete", `{"topic":"kept"}`, control.CodeDisabled)
	assert.Contains(t, msg, "topic.delete is disabled")
	_, ok := e.b.Topic("kept")
	assert.True(t, ok, "a disabled delete deleted")
	e.fail("group.list", ``, control.CodeDisabled)
	e.fail("group.reset_offset", `{"group":"g","topic":"kept","to":"earliest"}`, control.CodeDisabled)
	e.ok("topic.list", ``, nil)

	msg2, err := e.cl.Request("$SRV.INFO.flowd", nil, wait)
	require.NoError(t, err)
	var info micro.Info
	require.NoError(t, json.Unmarshal(msg2.Data, &info))
	disabled := map[string]bool{}
	for _, ep := range info.Endpoints {
		if ep.Metadata["disabled"] == "true" {
			disabled[ep.Subject] = true
		}
	}
	assert.Equal(t, map[string]bool{
		"flowd.ctl.v1.local.topic.delete":       true,
		"flowd.ctl.v1.local.group.list":         true,
		"flowd.ctl.v1.local.group.describe":     true,
		"flowd.ctl.v1.local.group.reset_offset": true,
	}, disabled)
}

func TestStartServiceRefusesBadConfig(t *testing.T) {
	b := startBroker(t, nil)
	nc := connect(t, startNATS(t))
	for _, cfg := range []control.ServiceConfig{
		{Disabled: []string{"topic.destroy"}},
		{Disabled: []string{"pipeline.*"}},
		{Disabled: []string{"topic"}},
		{Cluster: "a.b"},
		{Cluster: "a*"},
		{Cluster: "$x"},
		{Cluster: "a\fb"},
	} {
		cfg.Logger = quiet()
		_, err := control.StartService(context.Background(), nc, b, cfg)
		assert.Error(t, err, "%+v", cfg)
	}
	msg, err := nc.Request("$SRV.PING.flowd", nil, time.Second)
	assert.ErrorIs(t, err, nats.ErrNoResponders, "a refused start left a service behind: %v", msg)
}

func TestStopUnregistersTheService(t *testing.T) {
	b := startBroker(t, nil)
	ns := startNATS(t)
	svc, err := control.StartService(context.Background(), connect(t, ns), b, control.ServiceConfig{Logger: quiet(), Cluster: "east", Node: "n1"})
	require.NoError(t, err)
	cl := connect(t, ns)
	msg, err := cl.Request("flowd.ctl.v1.east.broker.status", nil, wait)
	require.NoError(t, err)
	var st control.StatusReply
	require.NoError(t, json.Unmarshal(msg.Data, &st))
	assert.Equal(t, control.Origin{Node: "n1", Cluster: "east"}, st.Origin)

	require.NoError(t, svc.Stop())
	require.NoError(t, svc.Stop(), "Stop twice")
	_, err = cl.Request("$SRV.PING.flowd", nil, time.Second)
	assert.ErrorIs(t, err, nats.ErrNoResponders)
	_, err = cl.Request("flowd.ctl.v1.east.broker.status", nil, time.Second)
	assert.ErrorIs(t, err, nats.ErrNoResponders)
}

// stats returns the STATS data of the service.
func (e *env) stats() control.StatsData {
	e.t.Helper()
	msg, err := e.cl.Request("$SRV.STATS.flowd", nil, wait)
	require.NoError(e.t, err)
	var st micro.Stats
	require.NoError(e.t, json.Unmarshal(msg.Data, &st))
	var data control.StatsData
	found := 0
	for _, ep := range st.Endpoints {
		if len(ep.Data) > 0 && string(ep.Data) != "null" {
			found++
			require.NoError(e.t, json.Unmarshal(ep.Data, &data))
			assert.Equal(e.t, "broker-status", ep.Name)
		}
	}
	require.Equal(e.t, 1, found, "one endpoint carries the data")
	return data
}

func TestStatsCarryGroupLagAndTopicRates(t *testing.T) {
	e := start(t, func(c *control.ServiceConfig) { c.RateInterval = 20 * time.Millisecond })
	e.ok("topic.create", `{"topic":"rated","queues":1}`, nil)
	p := newProducer(t, e.b)
	send(t, e.b, p, "rated", 5)
	e.ok("group.reset_offset", `{"group":"laggards","topic":"rated","offsets":{"0":2}}`, nil)

	data := e.stats()
	assert.Equal(t, control.GroupStats{Lag: 3}, data.Groups["laggards"])
	assert.Equal(t, int64(5), data.Topics["rated"].Messages)

	// A rate is messages over time: keep sending until a sampling interval saw some.
	require.Eventually(t, func() bool {
		send(t, e.b, p, "rated", 1)
		r := e.stats().Topics["rated"].Rate
		return r != nil && *r > 0
	}, wait, time.Millisecond)
	var d control.TopicDescribeReply
	require.Eventually(t, func() bool {
		send(t, e.b, p, "rated", 1)
		e.ok("topic.describe", `{"topic":"rated"}`, &d)
		return d.Rate != nil && *d.Rate > 0
	}, wait, time.Millisecond, "topic.describe shows the rate too")
}
