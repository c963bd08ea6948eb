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
func newPopBroker(t testing.TB, dir string) *Broker {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	b, err := New(Config{DataDir: dir, Listen: "127.0.0.1:0", NamesrvListen: "off",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), DelayLevels: "100ms"})
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() { _ = b.Shutdown(context.Background()) })
	return b
}

func stopBroker(t testing.TB, b *Broker) {
	t.Helper()
	require.NoError(t, b.Shutdown(context.Background()))
}

// popSendN stores n messages in queue qid of topic and waits until the consume queue has
// them, so a receive without a wait sees them.
func popSendN(t testing.TB, b *Broker, topic string, qid int32, n int, props map[string]string) {
	t.Helper()
	for i := range n {
		_, err := b.Send(context.Background(), protocol.Message{Topic: topic, Body: []byte(fmt.Sprintf("m%d", i)), Properties: props}, qid)
		require.NoError(t, err)
	}
	want := b.store.MaxOffset(topic, qid)
	_ = want
	require.Eventually(t, func() bool { return b.store.MaxOffset(topic, qid) >= int64(n) }, 5*time.Second, time.Millisecond)
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
