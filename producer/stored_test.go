package producer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/flowd-io/flowd/producer"
)

// slowDiskBroker starts a sync-flush broker whose commit-log fsyncs wait until the returned
// function is called (it is also called at cleanup, before the broker stops).
func slowDiskBroker(t *testing.T) (*broker.Broker, func()) {
	t.Helper()
	ffs := vfs.NewFaultFS(nil)
	ffs.Match(func(name string) bool { return strings.Contains(name, "commitlog") })
	b := startBroker(t, func(cfg *broker.Config) {
		cfg.Store.FS = ffs
		cfg.Store.FlushMode = store.FlushSync
		cfg.Store.SyncFlushTimeout = 100 * time.Millisecond
	})
	release := make(chan struct{})
	ffs.HoldSyncs(release)
	released := false
	free := func() {
		if !released {
			released = true
			close(release)
		}
	}
	t.Cleanup(free)
	return b, free
}

func TestSendUnderASlowDiskIsStoredOnceAndReportsFlushDiskTimeout(t *testing.T) {
	b, free := slowDiskBroker(t)
	mqs := createTopic(t, b, "slow", 1)
	p := newProducer(t, b, producer.WithRetries(2))

	res, err := p.Send(context.Background(), &producer.Message{Topic: "slow", Body: []byte("once")})
	require.NoError(t, err, "the message is stored: no error")
	assert.Equal(t, producer.SendFlushDiskTimeout, res.Status)
	assert.Equal(t, mqs[0], res.Queue)
	assert.Equal(t, int64(0), res.QueueOffset)
	assert.NotEmpty(t, res.OffsetMsgID)
	assert.Len(t, res.MsgID, 32)

	free()
	got := readAll(t, b, "slow", 1)
	require.Len(t, got, 1, "one send, one stored copy")
	assert.Equal(t, res.MsgID, got[0].MsgID)
	assert.Equal(t, res.OffsetMsgID, got[0].OffsetMsgID)
}
