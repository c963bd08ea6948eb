package pipeline_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/consumer/allocate"
	"github.com/flowd-io/flowd/pipeline"
	"github.com/flowd-io/flowd/producer"
)

// A topic sink with name servers of its own writes to that (remote) cluster, keeping keys,
// tags and properties; a file sink appends JSON lines, binary bodies in base64.
func TestRemoteTopicAndFileSinks(t *testing.T) {
	local := startBroker(t, nil)
	remote := startBroker(t, nil)
	createTopic(t, local, "src", 2)
	createTopic(t, remote, "mirror", 2)
	path := filepath.Join(t.TempDir(), "out.jsonl")
	m := newManager(t, local, nil)
	ctx := context.Background()
	require.NoError(t, m.Start(ctx, pipeline.Definition{
		Name: "mirror", Topics: []string{"src"}, StartFrom: pipeline.StartFirst,
		Sink: pipeline.SinkDefinition{Type: pipeline.SinkTopic, Topic: "mirror", NameServers: []string{remote.NamesrvAddr()}},
	}))
	require.NoError(t, m.Start(ctx, pipeline.Definition{
		Name: "tofile", Topics: []string{"src"}, StartFrom: pipeline.StartFirst,
		Sink: pipeline.SinkDefinition{Type: pipeline.SinkFile, Path: path},
	}))
	p := newProducer(t, local)
	for i := range 6 {
		send(t, p, &producer.Message{Topic: "src", Tags: "t", Keys: []string{fmt.Sprint("k", i)},
			Properties: map[string]string{"i": fmt.Sprint(i)}, Body: []byte{0xff, byte(i)}})
	}
	got := readTopic(t, remote, "mirror", "mirror-check", 6)
	for _, msg := range got {
		i := int(msg.Body[1])
		assert.Equal(t, []byte{0xff, byte(i)}, msg.Body)
		assert.Equal(t, "t", msg.Tags)
		assert.Equal(t, []string{fmt.Sprint("k", i)}, msg.Keys)
		assert.Equal(t, fmt.Sprint(i), msg.Properties()["i"])
	}

	var recs []pipeline.Record
	require.Eventually(t, func() bool {
		f, err := os.Open(path)
		if err != nil {
			return false
		}
		defer f.Close()
		recs = recs[:0]
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var raw map[string]any
			require.NoError(t, json.Unmarshal(sc.Bytes(), &raw))
			require.Contains(t, raw, "body_base64", "a binary body is written in base64")
			var r pipeline.Record
			require.NoError(t, json.Unmarshal(sc.Bytes(), &r))
			recs = append(recs, r)
		}
		return len(recs) == 6
	}, wait, 10*time.Millisecond)
	for _, r := range recs {
		assert.Equal(t, []byte{0xff, byte(r.Properties["i"][0] - '0')}, r.Body)
		assert.Equal(t, "src", r.Topic)
	}
}

// A subject no stream holds is published on core NATS (flushed before it counts).
func TestCoreNATSSink(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "plain", 1)
	nc := startNATS(t)
	sub, err := nc.SubscribeSync("plain.out")
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	m := newManager(t, b, func(o *pipeline.Options) { o.NATS = nc })
	require.NoError(t, m.Start(context.Background(), pipeline.Definition{
		Name: "plain", Topics: []string{"plain"}, StartFrom: pipeline.StartFirst,
		Sink: pipeline.SinkDefinition{Type: pipeline.SinkNATS, Subject: "plain.out"},
	}))
	send(t, newProducer(t, b), &producer.Message{Topic: "plain", Tags: "x", Properties: map[string]string{"color": "red"}, Body: []byte("hi")})
	msg, err := sub.NextMsg(wait)
	require.NoError(t, err)
	assert.Equal(t, "hi", string(msg.Data))
	assert.Equal(t, "red", msg.Header.Get("color"))
	assert.Equal(t, "x", msg.Header.Get("Flowd-Tags"))
	assert.Empty(t, msg.Header.Get(nats.MsgIdHdr), "core NATS publishes carry no JetStream id")
}

// What a definition names must resolve: transforms and non-built-in allocators through the
// Manager's resolvers, NATS sinks through its connection.
func TestStartResolvesNamedResources(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "res", 1)
	var asked []string
	m := newManager(t, b, func(o *pipeline.Options) {
		o.Allocators = func(name string) (allocate.Strategy, error) {
			asked = append(asked, name)
			if name == "my-alloc" {
				return allocate.Averagely(), nil
			}
			return nil, errors.New("unknown")
		}
	})
	ctx := context.Background()
	def := pipeline.Definition{Name: "p", Sink: pipeline.SinkDefinition{Type: pipeline.SinkStdout}}
	def.Topics = []string{"res"}
	def.Transforms = []string{"redact"}
	require.ErrorIs(t, m.Start(ctx, def), pipeline.ErrUnavailable, "no transform resolver")
	def.Transforms = nil
	def.Sink = pipeline.SinkDefinition{Type: pipeline.SinkNATS, Subject: "s"}
	require.ErrorIs(t, m.Start(ctx, def), pipeline.ErrUnavailable, "no NATS connection")
	def.Sink = pipeline.SinkDefinition{Type: pipeline.SinkStdout}
	def.Allocator = "nope"
	require.ErrorIs(t, m.Start(ctx, def), pipeline.ErrUnavailable)
	def.Allocator = "my-alloc"
	require.NoError(t, m.Start(ctx, def))
	assert.Equal(t, []string{"nope", "my-alloc"}, asked)
	list, err := m.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, pipeline.StateRunning, list[0].State)
	assert.Equal(t, "pipeline-p", list[0].Definition.Group)
}

// A topic sink's topic must exist: a pipeline whose sink names one that does not (a typo)
// does not start, the error naming the topic and the field that would create it, and
// nothing creates the topic.
func TestTopicSinkRefusesATopicThatDoesNotExist(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "orders", 1)
	m := newManager(t, b, nil)
	ctx := context.Background()
	err := m.Start(ctx, pipeline.Definition{
		Name: "typo", Topics: []string{"orders"}, StartFrom: pipeline.StartFirst,
		Sink: pipeline.SinkDefinition{Type: pipeline.SinkTopic, Topic: "eu-ordrs"},
	})
	require.ErrorIs(t, err, pipeline.ErrUnavailable)
	require.ErrorIs(t, err, pipeline.ErrNoSinkTopic)
	assert.Contains(t, err.Error(), `start typo: topic sink eu-ordrs: `)
	assert.Contains(t, err.Error(), `topic "eu-ordrs" does not exist`)
	assert.Contains(t, err.Error(), "sink.create_queues")
	list, err := m.List(ctx)
	require.NoError(t, err)
	assert.Empty(t, list, "the pipeline did not start")
	_, ok := b.Topic("eu-ordrs")
	assert.False(t, ok, "the missing topic was not created")
}

// sink.create_queues has a topic that does not exist created at start, with that many
// queues, on the sink's cluster (here a remote one); an existing topic is left as it is.
func TestTopicSinkCreatesItsTopicWhenAsked(t *testing.T) {
	local := startBroker(t, nil)
	remote := startBroker(t, nil)
	createTopic(t, local, "orders", 1)
	createTopic(t, local, "existing", 2)
	m := newManager(t, local, nil)
	ctx := context.Background()
	require.NoError(t, m.Start(ctx, pipeline.Definition{
		Name: "create", Topics: []string{"orders"}, StartFrom: pipeline.StartFirst,
		Sink: pipeline.SinkDefinition{Type: pipeline.SinkTopic, Topic: "eu-orders", CreateQueues: 3, NameServers: []string{remote.NamesrvAddr()}},
	}))
	qs, err := remote.TopicQueues("eu-orders")
	require.NoError(t, err, "created at start, before any message")
	assert.Len(t, qs, 3)
	_, ok := local.Topic("eu-orders")
	assert.False(t, ok, "created on the sink's cluster only")
	send(t, newProducer(t, local), &producer.Message{Topic: "orders", Body: []byte("o1")})
	got := readTopic(t, remote, "eu-orders", "eu-check", 1)
	assert.Equal(t, "o1", string(got[0].Body))

	require.NoError(t, m.Start(ctx, pipeline.Definition{
		Name: "keep", Topics: []string{"orders"},
		Sink: pipeline.SinkDefinition{Type: pipeline.SinkTopic, Topic: "existing", CreateQueues: 5},
	}))
	qs, err = local.TopicQueues("existing")
	require.NoError(t, err)
	assert.Len(t, qs, 2, "an existing topic keeps its queues")
}
