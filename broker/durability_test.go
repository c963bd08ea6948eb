package broker_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/flowd-io/flowd/protocol"
)

// openBroker starts a broker on dir without the clean-shutdown check of startBroker: the
// power-cut tests stop it after its file system failed.
func openBroker(t *testing.T, dir string, mod func(*broker.Config)) *testBroker {
	t.Helper()
	cfg := broker.Config{
		DataDir:       dir,
		Listen:        "127.0.0.1:0",
		NamesrvListen: "off",
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	cfg.Store.SegmentSize = 8 << 20
	if mod != nil {
		mod(&cfg)
	}
	b, err := broker.New(cfg)
	require.NoError(t, err)
	require.NoError(t, b.Start())
	return &testBroker{Broker: b, cfg: cfg}
}

func (c *rawClient) commit(group, topic string, queueID int32, offset int64) *protocol.Command {
	c.t.Helper()
	return c.invoke(context.Background(), protocol.UpdateConsumerOffset, &protocol.UpdateConsumerOffsetRequestHeader{
		ConsumerGroup: group, Topic: topic, QueueID: queueID, CommitOffset: offset,
	}, nil)
}

// pullBodies pulls queue 0 of topic from offset and returns the message bodies.
func (c *rawClient) pullBodies(group, topic string, offset int64) []string {
	c.t.Helper()
	h := pullHeader(topic, offset, 0, "*")
	h.ConsumerGroup = group
	resp := c.invoke(context.Background(), protocol.PullMessage, h, nil)
	if resp.ResponseCode() != protocol.Success {
		return nil
	}
	msgs, err := protocol.DecodeStoredAll(resp.Body)
	require.NoError(c.t, err)
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = string(m.Body)
	}
	return out
}

// fileOffset reads a committed offset from consumerOffset.json, -1 when it is not there.
func fileOffset(t *testing.T, dir, group, topic string, queueID int32) int64 {
	b, err := os.ReadFile(filepath.Join(dir, "config", "consumerOffset.json"))
	if errors.Is(err, os.ErrNotExist) {
		return -1
	}
	require.NoError(t, err)
	var f struct {
		Offsets map[string]map[string]int64 `json:"offsetTable"`
	}
	require.NoError(t, json.Unmarshal(b, &f))
	off, ok := f.Offsets[topic+"@"+group][string(rune('0'+queueID))]
	if !ok {
		return -1
	}
	return off
}

// TestOffsetsNeverPointPastTheLogAfterAPowerCut commits offsets of messages the store has
// not made durable, cuts the power (the fault-injecting file system drops every unsynced
// write), and restarts the broker on the same directory. The group's offset must not point
// past the recovered queue: otherwise the messages written again below it are skipped.
func TestOffsetsNeverPointPastTheLogAfterAPowerCut(t *testing.T) {
	const group, topic = "pc-group", "pc"
	for _, mode := range []store.FlushMode{store.FlushAsync, store.FlushSync} {
		t.Run(mode.String(), func(t *testing.T) {
			dir := t.TempDir()
			ffs := vfs.NewFaultFS(nil)
			ffs.TrackUnsynced()
			b := openBroker(t, dir, func(c *broker.Config) {
				c.Store.FS = ffs
				c.Store.FlushMode = mode
				c.Store.FlushInterval = time.Hour // nothing is fsynced on a timer
				c.Store.FullFlushInterval = time.Hour
				c.OffsetFlushInterval = 10 * time.Millisecond
			})
			c := newRawClient(t, b, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if mode == store.FlushAsync {
				for _, body := range []string{"old-0", "old-1", "old-2"} {
					c.send(topic, body, "")
				}
				require.Eventually(t, func() bool { return b.StoreMax(topic, 0) == 3 }, 5*time.Second, time.Millisecond)
				require.Equal(t, protocol.Success, c.commit(group, topic, 0, 3).ResponseCode())
				require.Eventually(t, func() bool { return fileOffset(t, dir, group, topic, 0) == 3 }, 5*time.Second, time.Millisecond)
				require.NoError(t, ffs.Crash())
				_ = b.Shutdown(ctx) // fails: the file system is gone
			} else {
				c.send(topic, "old-0", "")
				c.send(topic, "old-1", "")
				// The disk stops syncing: the third send is written and dispatched (a pull
				// can read it) but never durable, and its producer gets an error.
				ffs.FailSyncs(errors.New("disk unplugged"))
				h := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: topic, DefaultTopic: protocol.AutoCreateTopicKey, DefaultTopicQueueNums: 4, BornTimestamp: time.Now().UnixMilli()}
				resp := c.invoke(ctx, protocol.SendMessage, h, []byte("old-2"))
				require.NotEqual(t, protocol.Success, resp.ResponseCode())
				require.Eventually(t, func() bool { return b.StoreMax(topic, 0) == 3 }, 5*time.Second, time.Millisecond)
				require.Equal(t, protocol.Success, c.commit(group, topic, 0, 3).ResponseCode())
				_ = b.Shutdown(ctx) // persists offsets, then fails to close the store
				require.NoError(t, ffs.Crash())
			}

			b = openBroker(t, dir, func(c *broker.Config) { c.Store.FlushMode = mode })
			defer b.stop(t)
			c = newRawClient(t, b, nil)
			max := b.StoreMax(topic, 0)
			from, ok := b.CommittedOffset(group, topic, 0)
			if !ok {
				from = 0
			}
			require.LessOrEqual(t, from, max, "the committed offset points past the recovered queue")
			for _, body := range []string{"new-0", "new-1", "new-2"} {
				c.send(topic, body, "")
			}
			require.Eventually(t, func() bool { return b.StoreMax(topic, 0) == max+3 }, 5*time.Second, time.Millisecond)
			got := c.pullBodies(group, topic, from)
			assert.Subset(t, got, []string{"new-0", "new-1", "new-2"}, "the group skipped messages")
		})
	}
}

// An offsets file that points past a queue (written before the store synced, or by hand)
// is lowered to the queue's end when the broker opens.
func TestOffsetsPastTheQueueAreClampedOnOpen(t *testing.T) {
	dir := t.TempDir()
	b := openBroker(t, dir, nil)
	c := newRawClient(t, b, nil)
	c.send("cl", "a", "")
	c.send("cl", "b", "")
	require.Equal(t, protocol.Success, c.commit("cl-group", "cl", 0, 1).ResponseCode())
	b.stop(t)
	path := filepath.Join(dir, "config", "consumerOffset.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"offsetTable":{"cl@cl-group":{"0":100,"1":5}}}`), 0o644))

	b = openBroker(t, dir, nil)
	defer b.stop(t)
	off, ok := b.CommittedOffset("cl-group", "cl", 0)
	require.True(t, ok)
	assert.Equal(t, int64(2), off)
	off, ok = b.CommittedOffset("cl-group", "cl", 1)
	require.True(t, ok)
	assert.Equal(t, int64(0), off)
}
