package pipeline_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/pipeline"
	"github.com/flowd-io/flowd/producer"
)

type pos struct {
	queue  int32
	offset int64
}

// A pipeline killed mid-way (its context cancelled while the sink holds a delivery) commits
// only what the sink acknowledged; restarted, it resumes from there: no message is lost,
// and what is delivered again is the uncommitted window (at most one batch per queue): the
// records acknowledged and not committed, and the delivery in progress at the kill, which
// the sink may have received although its answer never reached the pipeline.
func TestKillAndRestartResumesFromCommitted(t *testing.T) {
	const queues, batch, total, ackedBeforeKill = 2, 4, 40, 10
	b := startBroker(t, nil)
	createTopic(t, b, "kill", queues)
	p := newProducer(t, b)
	for i := range total {
		send(t, p, &producer.Message{Topic: "kill", Body: fmt.Appendf(nil, "m-%d", i)})
	}

	// Each run's deliveries carry its number in a header: a request the killed run wrote
	// before the kill may reach the handler only after the restart.
	var mu sync.Mutex
	received := map[pos]int{} // what the webhook received, answered or not
	acked := map[pos]bool{}   // what it answered 2xx
	var ackedRun1, heldRun1 []pos
	resumedAt := map[int32]int64{} // the lowest offset of each queue run 2 delivered
	blocked := make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var rec pipeline.Record
		if err := json.Unmarshal(body, &rec); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		k := pos{rec.QueueID, rec.QueueOffset}
		mu.Lock()
		received[k]++
		if r.Header.Get("X-Run") == "1" {
			if len(ackedRun1) >= ackedBeforeKill {
				// The webhook has the record but answers only when the pipeline is gone:
				// the delivery in progress at the kill.
				heldRun1 = append(heldRun1, k)
				mu.Unlock()
				blocked <- struct{}{}
				<-r.Context().Done()
				return
			}
			ackedRun1 = append(ackedRun1, k)
		} else if first, ok := resumedAt[k.queue]; !ok || k.offset < first {
			resumedAt[k.queue] = k.offset
		}
		acked[k] = true
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()

	stopped := make(chan pipeline.Event, 4)
	m := newManager(t, b, func(o *pipeline.Options) {
		o.OnEvent = func(e pipeline.Event) {
			if e.Type == pipeline.EventStopped {
				stopped <- e
			}
		}
	})
	def := pipeline.Definition{
		Name: "killme", Topics: []string{"kill"}, Group: "kill-group", StartFrom: pipeline.StartFirst,
		Parallelism: 2, PullBatchSize: batch,
		Sink: pipeline.SinkDefinition{Type: pipeline.SinkWebhook, URL: srv.URL, Headers: map[string]string{"X-Run": "1"}},
	}
	ctx, kill := context.WithCancel(context.Background())
	require.NoError(t, m.Start(ctx, def))
	select {
	case <-blocked:
	case <-time.After(wait):
		t.Fatal("the sink was never reached after the first acknowledgements")
	}
	kill()
	select {
	case e := <-stopped:
		assert.ErrorIs(t, e.Err, context.Canceled, "a killed pipeline says why it stopped")
	case <-time.After(wait):
		t.Fatal("no stopped event after the kill")
	}
	st, err := m.Get(context.Background(), "killme")
	require.NoError(t, err)
	assert.Equal(t, pipeline.StateStopped, st.State)

	// What is committed was acknowledged: every offset below a queue's committed offset.
	mu.Lock()
	committed := map[int32]int64{}
	for q := range int32(queues) {
		off, ok := b.CommittedOffset("kill-group", "kill", q)
		if !ok {
			off = 0
		}
		committed[q] = off
		for o := range off {
			assert.True(t, acked[pos{q, o}], "queue %d offset %d committed but never acknowledged", q, o)
		}
	}
	uncommittedAcked := 0
	for _, k := range ackedRun1 {
		if k.offset >= committed[k.queue] {
			uncommittedAcked++
		}
	}
	mu.Unlock()
	assert.LessOrEqual(t, uncommittedAcked, queues*batch, "the uncommitted window is one batch per queue")

	def.Sink.Headers = map[string]string{"X-Run": "2"}
	require.NoError(t, m.Start(context.Background(), def))
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) == total
	}, wait, 10*time.Millisecond, "every message is delivered and acknowledged")
	require.Eventually(t, func() bool {
		for q := range int32(queues) {
			if off, ok := b.CommittedOffset("kill-group", "kill", q); !ok || off != total/queues {
				return false
			}
		}
		return true
	}, wait, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	dups := 0
	var twice []pos
	for k, n := range received {
		dups += n - 1
		if n > 1 {
			twice = append(twice, k)
		}
	}
	// The restart resumes each queue from its committed offset: what is delivered again is
	// exactly what run 1 acknowledged, or was delivering when it was killed, at or above it.
	// (The committed offset is compared as the restart found it: a commit that run 1 sent
	// while it was killed may still land after the snapshot above.)
	again := 0
	for _, k := range append(slices.Clone(ackedRun1), heldRun1...) {
		if first, ok := resumedAt[k.queue]; ok && k.offset >= first {
			again++
		}
	}
	assert.LessOrEqual(t, len(heldRun1), queues, "a queue has one delivery in progress at a time: held %v", heldRun1)
	assert.Equal(t, again, dups, "only what was acknowledged or in progress, and not committed, is delivered again: delivered more than once %v; acknowledged in run 1 %v; in progress at the kill %v; committed at the kill %v; resumed at %v",
		twice, ackedRun1, heldRun1, committed, resumedAt)
	assert.LessOrEqual(t, dups, queues*batch, "duplicates stay within the uncommitted window")
}

// ownedSource returns the source-topic queues a pipeline owns now.
func ownedSource(m *pipeline.Manager, name, topic string) []consumer.MessageQueue {
	st, err := m.Get(context.Background(), name)
	if err != nil {
		return nil
	}
	var out []consumer.MessageQueue
	for _, q := range st.Queues {
		if q.Queue.Topic == topic {
			out = append(out, q.Queue)
		}
	}
	return out
}

// Two managers run the same pipeline: they split its queues, and when one stops the other
// takes them all, with no message delivered twice.
func TestTwoManagersSplitQueuesAndHandOver(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "shared", 4)
	p := newProducer(t, b)
	var outA, outB lines
	ma := newManager(t, b, func(o *pipeline.Options) { o.Stdout = &outA })
	mb := newManager(t, b, func(o *pipeline.Options) { o.Stdout = &outB })
	def := pipeline.Definition{
		Name: "fanin", Topics: []string{"shared"}, Group: "shared-group", StartFrom: pipeline.StartFirst,
		Parallelism: 2, PullBatchSize: 4, Sink: pipeline.SinkDefinition{Type: pipeline.SinkStdout},
	}
	ctx := context.Background()
	produceN := func(prefix string, n int) {
		for i := range n {
			send(t, p, &producer.Message{Topic: "shared", Body: fmt.Appendf(nil, "%s-%d", prefix, i)})
		}
	}
	delivered := func() int { return outA.len() + outB.len() }

	require.NoError(t, ma.Start(ctx, def))
	require.Eventually(t, func() bool { return len(ownedSource(ma, "fanin", "shared")) == 4 }, wait, 10*time.Millisecond)
	produceN("a", 20)
	require.Eventually(t, func() bool { return delivered() == 20 }, wait, 10*time.Millisecond)

	// A's sink holds its deliveries while B joins: the queues taken from A move only after
	// A delivered and committed what it had polled of them.
	release := outA.hold()
	produceN("h", 40)
	<-outA.held
	require.NoError(t, mb.Start(ctx, def))
	require.Eventually(t, func() bool { return len(ownedSource(ma, "fanin", "shared")) == 2 }, wait, 10*time.Millisecond, "A gives up two queues")
	release()
	require.Eventually(t, func() bool {
		return len(ownedSource(ma, "fanin", "shared")) == 2 && len(ownedSource(mb, "fanin", "shared")) == 2
	}, wait, 10*time.Millisecond, "the managers split the queues")
	produceN("b", 40)
	require.Eventually(t, func() bool { return outB.len() > 0 && delivered() >= 100 }, wait, 10*time.Millisecond)

	produceN("c", 40) // some of these are in flight in A when it stops
	require.NoError(t, ma.Stop(ctx, "fanin"))
	require.Eventually(t, func() bool { return len(ownedSource(mb, "fanin", "shared")) == 4 }, wait, 10*time.Millisecond)
	produceN("d", 20)
	require.Eventually(t, func() bool { return delivered() >= 160 }, wait, 10*time.Millisecond)

	seen := map[pos]string{}
	for who, l := range map[string]*lines{"A": &outA, "B": &outB} {
		for _, r := range l.records() {
			k := pos{r.QueueID, r.QueueOffset}
			if prev, dup := seen[k]; dup {
				t.Errorf("queue %d offset %d delivered by %s and %s", k.queue, k.offset, prev, who)
			}
			seen[k] = who
		}
	}
	assert.Len(t, seen, 160)
	for q := range int32(4) {
		require.Eventually(t, func() bool {
			st, err := mb.Get(ctx, "fanin")
			if err != nil {
				return false
			}
			for _, qs := range st.Queues {
				if qs.Queue.Topic == "shared" && int32(qs.Queue.QueueID) == q {
					return qs.Committed == maxOffset(seen, q)+1
				}
			}
			return false
		}, wait, 10*time.Millisecond)
	}
}

func maxOffset(seen map[pos]string, q int32) int64 {
	m := int64(-1)
	for k := range seen {
		if k.queue == q && k.offset > m {
			m = k.offset
		}
	}
	return m
}

// Pause stops deliveries (after what was polled is delivered), Resume restarts them, and
// Seek moves the position back to an offset, to the first message or to a time.
func TestPauseResumeSeek(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "ctl", 1)
	p := newProducer(t, b)
	var out lines
	var evMu sync.Mutex
	var evs []pipeline.EventType
	m := newManager(t, b, func(o *pipeline.Options) {
		o.Stdout = &out
		o.OnEvent = func(e pipeline.Event) { evMu.Lock(); evs = append(evs, e.Type); evMu.Unlock() }
	})
	ctx := context.Background()
	require.NoError(t, m.Start(ctx, pipeline.Definition{
		Name: "ctl", Topics: []string{"ctl"}, StartFrom: pipeline.StartFirst,
		Sink: pipeline.SinkDefinition{Type: pipeline.SinkStdout},
	}))
	produceN := func(from, n int) {
		for i := range n {
			send(t, p, &producer.Message{Topic: "ctl", Body: fmt.Appendf(nil, "m-%d", from+i)})
		}
	}
	produceN(0, 5)
	require.Eventually(t, func() bool { return out.len() == 5 }, wait, 10*time.Millisecond)

	require.NoError(t, m.Pause(ctx, "ctl"))
	st, err := m.Get(ctx, "ctl")
	require.NoError(t, err)
	assert.Equal(t, pipeline.StatePaused, st.State)
	produceN(5, 5)
	assert.Never(t, func() bool { return out.len() > 5 }, 300*time.Millisecond, 10*time.Millisecond, "paused pipelines deliver nothing")
	st, err = m.Get(ctx, "ctl")
	require.NoError(t, err)
	require.Len(t, st.Queues, 1)
	assert.Equal(t, pipeline.QueueStatus{Queue: st.Queues[0].Queue, Committed: 5, Lag: 5}, st.Queues[0])

	require.NoError(t, m.Resume(ctx, "ctl"))
	require.Eventually(t, func() bool { return out.len() == 10 }, wait, 10*time.Millisecond)
	mq := consumer.MessageQueue{Topic: "ctl", BrokerName: st.Queues[0].Queue.BrokerName, QueueID: 0}
	require.Eventually(t, func() bool {
		off, ok := b.CommittedOffset("pipeline-ctl", "ctl", 0)
		return ok && off == 10
	}, wait, 10*time.Millisecond)

	require.NoError(t, m.Seek(ctx, "ctl", pipeline.SeekRequest{Queue: &mq, Position: pipeline.SeekOffset, Offset: 7}))
	require.Eventually(t, func() bool { return out.len() == 13 }, wait, 10*time.Millisecond)
	recs := out.records()
	assert.Equal(t, []int64{7, 8, 9}, []int64{recs[10].QueueOffset, recs[11].QueueOffset, recs[12].QueueOffset})

	require.NoError(t, m.Seek(ctx, "ctl", pipeline.SeekRequest{Position: pipeline.SeekFirst}))
	require.Eventually(t, func() bool { return out.len() == 23 }, wait, 10*time.Millisecond)
	assert.EqualValues(t, 0, out.records()[13].QueueOffset)

	require.NoError(t, m.Seek(ctx, "ctl", pipeline.SeekRequest{Position: pipeline.SeekTimestamp, Timestamp: time.Now().Add(-time.Hour)}))
	require.Eventually(t, func() bool { return out.len() == 33 }, wait, 10*time.Millisecond)
	assert.EqualValues(t, 0, out.records()[23].QueueOffset)

	require.NoError(t, m.Seek(ctx, "ctl", pipeline.SeekRequest{Position: pipeline.SeekLast}))
	produceN(10, 1)
	require.Eventually(t, func() bool { return out.len() == 34 }, wait, 10*time.Millisecond)
	assert.EqualValues(t, 10, out.records()[33].QueueOffset)

	// A malformed seek names the request's field at fault in a *FieldError.
	for _, tc := range []struct {
		req   pipeline.SeekRequest
		field string
	}{
		{pipeline.SeekRequest{Position: "middle"}, "position"},
		{pipeline.SeekRequest{Position: pipeline.SeekTimestamp}, "timestamp"},
		{pipeline.SeekRequest{Position: pipeline.SeekOffset}, "queue"},
		{pipeline.SeekRequest{Position: pipeline.SeekOffset, Queue: &mq, Offset: -1}, "offset"},
	} {
		err := m.Seek(ctx, "ctl", tc.req)
		require.ErrorIs(t, err, pipeline.ErrInvalidArgument, tc.field)
		var fe *pipeline.FieldError
		require.ErrorAs(t, err, &fe, "%s: %v", tc.field, err)
		assert.Equal(t, tc.field, fe.Field)
	}
	require.ErrorIs(t, m.Pause(ctx, "nope"), pipeline.ErrNotFound)
	evMu.Lock()
	defer evMu.Unlock()
	assert.Equal(t, []pipeline.EventType{pipeline.EventStarted, pipeline.EventPaused, pipeline.EventResumed}, evs)
}
