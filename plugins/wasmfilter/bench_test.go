package wasmfilter_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/broker/filter"
	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/plugins/wasmfilter"
	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/protocol"
	"github.com/flowd-io/flowd/runtime"
)

// BenchmarkPullThroughput pulls the same stored messages through the broker's read path
// with a tag subscription ("*": no filter) and through the C property filter
// (examples/wasm/c-propfilter), in one run, so the two msgs/s figures compare. Every message
// matches both, so both deliver the same messages. Run with
//
//	go test -run '^$' -bench PullThroughput ./plugins/wasmfilter/
func BenchmarkPullThroughput(b *testing.B) {
	const (
		messages = 20000
		batch    = 32
	)
	ctx := context.Background()
	reg := newRegistry(b)
	deploy(b, reg, plugins.Manifest{Name: "region", Version: "1.0.0", Parameters: map[string]string{"property": "region", "value": "eu"}}, propfilter(b), true)
	filters := filter.NewRegistry(0)
	filters.Register(filter.TypeWasm, wasmfilter.Compiler(reg, wasmfilter.Options{}))
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := broker.Config{DataDir: b.TempDir(), Listen: "127.0.0.1:0", NamesrvListen: "127.0.0.1:0", Filters: filters, Logger: quiet}
	br, err := broker.New(cfg)
	require.NoError(b, err)
	require.NoError(b, br.Start())
	b.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		require.NoError(b, br.Shutdown(sctx))
	})
	require.NoError(b, br.CreateTopic(broker.TopicConfig{Name: "bench", ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermRead | protocol.PermWrite}))
	p, err := producer.New("bench-producers", producer.WithClientOptions(client.WithNameServers(br.NamesrvAddr()), client.WithLogger(quiet)))
	require.NoError(b, err)
	require.NoError(b, p.Start(ctx))
	defer p.Close(ctx)
	body := make([]byte, 256)
	for i := range messages {
		_, err := p.Send(ctx, &producer.Message{Topic: "bench", Tags: "order", Body: body,
			Keys: []string{fmt.Sprint("k", i)}, Properties: map[string]string{"region": "eu", "customer": "c-1234"}})
		require.NoError(b, err)
	}
	require.Eventually(b, func() bool { return br.StoreMax("bench", 0) == messages }, 30*time.Second, time.Millisecond)

	cl := remoting.NewClient(remoting.ClientOptions{})
	defer cl.Close()
	for _, tc := range []struct{ name, typ, expr string }{
		{"no-filter", filter.TypeTag, "*"},
		{"wasm-propfilter", filter.TypeWasm, "region"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var offset int64
			pulled := 0
			for b.Loop() {
				h := &protocol.PullMessageRequestHeader{ConsumerGroup: "bench-" + tc.name, Topic: "bench", QueueOffset: offset,
					MaxMsgNums: batch, SysFlag: protocol.PullFlagSubscription, Subscription: tc.expr, ExpressionType: tc.typ}
				resp, err := cl.Invoke(ctx, br.Addr(), protocol.NewRequestWith(protocol.PullMessage, h, nil))
				if err != nil {
					b.Fatal(err)
				}
				if resp.ResponseCode() != protocol.Success {
					b.Fatalf("pull at %d: code %d: %s", offset, resp.ResponseCode(), resp.Remark)
				}
				var rh protocol.PullMessageResponseHeader
				if err := rh.Decode(resp.ExtFields); err != nil {
					b.Fatal(err)
				}
				pulled += int(rh.NextBeginOffset - offset)
				offset = rh.NextBeginOffset
				if offset >= messages {
					offset = 0
				}
			}
			b.ReportMetric(float64(pulled)/b.Elapsed().Seconds(), "msgs/s")
			b.ReportMetric(float64(pulled)/float64(b.N), "msgs/pull")
		})
	}
}

// BenchmarkMatchBatch is the filter's own cost in the read path: one window of 32 stored
// messages decoded, converted and decided by the C property filter, compiled as flowd loads
// every plugin ("interruptible": with wazero's close-on-context-done checks, so a call can
// be stopped at its time limit) and without the checks ("uninterruptible"), in one run:
//
//	go test -run '^$' -bench MatchBatch -benchtime 20000x ./plugins/wasmfilter/
func BenchmarkMatchBatch(b *testing.B) {
	for _, mode := range []struct {
		name string
		opts runtime.Options
	}{{"interruptible", runtime.Options{}}, {"uninterruptible", runtime.Options{Uninterruptible: true}}} {
		rt, err := runtime.New(context.Background(), mode.opts)
		require.NoError(b, err)
		b.Cleanup(func() { require.NoError(b, rt.Close(context.Background())) })
		reg := newRegistryOn(b, rt)
		deploy(b, reg, plugins.Manifest{Name: "region", Version: "1.0.0", Parameters: map[string]string{"property": "region", "value": "eu"}}, propfilter(b), true)
		filters := filter.NewRegistry(0)
		filters.Register(filter.TypeWasm, wasmfilter.Compiler(reg, wasmfilter.Options{}))
		f, err := filters.Filter(context.Background(), filter.Subscription{Group: "g", Topic: "orders", ExpressionType: "WASM", Expression: "region"})
		require.NoError(b, err)
		cands := make([]store.Candidate, 32)
		for i := range cands {
			cands[i] = candidate(b, int64(i), "eu")
		}
		keep := make([]bool, len(cands))
		b.Run(mode.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				clear(keep)
				if err := f.Match.MatchBatch(context.Background(), cands, keep); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(cands)), "ns/msg")
		})
	}
}
