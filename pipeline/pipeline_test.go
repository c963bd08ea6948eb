package pipeline_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/pipeline"
	"github.com/flowd-io/flowd/producer"
)

// One source topic, a SQL92 selector and the Wasm redact transform, into another topic and
// into a NATS subject held by a JetStream stream: only matching messages arrive, redacted,
// with their keys and properties.
func TestFilterAndTransformIntoTopicAndNATS(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "payments", 2)
	createTopic(t, b, "payments-clean", 2)
	nc := startNATS(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "PAY", Subjects: []string{"pay.clean"}})
	require.NoError(t, err)

	redact := redactTransform(t, "card")
	var events []pipeline.Event
	var evMu sync.Mutex
	m := newManager(t, b, func(o *pipeline.Options) {
		o.NATS = nc
		o.Transforms = func(name string) (pipeline.Transformer, error) {
			if name != "redact" {
				return nil, errors.New("no such plugin")
			}
			return redact, nil
		}
		o.OnEvent = func(e pipeline.Event) {
			evMu.Lock()
			defer evMu.Unlock()
			events = append(events, e)
		}
	})
	base := pipeline.Definition{
		Topics:     []string{"payments"},
		Selector:   pipeline.Selector{Type: pipeline.SelectorSQL92, Expression: "amount >= 100"},
		Transforms: []string{"redact"},
		StartFrom:  pipeline.StartFirst,
	}
	toTopic := base
	toTopic.Name = "to-topic"
	toTopic.Sink = pipeline.SinkDefinition{Type: pipeline.SinkTopic, Topic: "payments-clean"}
	toNATS := base
	toNATS.Name = "to-nats"
	toNATS.Sink = pipeline.SinkDefinition{Type: pipeline.SinkNATS, Subject: "pay.clean"}
	ctx := context.Background()
	require.NoError(t, m.Start(ctx, toTopic))
	require.NoError(t, m.Start(ctx, toNATS))
	require.ErrorIs(t, m.Start(ctx, toNATS), pipeline.ErrExists)

	p := newProducer(t, b)
	want := map[string]bool{}
	for i := range 20 {
		amount := i * 10
		send(t, p, &producer.Message{
			Topic: "payments", Tags: "pay", Keys: []string{"order-" + strconv.Itoa(i)},
			Properties: map[string]string{"amount": strconv.Itoa(amount)},
			Body:       fmt.Appendf(nil, `{"order":%d,"card":"4111-%d"}`, i, i),
		})
		if amount >= 100 {
			want[fmt.Sprintf(`{"order":%d,"card":"***"}`, i)] = true
		}
	}

	got := readTopic(t, b, "payments-clean", "checker", len(want))
	for _, msg := range got {
		assert.True(t, want[string(msg.Body)], "unexpected body %s", msg.Body)
		assert.Equal(t, "pay", msg.Tags)
		n, err := strconv.Atoi(msg.Properties()["amount"])
		require.NoError(t, err)
		assert.GreaterOrEqual(t, n, 100)
		assert.Equal(t, []string{"order-" + strconv.Itoa(n/10)}, msg.Keys)
	}

	stream, err := js.Stream(ctx, "PAY")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := stream.Info(ctx)
		return err == nil && info.State.Msgs == uint64(len(want))
	}, wait, 10*time.Millisecond)
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	batch, err := cons.Fetch(len(want), jetstream.FetchMaxWait(wait))
	require.NoError(t, err)
	seen := map[string]bool{}
	for msg := range batch.Messages() {
		seen[string(msg.Data())] = true
		assert.Equal(t, "payments", msg.Headers().Get("Flowd-Topic"))
		assert.NotEmpty(t, msg.Headers().Get("amount"), "properties travel as headers")
		assert.Contains(t, msg.Headers().Get("Flowd-Keys"), "order-")
	}
	assert.Equal(t, want, seen)

	require.Eventually(t, func() bool {
		st, err := m.Get(ctx, "to-topic")
		return err == nil && st.Counters.Out == uint64(len(want)) && st.Counters.In == uint64(len(want))
	}, wait, 10*time.Millisecond)
	require.NoError(t, m.Stop(ctx, "to-topic"))
	_, err = m.Get(ctx, "to-topic")
	require.ErrorIs(t, err, pipeline.ErrNotFound)
	evMu.Lock()
	defer evMu.Unlock()
	var kinds []string
	for _, e := range events {
		kinds = append(kinds, e.Pipeline+":"+string(e.Type))
	}
	assert.Subset(t, kinds, []string{"to-topic:started", "to-nats:started", "to-topic:stopped"})
}

// A webhook that fails twice is retried with backoff; the offset is committed only once it
// answered 2xx.
func TestWebhookRetriesThenSucceedsCommitAfterAck(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "hooks", 1)
	var calls atomic.Int32
	committedDuringFailures := make(chan int64, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var rec pipeline.Record
		if err := json.Unmarshal(body, &rec); err != nil || string(rec.Body) != "hello" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if calls.Add(1) <= 2 {
			off, ok := b.CommittedOffset("hook-group", "hooks", 0)
			if !ok {
				off = -1
			}
			committedDuringFailures <- off
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()

	m := newManager(t, b, nil)
	ctx := context.Background()
	require.NoError(t, m.Start(ctx, pipeline.Definition{
		Name: "hook", Topics: []string{"hooks"}, Group: "hook-group", StartFrom: pipeline.StartFirst,
		MaxAttempts: 5, RetryBackoff: pipeline.Duration(10 * time.Millisecond),
		Sink: pipeline.SinkDefinition{Type: pipeline.SinkWebhook, URL: srv.URL},
	}))
	send(t, newProducer(t, b), &producer.Message{Topic: "hooks", Body: []byte("hello")})

	require.Eventually(t, func() bool {
		off, ok := b.CommittedOffset("hook-group", "hooks", 0)
		return ok && off == 1
	}, wait, 10*time.Millisecond)
	assert.EqualValues(t, 3, calls.Load())
	for range 2 {
		assert.Less(t, <-committedDuringFailures, int64(1), "committed past the message before the webhook acknowledged it")
	}
	st, err := m.Get(ctx, "hook")
	require.NoError(t, err)
	assert.Equal(t, pipeline.Counters{In: 1, Out: 1, SinkErrors: 2}, st.Counters)
	require.Len(t, st.Queues, 1)
	assert.EqualValues(t, 1, st.Queues[0].Committed)
}

// A sink that always fails: after MaxAttempts the message goes to the group's retry topic,
// and after the maximum reconsume times to its dead-letter topic; the source offset moves on.
func TestAlwaysFailingSinkSendsToRetryTopic(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) { c.DelayLevels = "50ms 50ms 50ms" })
	createTopic(t, b, "doomed", 1)
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer srv.Close()
	m := newManager(t, b, nil)
	ctx := context.Background()
	require.NoError(t, m.Start(ctx, pipeline.Definition{
		Name: "doomed", Topics: []string{"doomed"}, Group: "doomed-group", StartFrom: pipeline.StartFirst,
		MaxAttempts: 2, RetryBackoff: pipeline.Duration(time.Millisecond), RetryDelayLevel: 1, MaxReconsumeTimes: 1,
		Sink: pipeline.SinkDefinition{Type: pipeline.SinkWebhook, URL: srv.URL},
	}))
	send(t, newProducer(t, b), &producer.Message{Topic: "doomed", Body: []byte("x")})

	stored := func(topic string) int64 {
		qs, err := b.TopicQueues(topic)
		if err != nil {
			return 0
		}
		var n int64
		for _, q := range qs {
			n += q.MaxOffset
		}
		return n
	}
	require.Eventually(t, func() bool { return stored("%RETRY%doomed-group") >= 1 }, wait, 10*time.Millisecond)
	require.Eventually(t, func() bool { return stored("%DLQ%doomed-group") == 1 }, wait, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		off, ok := b.CommittedOffset("doomed-group", "doomed", 0)
		return ok && off == 1
	}, wait, 10*time.Millisecond)
	st, err := m.Get(ctx, "doomed")
	require.NoError(t, err)
	assert.GreaterOrEqual(t, st.Counters.Failed, uint64(2), "sent back from the topic and again from the retry topic")
	assert.Zero(t, st.Counters.Out)
	assert.GreaterOrEqual(t, st.Counters.SinkErrors, uint64(4))
}

// A queue whose every message the selector rejects is committed past them all the same: the
// group's lag on it goes to 0 rather than staying unknown, and a later match still arrives.
func TestSelectorRejectingEverythingStillCommits(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "rejected", 2)
	var out lines
	m := newManager(t, b, func(o *pipeline.Options) {
		o.Stdout = &out
		// A parked pull moves past rejected arrivals on the broker and tells the consumer
		// where it got to when it answers: at the latest at its suspend timeout.
		o.ConsumerOptions = append(o.ConsumerOptions, consumer.WithBrokerSuspend(200*time.Millisecond))
	})
	ctx := context.Background()
	require.NoError(t, m.Start(ctx, pipeline.Definition{
		Name: "rejecting", Topics: []string{"rejected"}, Group: "rejecting-group", StartFrom: pipeline.StartFirst,
		Selector: pipeline.Selector{Type: pipeline.SelectorSQL92, Expression: "amount > 1000"},
		Sink:     pipeline.SinkDefinition{Type: pipeline.SinkStdout},
	}))
	p := newProducer(t, b)
	for i := range 20 {
		send(t, p, &producer.Message{Topic: "rejected", Properties: map[string]string{"amount": strconv.Itoa(i)}, Body: []byte("small")})
	}
	ends := func() (n int64) {
		qs, err := b.TopicQueues("rejected")
		require.NoError(t, err)
		for _, q := range qs {
			n += q.MaxOffset
		}
		return n
	}
	require.Eventually(t, func() bool { return ends() == 20 }, wait, time.Millisecond)
	caughtUp := func() bool {
		st, err := m.Get(ctx, "rejecting")
		if err != nil || len(st.Queues) != 2 {
			return false
		}
		for _, q := range st.Queues {
			if q.Lag != 0 {
				return false
			}
		}
		return true
	}
	require.Eventually(t, caughtUp, wait, 10*time.Millisecond)
	var committed int64
	for q := range 2 {
		off, ok := b.CommittedOffset("rejecting-group", "rejected", int32(q))
		require.True(t, ok, "queue %d committed", q)
		committed += off
	}
	assert.EqualValues(t, 20, committed)
	assert.Zero(t, out.len())

	send(t, p, &producer.Message{Topic: "rejected", Properties: map[string]string{"amount": "5000"}, Body: []byte("big")})
	require.Eventually(t, func() bool { return out.len() == 1 && caughtUp() }, wait, 10*time.Millisecond)
	assert.Equal(t, "big", string(out.records()[0].Body))
}

// A pipeline started before its source topic exists reads the topic once it is created,
// without waiting for a metadata check, a rebalance or a route refresh (an hour here). (The
// consumer's TestTopicCreatedAfterStartIsReadPromptly pins the timing down: here the first
// rebalance may still be running when the topic appears.)
func TestSourceTopicCreatedAfterStart(t *testing.T) {
	b := startBroker(t, nil)
	var out lines
	m := newManager(t, b, func(o *pipeline.Options) {
		o.Stdout = &out
		o.ConsumerOptions = append(o.ConsumerOptions, consumer.WithTopicMetadataCheckInterval(time.Hour),
			consumer.WithRebalanceInterval(time.Hour), consumer.WithClientOptions(client.WithRouteRefreshInterval(time.Hour)))
	})
	ctx := context.Background()
	require.NoError(t, m.Start(ctx, pipeline.Definition{
		Name: "early", Topics: []string{"late-source"}, Group: "early-group", StartFrom: pipeline.StartFirst,
		Sink: pipeline.SinkDefinition{Type: pipeline.SinkStdout},
	}))
	createTopic(t, b, "late-source", 2)
	send(t, newProducer(t, b), &producer.Message{Topic: "late-source", Body: []byte("first")})
	require.Eventually(t, func() bool { return out.len() == 1 }, wait, 10*time.Millisecond)
	assert.Equal(t, "first", string(out.records()[0].Body))
}
