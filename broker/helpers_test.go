package broker_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
)

func init() {
	// The RocketMQ client logs every connection at info level through a global logger.
	rlog.SetLogLevel("fatal")
}

type testBroker struct {
	*broker.Broker
	cfg broker.Config
}

// startBroker runs a broker with both listeners on free loopback ports and a fresh data
// directory (or dir, when given, to restart on old data).
func startBroker(t testing.TB, mod func(*broker.Config)) *testBroker {
	t.Helper()
	cfg := broker.Config{
		DataDir:       t.TempDir(),
		Listen:        "127.0.0.1:0",
		NamesrvListen: "127.0.0.1:0",
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		DelayLevels:   "100ms 200ms 300ms 400ms",
	}
	cfg.Store.SegmentSize = 8 << 20
	if mod != nil {
		mod(&cfg)
	}
	b, err := broker.New(cfg)
	require.NoError(t, err)
	require.NoError(t, b.Start())
	tb := &testBroker{Broker: b, cfg: cfg}
	t.Cleanup(func() { tb.stop(t) })
	return tb
}

func (tb *testBroker) stop(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, tb.Shutdown(ctx))
}

var instanceSeq atomic.Int64

// instance returns a client instance name unique in this process: the RocketMQ Go client
// shares one client per instance name process-wide.
func instance(t testing.TB) string {
	return fmt.Sprintf("%s-%d", t.Name(), instanceSeq.Add(1))
}
