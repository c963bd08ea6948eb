package broker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// newPopBroker starts a broker on free loopback ports over dir (a fresh one when empty).
func newPopBroker(t testing.TB, dir string, mods ...func(*Config)) *Broker {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	cfg := Config{DataDir: dir, Listen: "127.0.0.1:0", NamesrvListen: "off",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), DelayLevels: "100ms"}
	cfg.Store.SegmentSize = 8 << 20 // small files: the crash tests copy the directory
	for _, mod := range mods {
		mod(&cfg)
	}
	b, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() { _ = b.Shutdown(context.Background()) })
	return b
}

// popSendN stores n messages in queue qid of topic and waits until the consume queue has
// them, so a receive without a wait sees them.
func popSendN(t testing.TB, b *Broker, topic string, qid int32, n int, props map[string]string) {
	t.Helper()
	base := b.store.MaxOffset(topic, qid)
	for i := range n {
		_, err := b.Send(context.Background(), protocol.Message{Topic: topic, Body: []byte(fmt.Sprintf("m%d", i)), Properties: props}, qid)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return b.store.MaxOffset(topic, qid) >= base+int64(n) }, 5*time.Second, time.Millisecond)
}

func popReq(group, topic string, n int) PopRequest {
	return PopRequest{Group: group, Topic: topic, QueueID: -1, MaxMessages: n, Invisible: 10 * time.Second}
}

// advance moves the pop clock forward and runs the expiry of what became due.
func advance(b *Broker, d time.Duration) {
	b.pop.skew.Add(int64(d))
	for {
		if _, more := b.popExpireDue(context.Background()); !more {
			return
		}
	}
}

func bodies(ms []PoppedMessage) []string {
	var out []string
	for _, m := range ms {
		out = append(out, string(m.Message.Body))
	}
	return out
}

func TestPopReceiveAndAck(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	popSendN(t, b, "T", 0, 5, nil)
	ctx := context.Background()

	got, err := b.Pop(ctx, popReq("G", "T", 3))
	require.NoError(t, err)
	require.Equal(t, []string{"m0", "m1", "m2"}, bodies(got))
	for i, m := range got {
		assert.Equal(t, 1, m.Attempt)
		assert.EqualValues(t, 0, m.Message.ReconsumeTimes)
		assert.EqualValues(t, i, m.Message.QueueOffset)
		assert.True(t, m.InvisibleUntil.After(time.Now()))
	}
	more, err := b.Pop(ctx, popReq("G", "T", 32))
	require.NoError(t, err)
	require.Equal(t, []string{"m3", "m4"}, bodies(more), "in-flight messages are not handed out again")

	require.NoError(t, b.PopAck(ctx, "G", "T", got[0].Handle))
	require.ErrorIs(t, b.PopAck(ctx, "G", "T", got[0].Handle), ErrInvalidReceiptHandle, "a second ack")
	st := b.PopStats("G")
	require.Len(t, st, 1)
	assert.Equal(t, 4, st[0].InFlight)
	assert.EqualValues(t, 1, st[0].Acked)
	assert.EqualValues(t, 1, st[0].ConsumedOffset)
	assert.EqualValues(t, 5, st[0].MaxOffset)

	// Acknowledged messages never come back; the rest do once their invisibility passes.
	advance(b, 11*time.Second)
	again, err := b.Pop(ctx, popReq("G", "T", 32))
	require.NoError(t, err)
	require.Equal(t, []string{"m1", "m2", "m3", "m4"}, bodies(again))
	for _, m := range again {
		assert.Equal(t, 2, m.Attempt)
		assert.EqualValues(t, 1, m.Message.ReconsumeTimes)
	}
	// The first delivery's handle is stale now.
	require.ErrorIs(t, b.PopAck(ctx, "G", "T", got[1].Handle), ErrReceiptHandleExpired)
	for _, m := range again {
		require.NoError(t, b.PopAck(ctx, "G", "T", m.Handle))
	}
	st = b.PopStats("G")
	assert.Equal(t, 0, st[0].InFlight)
	assert.EqualValues(t, 5, st[0].ConsumedOffset)
}

func TestPopAnyQueueReceivesFromEveryQueue(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T4", ReadQueueNums: 4, WriteQueueNums: 4, Perm: 6}))
	for q := range int32(4) {
		popSendN(t, b, "T4", q, 3, nil)
	}
	ctx := context.Background()
	seen := map[int32]int{}
	for range 12 {
		got, err := b.Pop(ctx, popReq("G", "T4", 2))
		require.NoError(t, err)
		for _, m := range got {
			seen[m.Message.QueueID]++
			require.NoError(t, b.PopAck(ctx, "G", "T4", m.Handle))
		}
	}
	assert.Equal(t, map[int32]int{0: 3, 1: 3, 2: 3, 3: 3}, seen)
	got, err := b.Pop(ctx, popReq("G", "T4", 32))
	require.NoError(t, err)
	assert.Empty(t, got)
}

func TestPopChangeInvisible(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	popSendN(t, b, "T", 0, 1, nil)
	ctx := context.Background()
	got, err := b.Pop(ctx, popReq("G", "T", 1))
	require.NoError(t, err)
	require.Len(t, got, 1)
	h2, err := b.PopChangeInvisible(ctx, "G", "T", got[0].Handle, 60*time.Second)
	require.NoError(t, err)
	require.NotEqual(t, got[0].Handle, h2)
	require.ErrorIs(t, b.PopAck(ctx, "G", "T", got[0].Handle), ErrReceiptHandleExpired, "the old handle stops working")

	advance(b, 30*time.Second) // past the first invisibility, within the new one
	none, err := b.Pop(ctx, popReq("G", "T", 1))
	require.NoError(t, err)
	require.Empty(t, none)

	// Invisible 0: visible at once, redelivered as attempt 2.
	_, err = b.PopChangeInvisible(ctx, "G", "T", h2, 0)
	require.NoError(t, err)
	advance(b, 0)
	again, err := b.Pop(ctx, popReq("G", "T", 1))
	require.NoError(t, err)
	require.Len(t, again, 1)
	assert.Equal(t, 2, again[0].Attempt)
	require.NoError(t, b.PopAck(ctx, "G", "T", again[0].Handle))
}

func TestPopMaxAttemptsGoesToDLQ(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	_, err := b.PutGroup(GroupConfig{Name: "G", ConsumeEnable: true, RetryMaxTimes: 2})
	require.NoError(t, err)
	require.Equal(t, 3, b.PopMaxAttempts("G"))
	require.Equal(t, 17, b.PopMaxAttempts("unknown"), "the broker's MaxReconsumeTimes, 16, plus one")
	done := make(chan struct{}, 4)
	cancel := b.Subscribe(func(e Event) {
		if e.Type == PopDeadLettered && e.Group == "G" && e.Topic == "T" {
			done <- struct{}{}
		}
	})
	defer cancel()
	popSendN(t, b, "T", 0, 2, map[string]string{"k": "v"})
	ctx := context.Background()
	for attempt := 1; attempt <= 3; attempt++ {
		got, err := b.Pop(ctx, popReq("G", "T", 32))
		require.NoError(t, err)
		require.Len(t, got, 2, "attempt %d", attempt)
		assert.Equal(t, attempt, got[0].Attempt)
		if attempt == 1 {
			// One goes to the DLQ on request.
			require.NoError(t, b.PopToDLQ(ctx, "G", "T", got[1].Handle))
		}
		if attempt == 1 {
			// The other is received twice more; m1 only from the DLQ.
			require.Equal(t, "m0", string(got[0].Message.Body))
		}
		advance(b, 11*time.Second)
		if attempt == 1 {
			break
		}
	}
	for attempt := 2; attempt <= 3; attempt++ {
		got, err := b.Pop(ctx, popReq("G", "T", 32))
		require.NoError(t, err)
		require.Len(t, got, 1)
		assert.Equal(t, attempt, got[0].Attempt)
		advance(b, 11*time.Second)
	}
	got, err := b.Pop(ctx, popReq("G", "T", 32))
	require.NoError(t, err)
	require.Empty(t, got, "after RetryMaxTimes redeliveries the message is dead-lettered")
	st := b.PopStats("G")
	assert.EqualValues(t, 2, st[0].DeadLettered)
	assert.EqualValues(t, 2, st[0].ConsumedOffset)

	dlq := DLQTopicPrefix + "G"
	require.Eventually(t, func() bool { return b.store.MaxOffset(dlq, 0) == 2 }, 5*time.Second, time.Millisecond)
	res, err := b.store.GetMessage(ctx, dlq, 0, 0, 32, 0, nil)
	require.NoError(t, err)
	defer res.Release()
	require.Len(t, res.Messages, 2)
	want := map[string]string{"m1": "1", "m0": "3"}
	for _, raw := range res.Messages {
		m, _, err := protocol.DecodeStored(raw)
		require.NoError(t, err)
		assert.Equal(t, "T", m.Properties[protocol.PropertyRetryTopic])
		assert.NotEmpty(t, m.Properties[protocol.PropertyOriginMsgID])
		assert.Equal(t, "v", m.Properties["k"])
		assert.Equal(t, want[string(m.Body)], m.Properties[protocol.PropertyReconsumeTimes], string(m.Body))
	}
	for range 2 {
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("no PopDeadLettered event")
		}
	}
}

func TestPopBadHandles(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "U", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	popSendN(t, b, "T", 0, 2, nil)
	ctx := context.Background()
	got, err := b.Pop(ctx, popReq("G", "T", 2))
	require.NoError(t, err)
	require.Len(t, got, 2)
	h := got[0].Handle

	require.ErrorIs(t, b.PopAck(ctx, "G", "T", ""), ErrInvalidReceiptHandle)
	require.ErrorIs(t, b.PopAck(ctx, "G", "T", "not a handle"), ErrInvalidReceiptHandle)
	require.ErrorIs(t, b.PopAck(ctx, "G", "T", h[:len(h)-2]), ErrInvalidReceiptHandle)
	require.ErrorIs(t, b.PopAck(ctx, "OTHER", "T", h), ErrInvalidReceiptHandle, "another group")
	require.ErrorIs(t, b.PopAck(ctx, "G", "U", h), ErrInvalidReceiptHandle, "another topic")
	// A forged handle: one payload byte flipped (the offset), same MAC.
	raw := []byte(h)
	raw[10] ^= 1
	if raw[10] == h[10] {
		raw[10] ^= 2
	}
	require.ErrorIs(t, b.PopAck(ctx, "G", "T", string(raw)), ErrInvalidReceiptHandle, "forged")
	_, err = b.PopChangeInvisible(ctx, "OTHER", "T", h, time.Second)
	require.ErrorIs(t, err, ErrInvalidReceiptHandle)
	require.ErrorIs(t, b.PopToDLQ(ctx, "OTHER", "T", h), ErrInvalidReceiptHandle)

	// After the invisibility passed, even before the expiry loop ran.
	b.pop.skew.Add(int64(11 * time.Second))
	require.ErrorIs(t, b.PopAck(ctx, "G", "T", h), ErrReceiptHandleExpired)
	st := b.PopStats("G")
	assert.EqualValues(t, 0, st[0].Acked, "no bad handle acknowledged anything")
}

func TestPopBadRequests(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 2, WriteQueueNums: 2, Perm: 6}))
	ctx := context.Background()
	_, err := b.Pop(ctx, popReq("G", "missing", 1))
	require.ErrorIs(t, err, ErrNotFound)
	for name, r := range map[string]PopRequest{
		"no group":         {Topic: "T", QueueID: -1, MaxMessages: 1, Invisible: time.Second},
		"zero messages":    {Group: "G", Topic: "T", QueueID: -1, MaxMessages: 0, Invisible: time.Second},
		"33 messages":      {Group: "G", Topic: "T", QueueID: -1, MaxMessages: 33, Invisible: time.Second},
		"under one second": {Group: "G", Topic: "T", QueueID: -1, MaxMessages: 1, Invisible: 999 * time.Millisecond},
		"queue 2 of 2":     {Group: "G", Topic: "T", QueueID: 2, MaxMessages: 1, Invisible: time.Second},
	} {
		_, err := b.Pop(ctx, r)
		require.ErrorIs(t, err, ErrBadRequest, name)
	}
	r := popReq("G", "T", 1)
	r.Invisible = time.Second // the floor is 1 s, not RocketMQ's 10 s
	_, err = b.Pop(ctx, r)
	require.NoError(t, err)
	r.ExpressionType, r.Expression = "SQL92", "a = = 1"
	_, err = b.Pop(ctx, r)
	require.ErrorIs(t, err, ErrBadFilter)
	r.ExpressionType, r.Expression = "NOPE", "x"
	_, err = b.Pop(ctx, r)
	require.ErrorIs(t, err, ErrBadFilter)
}

func TestPopFilters(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	ctx := context.Background()
	for i := range 6 {
		tag := []string{"a", "b", "c"}[i%3]
		_, err := b.Send(ctx, protocol.Message{Topic: "T", Body: []byte(fmt.Sprintf("%s%d", tag, i)),
			Properties: map[string]string{protocol.PropertyTags: tag, "n": fmt.Sprint(i)}}, 0)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return b.store.MaxOffset("T", 0) == 6 }, 5*time.Second, time.Millisecond)
	r := popReq("TAGS", "T", 32)
	r.ExpressionType, r.Expression = "TAG", "a || c"
	got, err := b.Pop(ctx, r)
	require.NoError(t, err)
	require.Equal(t, []string{"a0", "c2", "a3", "c5"}, bodies(got))
	for _, m := range got {
		require.NoError(t, b.PopAck(ctx, "TAGS", "T", m.Handle))
	}
	assert.EqualValues(t, 6, b.PopStats("TAGS")[0].ConsumedOffset, "what the filter rejects is done for the group")

	r = popReq("SQL", "T", 32)
	r.ExpressionType, r.Expression = "SQL92", "n > 3"
	got, err = b.Pop(ctx, r)
	require.NoError(t, err)
	require.Equal(t, []string{"b4", "c5"}, bodies(got))
}

func TestPopFIFOPerMessageGroup(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	_, err := b.PutGroup(GroupConfig{Name: "F", ConsumeEnable: true, ConsumeOrderly: true})
	require.NoError(t, err)
	ctx := context.Background()
	// Two message groups interleaved: x0 y1 x2 y3 x4 y5.
	for i := range 6 {
		g := []string{"x", "y"}[i%2]
		_, err := b.Send(ctx, protocol.Message{Topic: "T", Body: []byte(fmt.Sprintf("%s%d", g, i)),
			Properties: map[string]string{PropertyShardingKey: g}}, 0)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return b.store.MaxOffset("T", 0) == 6 }, 5*time.Second, time.Millisecond)

	got, err := b.Pop(ctx, popReq("F", "T", 32))
	require.NoError(t, err)
	require.Equal(t, []string{"x0", "y1"}, bodies(got), "one message of each message group at a time")
	none, err := b.Pop(ctx, popReq("F", "T", 32))
	require.NoError(t, err)
	require.Empty(t, none)

	require.NoError(t, b.PopAck(ctx, "F", "T", got[0].Handle))
	next, err := b.Pop(ctx, popReq("F", "T", 32))
	require.NoError(t, err)
	require.Equal(t, []string{"x2"}, bodies(next), "x's next after x0's ack; y waits for y1")

	// y1 expires: it comes back before y3.
	advance(b, 11*time.Second)
	again, err := b.Pop(ctx, popReq("F", "T", 32))
	require.NoError(t, err)
	require.Equal(t, []string{"y1", "x2"}, bodies(again))
	require.NoError(t, b.PopAck(ctx, "F", "T", again[0].Handle))
	require.NoError(t, b.PopAck(ctx, "F", "T", again[1].Handle))
	rest, err := b.Pop(ctx, popReq("F", "T", 32))
	require.NoError(t, err)
	require.Equal(t, []string{"y3", "x4"}, bodies(rest))

	// A group that is not FIFO gets everything at once.
	all, err := b.Pop(ctx, popReq("NOTFIFO", "T", 32))
	require.NoError(t, err)
	require.Len(t, all, 6)
}

func TestPopLongPollWakesOnArrival(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 4, WriteQueueNums: 4, Perm: 6}))
	ctx := context.Background()
	type result struct {
		ms  []PoppedMessage
		err error
	}
	ch := make(chan result, 1)
	go func() {
		r := popReq("G", "T", 32)
		r.Wait = 20 * time.Second
		ms, err := b.Pop(ctx, r)
		ch <- result{ms, err}
	}()
	require.Eventually(t, func() bool { return b.pop.waiters.n.Load() == 1 }, 5*time.Second, time.Millisecond)
	_, err := b.Send(ctx, protocol.Message{Topic: "T", Body: []byte("late")}, 3)
	require.NoError(t, err)
	select {
	case r := <-ch:
		require.NoError(t, r.err)
		require.Equal(t, []string{"late"}, bodies(r.ms))
	case <-time.After(10 * time.Second):
		t.Fatal("the parked receive was not woken by the arrival")
	}

	// Cancelling the context ends a wait with nothing and no error.
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		r := popReq("G", "T", 32)
		r.Wait = 20 * time.Second
		ms, err := b.Pop(cctx, r)
		ch <- result{ms, err}
	}()
	require.Eventually(t, func() bool { return b.pop.waiters.n.Load() == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	r := <-ch
	require.NoError(t, r.err)
	require.Empty(t, r.ms)
}

func TestPopDescribeGroupShowsProgressAndLag(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 2, WriteQueueNums: 2, Perm: 6}))
	popSendN(t, b, "T", 0, 4, nil)
	ctx := context.Background()
	r := popReq("G", "T", 32)
	r.QueueID, r.ClientID = 0, "10.0.0.1@web"
	got, err := b.Pop(ctx, r)
	require.NoError(t, err)
	require.Len(t, got, 4)
	require.NoError(t, b.PopAck(ctx, "G", "T", got[0].Handle))
	require.NoError(t, b.PopAck(ctx, "G", "T", got[2].Handle))

	info, err := b.DescribeGroup("G")
	require.NoError(t, err)
	require.Len(t, info.Topics, 1)
	q0 := info.Topics[0].Queues[0]
	require.NotNil(t, q0.Pop)
	assert.Equal(t, 2, q0.Pop.InFlight)
	assert.EqualValues(t, 2, q0.Pop.Acked)
	assert.EqualValues(t, 1, q0.Pop.ConsumedOffset)
	assert.EqualValues(t, 3, q0.Lag, "unacknowledged messages are lag")
	assert.Equal(t, "10.0.0.1@web", q0.Pop.Receiver)
	assert.Nil(t, info.Topics[0].Queues[1].Pop)
	assert.EqualValues(t, 3, info.Lag)
}

// The expiry loop's own timer (no clock moved by the test) redelivers, and wakes a receive
// parked meanwhile.
func TestPopExpiryWakesAParkedReceive(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	popSendN(t, b, "T", 0, 1, nil)
	ctx := context.Background()
	r := popReq("G", "T", 1)
	r.Invisible = time.Second
	first, err := b.Pop(ctx, r)
	require.NoError(t, err)
	require.Len(t, first, 1)
	r.Wait = 10 * time.Second
	began := time.Now()
	again, err := b.Pop(ctx, r)
	require.NoError(t, err)
	require.Len(t, again, 1, "woken by the expiry, not by the wait's end")
	assert.Equal(t, 2, again[0].Attempt)
	assert.Less(t, time.Since(began), 9*time.Second)
}

// Deleting a group with its offsets forgets its pop progress, across a restart too.
func TestPopDeleteGroupForgetsProgress(t *testing.T) {
	dir := t.TempDir()
	b := newPopBroker(t, dir)
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	popSendN(t, b, "T", 0, 2, nil)
	ctx := context.Background()
	got, err := b.Pop(ctx, popReq("G", "T", 1))
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.NoError(t, b.DeleteGroup("G", true))
	assert.Empty(t, b.PopStats("G"))
	require.ErrorIs(t, b.PopAck(ctx, "G", "T", got[0].Handle), ErrInvalidReceiptHandle)

	crashed := copyDir(t, dir)
	b2 := newPopBroker(t, crashed)
	assert.Empty(t, b2.PopStats("G"), "the journal replays the forgetting")
	all, err := b2.Pop(ctx, popReq("G", "T", 32))
	require.NoError(t, err)
	assert.Len(t, all, 2, "a group made again starts from the queue's first message")
}

// Without auto-creation a receive names a configured group or fails with ErrNotFound.
func TestPopUnknownGroupWithoutAutoCreation(t *testing.T) {
	b := newPopBroker(t, "", func(c *Config) { c.DisableAutoCreateGroups = true })
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	_, err := b.Pop(context.Background(), popReq("G", "T", 1))
	require.ErrorIs(t, err, ErrNotFound)
	_, err = b.PutGroup(GroupConfig{Name: "G", ConsumeEnable: true})
	require.NoError(t, err)
	_, err = b.Pop(context.Background(), popReq("G", "T", 1))
	require.NoError(t, err)
}
