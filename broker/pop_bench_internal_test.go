package broker

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// Receivers racing on the same queues each get every message once while it is invisible,
// and acknowledging them all leaves nothing in flight.
func TestPopConcurrentReceiversShareTheQueues(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 4, WriteQueueNums: 4, Perm: 6}))
	const perQueue = 150
	for q := range int32(4) {
		popSendN(t, b, "T", q, perQueue, nil)
	}
	ctx := context.Background()
	var mu sync.Mutex
	seen := map[[2]int64]int{}
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for empty := 0; empty < 3; {
				r := popReq("G", "T", 7)
				r.Invisible = time.Minute
				got, err := b.Pop(ctx, r)
				if !assert.NoError(t, err) {
					return
				}
				if len(got) == 0 {
					empty++
					continue
				}
				for _, m := range got {
					mu.Lock()
					seen[[2]int64{int64(m.Message.QueueID), m.Message.QueueOffset}]++
					mu.Unlock()
					assert.NoError(t, b.PopAck(ctx, "G", "T", m.Handle))
				}
			}
		}()
	}
	wg.Wait()
	require.Len(t, seen, 4*perQueue)
	for k, n := range seen {
		require.Equal(t, 1, n, "message %v", k)
	}
	for _, st := range b.PopStats("G") {
		assert.EqualValues(t, perQueue, st.ConsumedOffset)
		assert.EqualValues(t, perQueue, st.Acked)
		assert.Zero(t, st.InFlight)
	}
}

// A queue hands out at most popWindow messages past its consumed offset.
func TestPopWindowBoundsInFlight(t *testing.T) {
	b := newPopBroker(t, "")
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	popSendN(t, b, "T", 0, popWindow+5, nil)
	ctx := context.Background()
	var first PoppedMessage
	total := 0
	for {
		got, err := b.Pop(ctx, popReq("G", "T", 32))
		require.NoError(t, err)
		if len(got) == 0 {
			break
		}
		if total == 0 {
			first = got[0]
		}
		total += len(got)
	}
	require.Equal(t, popWindow, total)
	require.NoError(t, b.PopAck(ctx, "G", "T", first.Handle))
	got, err := b.Pop(ctx, popReq("G", "T", 32))
	require.NoError(t, err)
	require.Len(t, got, 1, "one acknowledgement at the window's start makes room for one")
	assert.EqualValues(t, popWindow, got[0].Message.QueueOffset)
}

// BenchmarkPopAck receives 32 messages of 1 KiB and acknowledges each.
func BenchmarkPopAck(bm *testing.B) {
	b := newPopBroker(bm, "")
	require.NoError(bm, b.CreateTopic(TopicConfig{Name: "B", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	ctx := context.Background()
	body := bytes.Repeat([]byte("x"), 1024)
	n := (bm.N + 31) / 32 * 32
	batch := make([]*protocol.MessageExt, 0, 64)
	for i := 0; i < n; i += len(batch) {
		batch = batch[:0]
		for j := 0; j < 64 && i+j < n; j++ {
			batch = append(batch, &protocol.MessageExt{Message: protocol.Message{Topic: "B", Body: body}})
		}
		_, err := b.store.PutBatch(ctx, batch)
		require.NoError(bm, err)
	}
	require.Eventually(bm, func() bool { return b.store.MaxOffset("B", 0) == int64(n) }, time.Minute, time.Millisecond)
	bm.SetBytes(1024)
	bm.ResetTimer()
	got := 0
	for got < bm.N {
		ms, err := b.Pop(ctx, PopRequest{Group: "G", Topic: "B", QueueID: -1, MaxMessages: 32, Invisible: time.Minute})
		if err != nil {
			bm.Fatal(err)
		}
		if len(ms) == 0 {
			bm.Fatalf("nothing to receive after %d", got)
		}
		for _, m := range ms {
			if err := b.PopAck(ctx, "G", "B", m.Handle); err != nil {
				bm.Fatal(err)
			}
		}
		got += len(ms)
	}
}

// Receivers that acknowledge, negatively acknowledge, dead-letter and let expire, while the
// clock jumps, stats are read and the journal compacts: at the end every message is
// acknowledged or dead-lettered exactly once and nothing is in flight.
func TestPopChaosEndsConsistent(t *testing.T) {
	b := newPopBroker(t, "")
	b.pop.jnl.mu.Lock()
	b.pop.jnl.compactAt = 4 << 10
	b.pop.jnl.mu.Unlock()
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 3, WriteQueueNums: 3, Perm: 6}))
	_, err := b.PutGroup(GroupConfig{Name: "G", ConsumeEnable: true, RetryMaxTimes: 3})
	require.NoError(t, err)
	const perQueue = 80
	for q := range int32(3) {
		popSendN(t, b, "T", q, perQueue, nil)
	}
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := popReq("G", "T", 5)
				r.Invisible = time.Second
				got, err := b.Pop(ctx, r)
				if !assert.NoError(t, err) {
					return
				}
				for j, m := range got {
					switch (i + j + w) % 5 {
					case 0, 1:
						_ = b.PopAck(ctx, "G", "T", m.Handle) // may have expired meanwhile
					case 2:
						_, _ = b.PopChangeInvisible(ctx, "G", "T", m.Handle, 0)
					case 3:
						_ = b.PopToDLQ(ctx, "G", "T", m.Handle)
					}
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				advance(b, 700*time.Millisecond)
				_ = b.PopStats("G")
				_, _ = b.DescribeGroup("G")
				_ = b.PopTotals()
			}
		}
	}()
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()

	// Drain: acknowledge whatever is left, moving the clock past every invisibility.
	for range 200 {
		advance(b, 2*time.Second)
		got, err := b.Pop(ctx, popReq("G", "T", 32))
		require.NoError(t, err)
		for _, m := range got {
			require.NoError(t, b.PopAck(ctx, "G", "T", m.Handle))
		}
		done := true
		for _, st := range b.PopStats("G") {
			done = done && st.ConsumedOffset == perQueue
		}
		if done {
			break
		}
	}
	var acked, dead uint64
	for _, st := range b.PopStats("G") {
		assert.EqualValues(t, perQueue, st.ConsumedOffset, "queue %d", st.QueueID)
		assert.Zero(t, st.InFlight)
		assert.Zero(t, st.Visible)
		acked += st.Acked
		dead += st.DeadLettered
	}
	assert.EqualValues(t, 3*perQueue, acked+dead, "each message done exactly once")
	assert.Zero(t, b.PopTotals().InFlight, "nothing left on the deadline heap")
}

// BenchmarkReceiptHandle makes a receipt handle and checks it, as a delivery and its
// acknowledgement do.
func BenchmarkReceiptHandle(bm *testing.B) {
	k := newHandleKey(make([]byte, 32))
	r := receipt{queueID: 1, offset: 2, popTime: 3, deadline: 4, attempt: 1, epoch: 9}
	bm.ReportAllocs()
	for bm.Loop() {
		h := encodeHandle(k, "consumer-group", "topic", r)
		if got, err := decodeHandle(k, "consumer-group", "topic", h); err != nil || got != r {
			bm.Fatal(got, err)
		}
	}
}
