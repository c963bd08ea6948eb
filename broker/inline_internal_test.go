package broker

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/protocol"
)

func startInternal(t *testing.T, mode store.FlushMode) *Broker {
	t.Helper()
	cfg := Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", NamesrvListen: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	cfg.Store.SegmentSize = 8 << 20
	cfg.Store.FlushMode = mode
	b, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, b.Shutdown(ctx))
	})
	_, err = b.topicForWrite("T", 1)
	require.NoError(t, err)
	return b
}

func sendRequest(code protocol.RequestCode, topic string, body []byte) *protocol.Command {
	h := &protocol.SendMessageRequestHeader{ProducerGroup: "g", Topic: topic, DefaultTopic: protocol.AutoCreateTopicKey, BornTimestamp: time.Now().UnixMilli()}
	if code == protocol.SendMessage {
		return protocol.NewRequest(code, h.Encode(), body)
	}
	return protocol.NewRequest(code, h.EncodeV2(), body)
}

// Sends that only append to the page cache are served inline; the ones that may wait are
// not.
func TestInlineSends(t *testing.T) {
	b := startInternal(t, store.FlushAsync)
	body := []byte("hello")
	for _, code := range []protocol.RequestCode{protocol.SendMessage, protocol.SendMessageV2, protocol.SendBatchMessage} {
		assert.True(t, b.inline(sendRequest(code, "T", body)), "%s to an existing topic", code)
		assert.False(t, b.inline(sendRequest(code, "New", body)), "%s that creates its topic", code)
		assert.False(t, b.inline(sendRequest(code, RetryTopicPrefix+"g", body)), "%s that may create the dead-letter topic", code)
	}
	assert.False(t, b.inline(sendRequest(protocol.SendMessageV2, "T", make([]byte, 4<<20))), "a send that would roll the segment")
	assert.False(t, b.inline(protocol.NewRequest(protocol.PullMessage, map[string]string{"topic": "T"}, nil)), "a pull may park")
	assert.False(t, b.inline(protocol.NewRequest(protocol.HeartBeat, nil, nil)))

	// With SYNC_FLUSH a send appends inline and its answer waits for the fsync deferred;
	// the sends that would wait for the fsync on the read goroutine are not inline.
	sync := startInternal(t, store.FlushSync)
	for _, code := range []protocol.RequestCode{protocol.SendMessage, protocol.SendMessageV2, protocol.SendBatchMessage} {
		assert.True(t, sync.inline(sendRequest(code, "T", body)), "SYNC_FLUSH %s to an existing topic", code)
	}
	oneway := sendRequest(protocol.SendMessageV2, "T", body)
	oneway.Flag |= protocol.FlagOneway
	assert.False(t, sync.inline(oneway), "a oneway SYNC_FLUSH send cannot be answered later")
	half := &protocol.SendMessageRequestHeader{ProducerGroup: "g", Topic: "T", SysFlag: protocol.MsgTransactionPrepared}
	assert.False(t, sync.inline(protocol.NewRequest(protocol.SendMessageV2, half.EncodeV2(), body)), "a SYNC_FLUSH half message")
	half.SysFlag = 0
	half.Properties = protocol.EncodeProperties(map[string]string{protocol.PropertyTransactionPrepared: "true"})
	assert.False(t, sync.inline(protocol.NewRequest(protocol.SendMessage, half.Encode(), body)), "a SYNC_FLUSH half message (property)")
	assert.False(t, sync.inline(sendRequest(protocol.SendMessageV2, "T", make([]byte, 4<<20))), "a SYNC_FLUSH send that would roll the segment")
}
