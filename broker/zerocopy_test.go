package broker_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/flowd-io/flowd/protocol"
)

// pullAnswer is what one pull answered.
type pullAnswer struct {
	code protocol.ResponseCode
	next int64
	body []byte
}

// pullAll pulls every queue of topic from every offset with each expression (tags) and byte
// cap, through flowd's transport.
func pullAll(t *testing.T, b *testBroker, topic string, queues int32, exprs []string) map[string]pullAnswer {
	t.Helper()
	cl := newTransport(t)
	out := map[string]pullAnswer{}
	for q := range queues {
		hi := b.StoreMax(topic, q)
		for _, expr := range exprs {
			for _, maxMsgs := range []int32{32, 3} {
				for off := int64(0); off <= hi; off++ {
					h := pullHeader(topic, off, 0, expr)
					h.QueueID, h.MaxMsgNums = q, maxMsgs
					resp, err := cl.Invoke(context.Background(), b.Addr(), protocol.NewRequestWith(protocol.PullMessage, h, nil))
					require.NoError(t, err)
					var rh protocol.PullMessageResponseHeader
					require.NoError(t, resp.DecodeHeader(&rh))
					out[fmt.Sprintf("%d/%s/%d@%d", q, expr, maxMsgs, off)] = pullAnswer{resp.ResponseCode(), rh.NextBeginOffset, resp.Body}
				}
			}
		}
	}
	return out
}

// TestZeroCopyPullsMatchCopiedPulls pulls the same stored messages (spread over many small
// segments, queues interleaved, sizes from tiny to above the sendfile threshold) from a
// broker answering from the files, one copying (DisableZeroCopy), one answering from the
// files with sendfile for every region, and one whose store's file system exposes no
// descriptor (the fault-injecting vfs: the transport copies): every answer must be byte
// for byte the same, with and without a tag filter.
func TestZeroCopyPullsMatchCopiedPulls(t *testing.T) {
	dir := t.TempDir()
	const queues = 3
	exprs := []string{"*", "a", "b || c"}
	seg := func(c *broker.Config) {
		c.DataDir = dir
		c.Store.SegmentSize = 64 << 10
		c.MaxMessageSize = 32 << 10
		c.Store.MaxMessageSize = 40 << 10
	}
	b := startBroker(t, seg)
	require.NoError(t, b.CreateTopic(broker.TopicConfig{Name: "zc", ReadQueueNums: queues, WriteQueueNums: queues, Perm: 6}))
	c := newRawClientB(t, b)
	tags := []string{"a", "b", "c"}
	for i := range 240 {
		size := 10 + (i*97)%3000
		if i%17 == 0 {
			size = 20 << 10 // above the default sendfile threshold
		}
		body := fmt.Sprintf("%04d-%s", i, strings.Repeat(string(rune('a'+i%26)), size))
		h := &protocol.SendMessageRequestHeader{
			ProducerGroup: "raw", Topic: "zc", QueueID: int32(i % queues), BornTimestamp: time.Now().UnixMilli(),
			Properties: protocol.EncodeProperties(map[string]string{protocol.PropertyTags: tags[(i/3)%3]}),
		}
		if i%5 == 0 {
			h.QueueID = 0 // runs of adjacent messages
		}
		resp, err := c.cl.Invoke(context.Background(), b.Addr(), protocol.NewRequestWith(protocol.SendMessage, h, []byte(body)))
		require.NoError(t, err)
		require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	}
	for q := range int32(queues) {
		require.Eventually(t, func() bool { return b.StoreMax("zc", q) > 0 }, 5*time.Second, time.Millisecond)
	}
	require.Eventually(t, func() bool {
		return b.StoreMax("zc", 0)+b.StoreMax("zc", 1)+b.StoreMax("zc", 2) == 240
	}, 5*time.Second, time.Millisecond)
	zeroCopy := pullAll(t, b, "zc", queues, exprs)
	b.stop(t)

	variants := map[string]func(*broker.Config){
		"copy":          func(c *broker.Config) { c.DisableZeroCopy = true },
		"sendfile-all":  func(c *broker.Config) { c.Transport.SendfileThreshold = 1 },
		"no-descriptor": func(c *broker.Config) { c.Store.FS = vfs.NewFaultFS(nil) },
	}
	for name, mod := range variants {
		t.Run(name, func(t *testing.T) {
			b := startBroker(t, func(c *broker.Config) { seg(c); mod(c) })
			got := pullAll(t, b, "zc", queues, exprs)
			b.stop(t)
			require.Equal(t, len(zeroCopy), len(got))
			found := 0
			for k, want := range zeroCopy {
				g := got[k]
				require.Equal(t, want.code, g.code, k)
				require.Equal(t, want.next, g.next, k)
				require.True(t, bytes.Equal(want.body, g.body), "%s: bodies differ", k)
				if g.code == protocol.Success {
					found++
					msgs, err := protocol.DecodeStoredAll(g.body)
					require.NoError(t, err, k)
					require.NotEmpty(t, msgs)
				}
			}
			assert.Greater(t, found, 500)
		})
	}
}

// TestZeroCopyPullsDuringRetention pulls, from the files, a queue whose oldest segments
// retention deletes under the pulls while a producer keeps writing: every answer is either
// the right messages (each body the one sent at its queue offset) or a status that moves
// the offset, and the connection never breaks.
func TestZeroCopyPullsDuringRetention(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) {
		c.Store.SegmentSize = 32 << 10
		c.MaxMessageSize = 4 << 10
		c.Store.MaxMessageSize = 8 << 10
		c.Store.Retention = time.Nanosecond // every segment but the active one goes once flushed
		c.Store.CleanInterval = 5 * time.Millisecond
		c.Store.FlushInterval = time.Millisecond
		c.Transport.SendfileThreshold = 1 // sendfile every region
	})
	c := newRawClientB(t, b)
	body := func(i int64) string { return fmt.Sprintf("m%06d-%s", i, strings.Repeat("z", 700)) }
	c.sendTo("ret", 0, []byte(body(0)))
	waitMax(t, b, "ret", 0, 1)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var sent atomic.Int64
	sent.Store(1)
	wg.Go(func() {
		for i := int64(1); ctx.Err() == nil && i < 3000; i++ {
			c.sendTo("ret", 0, []byte(body(i)))
			sent.Add(1)
		}
	})
	var good, moved atomic.Int64
	cl := newTransport(t)
	for r := range 3 {
		wg.Go(func() {
			off := int64(0)
			for ctx.Err() == nil {
				h := pullHeader("ret", off, 0, "*")
				resp, err := cl.Invoke(ctx, b.Addr(), protocol.NewRequestWith(protocol.PullMessage, h, nil))
				if ctx.Err() != nil {
					return
				}
				if !assert.NoError(t, err, "reader %d", r) {
					return
				}
				var rh protocol.PullMessageResponseHeader
				require.NoError(t, resp.DecodeHeader(&rh))
				switch resp.ResponseCode() {
				case protocol.Success:
					msgs, err := protocol.DecodeStoredAll(resp.Body)
					if !assert.NoError(t, err) {
						return
					}
					// Messages of a segment removed during the read are skipped (as with
					// copying): offsets increase from off, and each body is its own.
					prev := off - 1
					for _, m := range msgs {
						if !assert.Greater(t, m.QueueOffset, prev) || !assert.Equal(t, body(m.QueueOffset), string(m.Body)) {
							return
						}
						prev = m.QueueOffset
					}
					if !assert.Equal(t, prev+1, rh.NextBeginOffset) {
						return
					}
					good.Add(1)
					off = rh.NextBeginOffset
				case protocol.PullOffsetMoved, protocol.PullRetryImmediately, protocol.PullNotFound:
					moved.Add(1)
					if rh.NextBeginOffset > off {
						off = rh.NextBeginOffset
					} else if resp.ResponseCode() != protocol.PullNotFound {
						off++ // the message at off was removed
					}
				default:
					assert.Fail(t, "unexpected answer", "%v", resp)
					return
				}
				// Fall behind now and then, to read what retention is about to delete.
				if off%7 == 0 {
					off = 0 // answered OFFSET_MOVED to the queue's current head
				}
			}
		})
	}
	// Read until retention has deleted under the readers and sent one of them back to the
	// head: on a busy machine 400 good reads can come before retention's first pass.
	require.Eventually(t, func() bool {
		return t.Failed() || good.Load() >= 400 && b.StoreStats().CommitLogMinOffset > 0 && moved.Load() > 0
	}, 60*time.Second, time.Millisecond)
	cancel()
	wg.Wait()
	assert.Positive(t, b.StoreStats().CommitLogMinOffset, "retention deleted the head of the log")
	assert.Positive(t, moved.Load())
}
