package broker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

func syncSendRequest(topic string, body []byte) *protocol.Command {
	h := &protocol.SendMessageRequestHeader{
		ProducerGroup: "raw", Topic: topic, DefaultTopic: protocol.AutoCreateTopicKey, DefaultTopicQueueNums: 1,
		BornTimestamp: time.Now().UnixMilli(),
	}
	return protocol.NewRequest(protocol.SendMessageV2, h.EncodeV2(), body)
}

// allBodies pulls queue 0 of topic from its start to its end.
func allBodies(t *testing.T, cl *remoting.Client, b *testBroker, topic string) map[string]bool {
	t.Helper()
	got := map[string]bool{}
	for off := int64(0); off < b.StoreMax(topic, 0); {
		resp, err := cl.Invoke(context.Background(), b.Addr(), protocol.NewRequestWith(protocol.PullMessage, pullHeader(topic, off, 0, "*"), nil))
		require.NoError(t, err)
		require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
		msgs, err := protocol.DecodeStoredAll(resp.Body)
		require.NoError(t, err)
		require.NotEmpty(t, msgs)
		for _, m := range msgs {
			got[string(m.Body)] = true
			off = m.QueueOffset + 1
		}
	}
	return got
}

// TestSyncFlushAcknowledgedSendsSurviveAPowerCut sends from many goroutines over one
// connection and from several connections to a SYNC_FLUSH broker, whose sends are answered
// by the store's group commit, cuts the power (every unsynced write is lost) and restarts
// the broker: every send answered SUCCESS before the cut is there.
func TestSyncFlushAcknowledgedSendsSurviveAPowerCut(t *testing.T) {
	const topic = "sfpc"
	dir := t.TempDir()
	ffs := vfs.NewFaultFS(nil)
	ffs.TrackUnsynced()
	b := openBroker(t, dir, func(c *broker.Config) {
		c.Store.FS = ffs
		c.Store.FlushMode = store.FlushSync
	})
	var mu sync.Mutex
	var acked []string
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for conn := range 4 {
		cl := newTransport(t) // one connection per transport, shared by its senders
		for g := range 8 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					body := fmt.Sprintf("c%d-g%d-%d", conn, g, i)
					resp, err := cl.Invoke(context.Background(), b.Addr(), syncSendRequest(topic, []byte(body)))
					if err != nil || resp.ResponseCode() != protocol.Success {
						return // the power is out
					}
					mu.Lock()
					acked = append(acked, body)
					mu.Unlock()
				}
			})
		}
	}
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(acked) >= 500 }, 30*time.Second, time.Millisecond)
	mu.Lock()
	require.NoError(t, ffs.Crash())
	snapshot := append([]string(nil), acked...)
	mu.Unlock()
	close(stop)
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = b.Shutdown(ctx) // fails: the file system is gone

	b = openBroker(t, dir, func(c *broker.Config) { c.Store.FlushMode = store.FlushSync })
	defer b.stop(t)
	got := allBodies(t, newTransport(t), b, topic)
	t.Logf("%d acknowledged before the cut, %d recovered", len(snapshot), len(got))
	for _, body := range snapshot {
		if !got[body] {
			t.Errorf("acknowledged send %q lost", body)
		}
	}
}

// A SYNC_FLUSH send whose fsync does not finish within the store's SyncFlushTimeout is
// answered FLUSH_DISK_TIMEOUT, with its message id (it is stored and will be delivered),
// single and batched; once the disk is back, sends succeed.
func TestSyncFlushSlowDiskAnswersFlushDiskTimeout(t *testing.T) {
	const topic = "sfslow"
	ffs := vfs.NewFaultFS(nil)
	b := startBroker(t, func(c *broker.Config) {
		c.Store.FS = ffs
		c.Store.FlushMode = store.FlushSync
		c.Store.SyncFlushTimeout = 250 * time.Millisecond // room for the unheld fsyncs on a busy machine
	})
	cl := newTransport(t)
	ctx := context.Background()
	resp, err := cl.Invoke(ctx, b.Addr(), syncSendRequest(topic, []byte("fast")))
	require.NoError(t, err)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)

	hold := make(chan struct{})
	ffs.HoldSyncs(hold)
	resp, err = cl.Invoke(ctx, b.Addr(), syncSendRequest(topic, []byte("slow")))
	require.NoError(t, err)
	assert.Equal(t, protocol.FlushDiskTimeout, resp.ResponseCode(), resp.Remark)
	var h protocol.SendMessageResponseHeader
	require.NoError(t, resp.DecodeHeader(&h))
	assert.NotEmpty(t, h.MsgID, "a stored message's answer carries its id")

	batch, err := protocol.EncodeBatch([]*protocol.Message{{Topic: topic, Body: []byte("b0")}, {Topic: topic, Body: []byte("b1")}})
	require.NoError(t, err)
	bh := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: topic, BornTimestamp: time.Now().UnixMilli(), Batch: true}
	resp, err = cl.Invoke(ctx, b.Addr(), protocol.NewRequest(protocol.SendBatchMessage, bh.EncodeV2(), batch))
	require.NoError(t, err)
	assert.Equal(t, protocol.FlushDiskTimeout, resp.ResponseCode(), resp.Remark)
	h = protocol.SendMessageResponseHeader{}
	require.NoError(t, resp.DecodeHeader(&h))
	assert.Len(t, splitIDs(h.MsgID), 2)

	ffs.HoldSyncs(nil)
	close(hold)
	resp, err = cl.Invoke(ctx, b.Addr(), syncSendRequest(topic, []byte("back")))
	require.NoError(t, err)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	got := allBodies(t, cl, b, topic)
	for _, body := range []string{"fast", "slow", "b0", "b1", "back"} {
		assert.True(t, got[body], "%s stored", body)
	}
}

func splitIDs(s string) []string {
	var out []string
	for start, i := 0, 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return out
}

// Connections that close while their SYNC_FLUSH sends wait for the fsync leave nothing
// behind: the group commit's answers to them are dropped, other connections are served, and
// the broker shuts down cleanly (startBroker's cleanup checks it).
func TestSyncFlushConnectionClosesWhileSendsWait(t *testing.T) {
	const topic, n = "sfclose", 16
	ffs := vfs.NewFaultFS(nil)
	b := startBroker(t, func(c *broker.Config) {
		c.Store.FS = ffs
		c.Store.FlushMode = store.FlushSync
	})
	ctx := context.Background()
	keep := newTransport(t)
	resp, err := keep.Invoke(ctx, b.Addr(), syncSendRequest(topic, []byte("first")))
	require.NoError(t, err)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)

	hold := make(chan struct{})
	ffs.HoldSyncs(hold)
	gone := remoting.NewClient(remoting.ClientOptions{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, _ = gone.Invoke(ctx, b.Addr(), syncSendRequest(topic, fmt.Appendf(nil, "gone-%d", i)))
		})
	}
	// Every send was appended (and dispatched) while its fsync is held.
	require.Eventually(t, func() bool { return b.StoreMax(topic, 0) == n+1 }, 10*time.Second, time.Millisecond)
	gone.Close()
	wg.Wait()
	ffs.HoldSyncs(nil)
	close(hold)

	resp, err = keep.Invoke(ctx, b.Addr(), syncSendRequest(topic, []byte("after")))
	require.NoError(t, err)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	assert.Len(t, allBodies(t, keep, b, topic), n+2)
}

// BenchmarkSyncFlushSend64 measures SYNC_FLUSH sends of 1 KiB from 64 senders, each waiting
// for its answer before it sends again, over one connection each ("conns-64", as flowd
// bench's sync-flush scenario) or all over one ("conns-1"). msgs/fsync is how many sends one
// group-commit fsync acknowledged; cpu-µs/msg the process's CPU time (broker and senders)
// per send. Compare msgs/s with the disk's own fsync rate (flowd bench's disk-fsync-1024).
func BenchmarkSyncFlushSend64(b *testing.B) {
	for _, conns := range []int{64, 1} {
		b.Run(fmt.Sprintf("conns-%d", conns), func(b *testing.B) {
			br := startBroker(b, func(c *broker.Config) {
				c.Store.FlushMode = store.FlushSync
				c.Store.SegmentSize = 1 << 30
			})
			const senders = 64
			cls := make([]*remoting.Client, conns)
			for i := range cls {
				cls[i] = newTransport(b)
			}
			body := make([]byte, 1024)
			ctx := context.Background()
			resp, err := cls[0].Invoke(ctx, br.Addr(), syncSendRequest("sfbench", body))
			require.NoError(b, err)
			require.Equal(b, protocol.Success, resp.ResponseCode(), resp.Remark)
			var wg sync.WaitGroup
			per := (b.N + senders - 1) / senders
			b.ResetTimer()
			fsyncs, start, cpu := br.StoreStats().Fsyncs, time.Now(), processCPU()
			for g := range senders {
				cl := cls[g%conns]
				wg.Go(func() {
					for range per {
						resp, err := cl.Invoke(ctx, br.Addr(), syncSendRequest("sfbench", body))
						if err != nil || resp.ResponseCode() != protocol.Success {
							b.Errorf("send: %v %v", err, resp)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			el, cpu := time.Since(start).Seconds(), processCPU()-cpu
			n := float64(per * senders)
			b.ReportMetric(n/el, "msgs/s")
			b.ReportMetric(n/float64(br.StoreStats().Fsyncs-fsyncs), "msgs/fsync")
			b.ReportMetric(float64(cpu.Microseconds())/n, "cpu-µs/msg")
		})
	}
}
