package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/config"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/pipeline"
	"github.com/flowd-io/flowd/producer"
)

// euPipeline is a pipeline reading orders and writing the EU ones to eu-orders, a topic of
// the same flowd.
const euPipeline = `pipelines:
  - name: eu
    topics: [orders]
    selector: {type: SQL92, expression: "region = 'eu'"}
    start_from: first
    sink: {type: topic, topic: eu-orders}
`

// bodies collects the bodies a consumer polls.
type bodies struct {
	mu  sync.Mutex
	got []string
}

func (b *bodies) add(m *consumer.Message) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.got = append(b.got, string(m.Body))
}

func (b *bodies) has(want ...string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, w := range want {
		if !slices.Contains(b.got, w) {
			return false
		}
	}
	return true
}

func (b *bodies) count(body string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, g := range b.got {
		if g == body {
			n++
		}
	}
	return n
}

func (b *bodies) list() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := slices.Clone(b.got)
	slices.Sort(out)
	return out
}

func sendOrder(t *testing.T, p *producer.Producer, body, region string) {
	t.Helper()
	_, err := p.Send(context.Background(), &producer.Message{Topic: "orders", Body: []byte(body), Properties: map[string]string{"region": region}})
	require.NoError(t, err)
}

// A pipeline of the configuration file runs in the daemon: it copies the messages its SQL92
// selector admits from one topic to another, is paused and resumed with the CLI (each
// announced on NATS), and is stopped by a reload that removes it.
func TestServeRunsConfiguredPipelines(t *testing.T) {
	dir := t.TempDir()
	// The source topic exists before the pipeline starts, as it would in production: the
	// first daemon creates it, the second serves the same data with the pipeline.
	first := startServedIn(t, dir, "cluster: e2e\n")
	ctl := []string{"--nats", first.nats, "--cluster", "e2e"}
	_, err := cli(t, "", append([]string{"topic", "create", "orders", "--queues", "2"}, ctl...)...)
	require.NoError(t, err)
	_, err = cli(t, "", append([]string{"topic", "create", "eu-orders", "--queues", "1"}, ctl...)...)
	require.NoError(t, err)
	first.stop()

	d := startServedIn(t, dir, "cluster: e2e\n"+euPipeline)
	ctl = []string{"--nats", d.nats, "--cluster", "e2e"}
	require.Eventually(t, func() bool {
		return strings.Contains(d.logs.String(), "pipeline started")
	}, 10*time.Second, 10*time.Millisecond, d.logs.String())
	out, err := cli(t, "", append([]string{"pipeline", "list"}, ctl...)...)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^eu\s+running\s+orders\s+topic:eu-orders`, out)

	nc, err := nats.Connect(d.nats)
	require.NoError(t, err)
	defer nc.Close()
	events, err := nc.SubscribeSync("flowd.evt.e2e.pipeline.>")
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	nextEvent := func(subject string) control.EventData {
		t.Helper()
		msg, err := events.NextMsg(10 * time.Second)
		require.NoError(t, err)
		require.Equal(t, "flowd.evt.e2e."+subject, msg.Subject)
		assert.Equal(t, "eu", msg.Header.Get("ce-subject"))
		var data control.EventData
		require.NoError(t, json.Unmarshal(msg.Data, &data))
		assert.Equal(t, "eu", data.Pipeline)
		return data
	}

	p, err := producer.New("pipeline-test-producers", producer.WithClientOptions(client.WithNameServers(d.namesrv), client.WithLogger(quietLog())))
	require.NoError(t, err)
	require.NoError(t, p.Start(context.Background()))
	defer p.Close(context.Background())
	for _, o := range []struct{ body, region string }{{"o1", "eu"}, {"o2", "us"}, {"o3", "eu"}, {"o4", "us"}} {
		sendOrder(t, p, o.body, o.region)
	}

	c, err := consumer.NewLitePull("pipeline-test-readers", consumer.WithClientOptions(client.WithNameServers(d.namesrv), client.WithLogger(quietLog())),
		consumer.WithConsumeFrom(consumer.ConsumeFromFirst), consumer.WithPollTimeout(100*time.Millisecond),
		consumer.WithPullDelays(10*time.Millisecond, 10*time.Millisecond, 20*time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, c.Subscribe("eu-orders", "*"))
	require.NoError(t, c.Start(context.Background()))
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Close(ctx)
	}()
	var got bodies
	pollUntil(t, c, got.add, func() bool { return got.has("o1", "o3") })

	// Paused, the pipeline leaves new messages in the source topic: the queue's lag shows
	// them, and nothing more is counted in.
	out, err = cli(t, "", append([]string{"pipeline", "pause", "eu"}, ctl...)...)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^eu\s+paused\s`, out)
	nextEvent(control.EventPipelinePaused)
	var list control.PipelineListReply
	raw, err := cli(t, "", append([]string{"pipeline", "list", "eu", "--json"}, ctl...)...)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal([]byte(raw), &list))
	require.Len(t, list.Pipelines, 1)
	in := list.Pipelines[0].Counters.In
	assert.Equal(t, uint64(2), list.Pipelines[0].Counters.Out, "the selector admitted o1 and o3 only")
	// A paused pipeline commits nothing: its lag moves only with what arrives. (Rejected US
	// orders are committed past once the consumer learns the broker skipped them, which a
	// parked pull tells at the latest at its suspend timeout: the lag before o5 may count
	// some of them, or be -1 for a queue nothing was committed in yet.)
	lagOf := func(l control.PipelineListReply) (lag int64) {
		for _, q := range l.Pipelines[0].Queues {
			lag += max(q.Lag, 0)
		}
		return lag
	}
	before := lagOf(list)
	sendOrder(t, p, "o5", "eu")
	require.Eventually(t, func() bool {
		raw, err := cli(t, "", append([]string{"pipeline", "list", "eu", "--json"}, ctl...)...)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal([]byte(raw), &list))
		return lagOf(list) == before+1
	}, 10*time.Second, 20*time.Millisecond, "the paused pipeline's lag counts o5: %+v", &list)
	assert.Equal(t, pipeline.StatePaused, list.Pipelines[0].State)
	assert.Equal(t, in, list.Pipelines[0].Counters.In, "a paused pipeline polls nothing")

	out, err = cli(t, "", append([]string{"pipeline", "resume", "eu"}, ctl...)...)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^eu\s+running\s`, out)
	nextEvent(control.EventPipelineResumed)
	pollUntil(t, c, got.add, func() bool { return got.has("o5") })
	assert.Equal(t, []string{"o1", "o3", "o5"}, got.list(), "only the EU orders arrived")

	// Seeking to the first message delivers the EU orders again (at least once).
	out, err = cli(t, "", append([]string{"pipeline", "seek", "eu", "first"}, ctl...)...)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^eu\s+running\s`, out)
	pollUntil(t, c, got.add, func() bool { return got.count("o1") == 2 && got.count("o5") == 2 })
	assert.Zero(t, got.count("o2")+got.count("o4"), "the selector still applies")

	_, err = cli(t, "", append([]string{"pipeline", "pause", "nope"}, ctl...)...)
	require.ErrorContains(t, err, "404")
	_, err = cli(t, "", append([]string{"pipeline", "seek", "eu", "offset"}, ctl...)...)
	require.ErrorContains(t, err, `field "queue"`)

	// A reload that changes the pipeline restarts it with the new definition: from its
	// committed offsets, so only what arrives now and matches the new selector is copied.
	cfgFile := filepath.Join(dir, "flowd.yaml")
	rawCfg, err := os.ReadFile(cfgFile)
	require.NoError(t, err)
	usPipeline := strings.Replace(euPipeline, "region = 'eu'", "region = 'us'", 1)
	require.NoError(t, os.WriteFile(cfgFile, []byte(strings.Replace(string(rawCfg), euPipeline, usPipeline, 1)), 0o600))
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	nextEvent(control.EventPipelineStopped)
	nextEvent(control.EventPipelineStarted)
	out, err = cli(t, "", append([]string{"pipeline", "list", "eu", "--json"}, ctl...)...)
	require.NoError(t, err)
	assert.Contains(t, out, `region = 'us'`)
	sendOrder(t, p, "o6", "us")
	sendOrder(t, p, "o7", "eu")
	sendOrder(t, p, "o8", "us")
	pollUntil(t, c, got.add, func() bool { return got.has("o8") })

	// A reload that removes the pipeline stops it, draining; the broker keeps serving.
	require.NoError(t, os.WriteFile(cfgFile, []byte(strings.Replace(string(rawCfg), euPipeline, "pipelines: []\n", 1)), 0o600))
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	nextEvent(control.EventPipelineStopped)
	out, err = cli(t, "", append([]string{"pipeline", "list"}, ctl...)...)
	require.NoError(t, err)
	assert.NotContains(t, out, "eu-orders")
	assert.NotContains(t, got.list(), "o7")
	_, err = p.Send(context.Background(), &producer.Message{Topic: "orders", Body: []byte("o9")})
	require.NoError(t, err, "the broker serves on")
}

// SIGTERM (here: the end of serve's context) drains the pipelines before the broker stops:
// pipeline.stopped is published before broker.stopping.
func TestServeDrainsPipelinesBeforeTheBrokerStops(t *testing.T) {
	dir := t.TempDir()
	first := startServedIn(t, dir, "cluster: e2e\n")
	_, err := cli(t, "", "topic", "create", "orders", "--nats", first.nats, "--cluster", "e2e")
	require.NoError(t, err)
	_, err = cli(t, "", "topic", "create", "eu-orders", "--nats", first.nats, "--cluster", "e2e")
	require.NoError(t, err)
	first.stop()
	d := startServedIn(t, dir, "cluster: e2e\n"+euPipeline)
	nc, err := nats.Connect(d.nats)
	require.NoError(t, err)
	defer nc.Close()
	ch := make(chan *nats.Msg, 64)
	_, err = nc.ChanSubscribe("flowd.evt.e2e.>", ch)
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	d.stop()
	var subjects []string
	for len(subjects) == 0 || subjects[len(subjects)-1] != "flowd.evt.e2e.broker.stopping" {
		select {
		case m := <-ch:
			subjects = append(subjects, m.Subject)
		case <-time.After(10 * time.Second):
			t.Fatalf("no broker.stopping event; got %v", subjects)
		}
	}
	require.Contains(t, subjects, "flowd.evt.e2e.pipeline.stopped")
	assert.Less(t, slices.Index(subjects, "flowd.evt.e2e.pipeline.stopped"), slices.Index(subjects, "flowd.evt.e2e.broker.stopping"))
	assert.Contains(t, d.logs.String(), "pipeline stopped")
}

// A pipeline of the configuration whose sink topic does not exist does not start: the log
// and the pipeline.failed event name the topic and the field that creates it. With that
// field, the next reload creates the topic and starts the pipeline.
func TestServeRefusesAPipelineWhoseSinkTopicDoesNotExist(t *testing.T) {
	dir := t.TempDir()
	d := startServedIn(t, dir, "cluster: e2e\n")
	ctl := []string{"--nats", d.nats, "--cluster", "e2e"}
	_, err := cli(t, "", append([]string{"topic", "create", "orders"}, ctl...)...)
	require.NoError(t, err)
	nc, err := nats.Connect(d.nats)
	require.NoError(t, err)
	defer nc.Close()
	events, err := nc.SubscribeSync("flowd.evt.e2e.pipeline.>")
	require.NoError(t, err)
	require.NoError(t, nc.Flush())

	cfgFile := filepath.Join(dir, "flowd.yaml")
	rawCfg, err := os.ReadFile(cfgFile)
	require.NoError(t, err)
	typo := strings.Replace(euPipeline, "topic: eu-orders", "topic: eu-ordrs", 1)
	require.NoError(t, os.WriteFile(cfgFile, append(rawCfg, typo...), 0o600))
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	msg, err := events.NextMsg(10 * time.Second)
	require.NoError(t, err)
	require.Equal(t, "flowd.evt.e2e.pipeline.failed", msg.Subject)
	var data control.EventData
	require.NoError(t, json.Unmarshal(msg.Data, &data))
	assert.Contains(t, data.Reason, `topic "eu-ordrs" does not exist`)
	assert.Contains(t, data.Reason, "sink.create_queues")
	assert.Contains(t, d.logs.String(), `topic \"eu-ordrs\" does not exist`)
	out, err := cli(t, "", append([]string{"topic", "describe", "eu-ordrs"}, ctl...)...)
	require.ErrorContains(t, err, "404", "nothing created the topic: %s", out)

	create := strings.Replace(typo, "topic: eu-ordrs}", "topic: eu-ordrs, create_queues: 2}", 1)
	require.NoError(t, os.WriteFile(cfgFile, append(rawCfg, create...), 0o600))
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	msg, err = events.NextMsg(10 * time.Second)
	require.NoError(t, err)
	require.Equal(t, "flowd.evt.e2e.pipeline.started", msg.Subject)
	out, err = cli(t, "", append([]string{"topic", "describe", "eu-ordrs", "--json"}, ctl...)...)
	require.NoError(t, err)
	var desc control.TopicDescribeReply
	require.NoError(t, json.Unmarshal([]byte(out), &desc), out)
	assert.Len(t, desc.Queues, 2)
}

// config validate refuses a pipeline definition in error, naming its field.
func TestConfigValidateNamesAPipelineField(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte(`pipelines:
  - name: eu
    topics: [orders]
    selector: {type: SQL92}
    sink: {type: topic, topic: eu-orders}
`), 0o600))
	var out syncBuffer
	err := run(context.Background(), []string{"config", "validate", bad}, &out, &out)
	require.ErrorIs(t, err, config.ErrInvalid)
	assert.Contains(t, err.Error(), "pipelines[0].selector.expression: required for type SQL92")

	out2, err := cli(t, "", "config", "defaults")
	require.NoError(t, err)
	assert.Contains(t, out2, "pipelines: []")
}

// pipeline list writes a lag it cannot know as a word, not a bare dash, and says why below
// the table.
func TestPipelineListSaysWhenTheLagIsUnknown(t *testing.T) {
	q := func(lag int64) pipeline.QueueStatus {
		return pipeline.QueueStatus{Queue: consumer.MessageQueue{Topic: "orders"}, Committed: -1, Lag: lag}
	}
	sink := pipeline.Definition{Topics: []string{"orders"}, Sink: pipeline.SinkDefinition{Type: pipeline.SinkStdout}}
	var out strings.Builder
	printPipelines(&out,
		pipeline.Status{Name: "known", State: pipeline.StateRunning, Queues: []pipeline.QueueStatus{q(2), q(3)}, Definition: sink},
		pipeline.Status{Name: "fresh", State: pipeline.StateRunning, Queues: []pipeline.QueueStatus{q(1), q(-1)}, Definition: sink},
		pipeline.Status{Name: "gone", State: pipeline.StateFailed, Err: "boom", Definition: sink},
	)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 5, out.String())
	assert.Regexp(t, `^known\s.*\s5$`, lines[1])
	assert.Regexp(t, `^fresh\s.*\sunknown$`, lines[2])
	assert.Regexp(t, `^gone\s.*\sunknown$`, lines[3])
	assert.NotRegexp(t, `(?m)\s-\s*$`, out.String())
	assert.Equal(t, "LAG unknown: a queue with no committed offset yet, a source on another flowd (source_name_servers), or a pipeline not running", lines[4])
}
