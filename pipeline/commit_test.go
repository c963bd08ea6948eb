package pipeline_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/pipeline"
	"github.com/flowd-io/flowd/producer"
)

// toQueue sends each message to the queue whose id its "q" property names.
type toQueue struct{}

func (toQueue) Select(m *producer.Message, qs []producer.MessageQueue) producer.MessageQueue {
	id, _ := strconv.Atoi(m.Properties["q"])
	for _, q := range qs {
		if q.QueueID == id {
			return q
		}
	}
	return qs[0]
}

func newQueueProducer(t testing.TB, b *broker.Broker) *producer.Producer {
	t.Helper()
	p, err := producer.New("queue-producers", producer.WithClientOptions(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet())),
		producer.WithQueueSelector(toQueue{}))
	require.NoError(t, err)
	require.NoError(t, p.Start(context.Background()))
	t.Cleanup(func() { p.Close(context.Background()) })
	return p
}

func sendTo(t testing.TB, p *producer.Producer, topic string, queue int, body string) {
	t.Helper()
	send(t, p, &producer.Message{Topic: topic, Body: []byte(body), Properties: map[string]string{"q": strconv.Itoa(queue)}})
}

// spreadTopic returns a topic name (prefix-<n>) whose queues 0..queues-1 a pipeline with
// workers workers spreads over as many workers as it can, so that no two of them wait for
// each other on a worker.
func spreadTopic(prefix string, queues, workers int) string {
	for i := 0; ; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		on := map[int]bool{}
		for q := range queues {
			on[pipeline.WorkerOf(consumer.MessageQueue{Topic: name, BrokerName: "broker-a", QueueID: q}, workers)] = true
		}
		if len(on) == min(queues, workers) {
			return name
		}
	}
}

// A commit the broker is slow to take holds up its own queue only: while the commit of queue
// 0 is held back, the worker of queue 1 delivers and commits, and a seek of queue 1 is done.
// (They used to wait for it: the pipeline committed and sought under one lock, and its
// consumer sent one commit at a time.)
func TestSlowCommitHoldsUpOnlyItsQueue(t *testing.T) {
	b, px := startBrokerBehindProxy(t)
	topic := spreadTopic("slowcommit", 2, 2)
	createTopic(t, b, topic, 2)
	var out lines
	m := newManager(t, b, func(o *pipeline.Options) {
		o.Stdout = &out
		// A held commit must not time out and so let the others go by.
		o.ConsumerOptions = append(o.ConsumerOptions, consumer.WithClientOptions(client.WithRequestTimeout(10*wait)))
	})
	def := pipeline.Definition{Name: "slowcommit", Topics: []string{topic}, StartFrom: pipeline.StartFirst,
		Parallelism: 2, Sink: pipeline.SinkDefinition{Type: pipeline.SinkStdout}}
	ctx := context.Background()
	require.NoError(t, m.Start(ctx, def))
	require.Eventually(t, func() bool { return len(ownedSource(m, "slowcommit", topic)) == 2 }, wait, 10*time.Millisecond)
	p := newQueueProducer(t, b)

	release := px.holdCommits(topic, 0)
	t.Cleanup(release) // before the manager's Close, which commits
	sendTo(t, p, topic, 0, "q0")
	select {
	case off := <-px.held:
		require.EqualValues(t, 1, off)
	case <-time.After(wait):
		t.Fatal("queue 0 was never committed")
	}

	sendTo(t, p, topic, 1, "q1")
	require.Eventually(t, func() bool { return px.committedOffset(topic, 1) == 1 }, wait, 10*time.Millisecond,
		"queue 1 is committed while queue 0's commit is held")
	q1 := consumer.MessageQueue{Topic: topic, BrokerName: "broker-a", QueueID: 1}
	sctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	require.NoError(t, m.Seek(sctx, "slowcommit", pipeline.SeekRequest{Queue: &q1, Position: pipeline.SeekOffset, Offset: 0}),
		"a seek of queue 1 while queue 0's commit is held")
	require.Eventually(t, func() bool { return bodies(out.records())["q1"] == 2 }, wait, 10*time.Millisecond,
		"queue 1 read again from the offset sought")

	release()
	require.Eventually(t, func() bool {
		st, err := m.Get(ctx, "slowcommit")
		if err != nil {
			return false
		}
		done := 0
		for _, qs := range st.Queues {
			if qs.Queue.Topic == topic && qs.Committed == 1 {
				done++
			}
		}
		return done == 2
	}, wait, 10*time.Millisecond, "both queues committed past their message")
	require.Equal(t, map[string]int{"q0": 1, "q1": 2}, bodies(out.records()))
}

// bodies counts the records of each body.
func bodies(recs []pipeline.Record) map[string]int {
	n := map[string]int{}
	for _, r := range recs {
		n[string(r.Body)]++
	}
	return n
}
