package control_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/pipeline"
	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/runtime"
)

// errorLog records the service's logs at ERROR: a client's mistake must not show there.
type errorLog struct {
	mu   sync.Mutex
	msgs []string
}

func (l *errorLog) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelError }
func (l *errorLog) WithAttrs([]slog.Attr) slog.Handler            { return l }
func (l *errorLog) WithGroup(string) slog.Handler                 { return l }

func (l *errorLog) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%.200s", a.Key, a.Value.String())
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, b.String())
	return nil
}

func (l *errorLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.msgs...)
}

// fullEnv is a service with every command served: a plugin registry and a real pipeline
// Manager on the broker, on a NATS server whose options mod may change (max payload).
type fullEnv struct {
	*env
	m      *pipeline.Manager
	errors *errorLog
}

func startFull(t *testing.T, mod func(*server.Options)) *fullEnv {
	t.Helper()
	ctx := context.Background()
	b := startBroker(t, nil)
	opts := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true}
	if mod != nil {
		mod(opts)
	}
	ns, err := server.NewServer(opts)
	require.NoError(t, err)
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	require.True(t, ns.ReadyForConnections(wait), "nats server ready")

	rt, err := runtime.New(ctx, runtime.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rt.Close(ctx)) })
	st, err := plugins.NewDirStore(filepath.Join(t.TempDir(), "plugins"))
	require.NoError(t, err)
	reg, err := plugins.NewRegistry(ctx, rt, st, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, reg.Close(ctx)) })

	m, err := pipeline.NewManager(pipeline.Options{
		NameServers: []string{b.NamesrvAddr()}, Logger: quiet(), Stdout: io.Discard,
		ConsumerOptions: []consumer.Option{
			consumer.WithPollTimeout(200 * time.Millisecond),
			consumer.WithLockRetryInterval(50 * time.Millisecond),
			consumer.WithClientOptions(client.WithHeartbeatInterval(time.Second)),
		},
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		require.NoError(t, m.Close(cctx))
	})

	errs := &errorLog{}
	cfg := control.ServiceConfig{Logger: slog.New(errs), Plugins: reg, Pipelines: m}
	svc, err := control.StartService(ctx, connect(t, ns), b, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, svc.Stop()) })
	return &fullEnv{env: &env{t: t, b: b, ns: ns, svc: svc, cl: connect(t, ns), cfg: cfg}, m: m, errors: errs}
}

// An error reply echoes the request's values clipped: a value of 600 KB, which echoed in
// full in the header and the body would not fit NATS's 1 MiB max payload, still gets a
// prompt, short answer, on every command.
func TestErrorRepliesClipEchoedValues(t *testing.T) {
	e := startFull(t, nil)
	e.ok("topic.create", `{"topic":"clip","queues":1}`, nil)
	const size = 600 << 10
	big := strings.Repeat("x", size)
	q := strconv.Quote(big)
	digits := strings.Repeat("7", size)
	for _, tc := range []struct {
		cmd, body string
		code      int
	}{
		{"topic.create", `{"topic":` + q + `,"queues":1}`, control.CodeBadRequest},
		{"topic.create", `{"topic":"clip2","queues":` + digits + `}`, control.CodeBadRequest},
		{"topic.update", `{"topic":` + q + `,"perm":"r"}`, control.CodeBadRequest},
		{"topic.update", `{"topic":"clip","perm":` + q + `}`, control.CodeBadRequest},
		{"topic.delete", `{"topic":` + q + `}`, control.CodeBadRequest},
		{"topic.list", `{` + q + `:1}`, control.CodeBadRequest},
		{"topic.describe", `{"topic":` + q + `}`, control.CodeBadRequest},
		{"group.list", `{` + q + `:1}`, control.CodeBadRequest},
		{"group.describe", `{"group":` + q + `}`, control.CodeBadRequest},
		{"group.reset_offset", `{"group":"g","topic":"clip","to":` + q + `}`, control.CodeBadRequest},
		{"group.reset_offset", `{"group":"g","topic":"clip","offsets":{` + q + `:1}}`, control.CodeBadRequest},
		{"group.reset_offset", `{"group":"g","topic":"clip","timestamp":` + q + `}`, control.CodeBadRequest},
		{"group.reset_offset", `{"group":"g","topic":"clip","timestamp":[` + strings.Repeat("1,", (size-4)/2) + `11]}`, control.CodeBadRequest},
		{"message.get", `{` + q + `:1}`, control.CodeBadRequest},
		{"message.query", `{"topic":` + q + `,"key":"k"}`, control.CodeBadRequest},
		{"message.query", `{"topic":"clip","key":"k","begin":` + q + `}`, control.CodeBadRequest},
		{"broker.status", `{` + q + `:1}`, control.CodeBadRequest},
		{"plugin.deploy", `{"manifest":{"name":` + q + `,"kind":"filter","version":"1.0.0","abi":1},"module":"AA=="}`, control.CodeBadRequest},
		{"plugin.list", `{` + q + `:1}`, control.CodeBadRequest},
		{"plugin.activate", `{"name":` + q + `,"version":"1.0.0"}`, control.CodeNotFound},
		// Clipped at a rune boundary: byte 128 is inside an "é", and a cut there would not
		// be UTF-8 (the body's JSON would then differ from the header). The registry echoes
		// the name unquoted.
		{"plugin.activate", `{"name":"x` + strings.Repeat("é", (size-2)/2) + `z","version":"1.0.0"}`, control.CodeNotFound},
		{"plugin.remove", `{"name":"region","version":` + q + `}`, control.CodeNotFound},
		{"pipeline.list", `{"name":` + q + `}`, control.CodeNotFound},
		{"pipeline.pause", `{"name":` + q + `}`, control.CodeNotFound},
		{"pipeline.resume", `{"name":` + q + `}`, control.CodeNotFound},
		{"pipeline.seek", `{"name":` + q + `,"position":"first"}`, control.CodeNotFound},
		{"pipeline.seek", `{"name":"p","position":` + q + `}`, control.CodeBadRequest},
	} {
		msg := e.fail(tc.cmd, tc.body, tc.code)
		assert.Less(t, len(msg), 1024, "%s: a short message: %.300s", tc.cmd, msg)
		assert.Contains(t, msg, fmt.Sprintf("… (%d bytes)", size), "%s: the clipped value says how long it was: %.300s", tc.cmd, msg)
	}
	assert.Empty(t, e.errors.all(), "client mistakes are not logged at ERROR")
}

// A reply larger than the connection's max payload is replaced by a short error saying
// so, rather than left unsent for the requester to time out on.
func TestReplyTooLargeForMaxPayloadGetsShortError(t *testing.T) {
	const maxPayload = 64 << 10
	e := startFull(t, func(o *server.Options) { o.MaxPayload = maxPayload })
	p := newProducer(t, e.b)
	body := []byte(strings.Repeat("0123456789abcdef", (100<<10)/16))
	res, err := p.Send(context.Background(), &producer.Message{Topic: "large", Body: body, Keys: []string{"big"}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return e.b.StoreMax("large", int32(res.Queue.QueueID)) > res.QueueOffset }, wait, time.Millisecond)

	for _, tc := range []struct{ cmd, body string }{
		{"message.get", `{"msg_id":"` + res.OffsetMsgID + `"}`},
		{"message.query", `{"topic":"large","key":"big"}`},
	} {
		msg := e.fail(tc.cmd, tc.body, control.CodeTooLarge)
		assert.Regexp(t, `^reply too large \(\d+ bytes > max payload 65536\)$`, msg, tc.cmd)
	}
	// Replies that fit are sent as they are.
	e.ok("topic.describe", `{"topic":"large"}`, nil)
}

// pipeline.seek answers a client's mistakes (a queue the pipeline does not own, an offset
// outside the queue, a queue id no queue can have, a bad timestamp, a pipeline that has
// stopped) with 4xx naming the field, not 500, and does not log them at ERROR.
func TestPipelineSeekClientMistakesAre4xx(t *testing.T) {
	e := startFull(t, nil)
	e.ok("topic.create", `{"topic":"seekable","queues":1}`, nil)
	ctx := context.Background()
	require.NoError(t, e.m.Start(ctx, pipeline.Definition{
		Name: "seeker", Topics: []string{"seekable"}, StartFrom: pipeline.StartFirst,
		Sink: pipeline.SinkDefinition{Type: pipeline.SinkStdout},
	}))
	send(t, e.b, newProducer(t, e.b), "seekable", 3)
	var own consumer.MessageQueue
	require.Eventually(t, func() bool {
		st, err := e.m.Get(ctx, "seeker")
		require.NoError(t, err)
		if len(st.Queues) != 1 || st.Queues[0].Committed != 3 {
			return false
		}
		own = st.Queues[0].Queue
		return true
	}, wait, 10*time.Millisecond, "the pipeline owns its queue and has read it")
	queue := func(topic string, id int64) string {
		return fmt.Sprintf(`"queue":{"topic":%q,"brokerName":%q,"queueId":%d}`, topic, own.BrokerName, id)
	}

	for _, tc := range []struct {
		body  string
		field string
		code  int
	}{
		{`{"name":"seeker","position":"offset","offset":1,` + queue("other", 0) + `}`, "queue", control.CodeBadRequest},
		{`{"name":"seeker","position":"first",` + queue("other", 0) + `}`, "queue", control.CodeBadRequest},
		{`{"name":"seeker","position":"timestamp","timestamp":"2026-01-01T00:00:00Z",` + queue("nosuchtopic", 0) + `}`, "queue", control.CodeBadRequest},
		{`{"name":"seeker","position":"offset","offset":1,` + queue("seekable", 1) + `}`, "queue", control.CodeBadRequest},
		{`{"name":"seeker","position":"offset","offset":1,` + queue("seekable", 1<<31) + `}`, "queue", control.CodeBadRequest},
		{`{"name":"seeker","position":"offset","offset":1,` + queue("seekable", 1<<32) + `}`, "queue", control.CodeBadRequest},
		{`{"name":"seeker","position":"offset","offset":100,` + queue("seekable", 0) + `}`, "offset", control.CodeBadRequest},
		{`{"name":"seeker","position":"timestamp","timestamp":"yesterday"}`, "timestamp", control.CodeBadRequest},
		{`{"name":"seeker","position":"timestamp","timestamp":1767225600000}`, "timestamp", control.CodeBadRequest},
		{`{"name":"seeker","position":"timestamp","timestamp":{"at":"now"}}`, "timestamp", control.CodeBadRequest},
		{`{"name":"seeker","position":"timestamp","timestamp":"1969-12-31T00:00:00Z"}`, "timestamp", control.CodeBadRequest},
	} {
		msg := e.fail("pipeline.seek", tc.body, tc.code)
		assert.True(t, strings.HasPrefix(msg, fmt.Sprintf("field %q: ", tc.field)), "%s: %s", tc.body, msg)
	}
	assert.Contains(t, e.fail("pipeline.seek", `{"name":"seeker","position":"offset","offset":100,`+queue("seekable", 0)+`}`, control.CodeBadRequest), "[0, 3]",
		"the error says where the queue's offsets lie")
	var r control.PipelineReply
	e.ok("pipeline.seek", `{"name":"seeker","position":"offset","offset":1,`+queue("seekable", 0)+`}`, &r)
	e.ok("pipeline.seek", `{"name":"seeker","position":"timestamp","timestamp":"2026-01-01T00:00:00Z"}`, &r)

	// A pipeline that has stopped (killed by its context) is a conflict, as for pause.
	kctx, kill := context.WithCancel(ctx)
	require.NoError(t, e.m.Start(kctx, pipeline.Definition{
		Name: "killed", Topics: []string{"seekable"}, Group: "killed-group", StartFrom: pipeline.StartFirst,
		Sink: pipeline.SinkDefinition{Type: pipeline.SinkStdout},
	}))
	kill()
	require.Eventually(t, func() bool {
		st, err := e.m.Get(ctx, "killed")
		require.NoError(t, err)
		return st.State == pipeline.StateStopped
	}, wait, 10*time.Millisecond)
	e.fail("pipeline.seek", `{"name":"killed","position":"first"}`, control.CodeConflict)
	e.fail("pipeline.seek", `{"name":"killed","position":"offset","offset":0,`+queue("seekable", 0)+`}`, control.CodeConflict)

	assert.Empty(t, e.errors.all(), "client mistakes are not logged at ERROR")
}

// An error reply is bounded by the max payload too: one that does not fit is replaced by
// the short error.
func TestErrorReplyTooLargeForMaxPayloadGetsShortError(t *testing.T) {
	const maxPayload = 400
	e := startFull(t, func(o *server.Options) { o.MaxPayload = maxPayload })
	// The unknown field's name is clipped to 128 bytes, but the message, in the header and
	// in the body, is still over 400 bytes.
	msg := e.fail("topic.list", `{"`+strings.Repeat("y", 300)+`":1}`, control.CodeTooLarge)
	assert.Regexp(t, `^reply too large \(\d+ bytes > max payload 400\)$`, msg)
}
