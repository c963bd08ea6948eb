package metrics_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/metrics"
	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/protocol"
)

func init() { rlog.SetLogLevel("fatal") }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// wait bounds every wait for something asynchronous; waits end as soon as their condition
// holds.
const wait = 15 * time.Second

const tick = 10 * time.Millisecond

// startBroker starts a broker on free ports whose Observer is m, and attaches m to it.
func startBroker(t testing.TB, m *metrics.Metrics, mod func(*broker.Config)) *broker.Broker {
	t.Helper()
	cfg := broker.Config{
		DataDir:         t.TempDir(),
		Listen:          "127.0.0.1:0",
		NamesrvListen:   "127.0.0.1:0",
		Logger:          quiet(),
		RebalanceSettle: 50 * time.Millisecond,
	}
	cfg.Store.SegmentSize = 16 << 20
	if m != nil {
		cfg.Observer = m
	}
	if mod != nil {
		mod(&cfg)
	}
	b, err := broker.New(cfg)
	require.NoError(t, err)
	require.NoError(t, b.Start())
	var stop func()
	if m != nil {
		stop = m.WatchBroker(b)
	}
	t.Cleanup(func() {
		if stop != nil {
			stop()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, b.Shutdown(ctx))
	})
	return b
}

func createTopic(t testing.TB, b *broker.Broker, topic string, queues int) {
	t.Helper()
	c, err := clientcore.New(clientcore.Options{NameServers: []string{b.NamesrvAddr()}, Logger: quiet()})
	require.NoError(t, err)
	defer c.Close(context.Background())
	h := protocol.CreateTopicRequestHeader{Topic: topic, ReadQueueNums: int32(queues), WriteQueueNums: int32(queues), Perm: protocol.PermRead | protocol.PermWrite}
	_, err = c.InvokeOK(context.Background(), b.Addr(), protocol.NewRequestWith(protocol.UpdateAndCreateTopic, &h, nil))
	require.NoError(t, err)
}

func newProducer(t testing.TB, b *broker.Broker) *producer.Producer {
	t.Helper()
	p, err := producer.New("metrics-producers", producer.WithClientOptions(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet())))
	require.NoError(t, err)
	require.NoError(t, p.Start(context.Background()))
	t.Cleanup(func() { p.Close(context.Background()) })
	return p
}

// produce sends n messages to topic and returns the sum of their body sizes.
func produce(t testing.TB, p *producer.Producer, topic, prefix string, n int) int {
	t.Helper()
	total := 0
	for i := range n {
		body := fmt.Sprintf("%s-%d", prefix, i)
		_, err := p.Send(context.Background(), &producer.Message{Topic: topic, Body: []byte(body)})
		require.NoError(t, err)
		total += len(body)
	}
	return total
}

func newConsumer(t testing.TB, b *broker.Broker, group string, opts ...consumer.Option) *consumer.LitePull {
	t.Helper()
	all := append([]consumer.Option{
		consumer.WithClientOptions(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet())),
		consumer.WithPollTimeout(200 * time.Millisecond),
		consumer.WithLockRetryInterval(50 * time.Millisecond),
		consumer.WithClientOptions(client.WithHeartbeatInterval(time.Second)),
		consumer.WithPullDelays(20*time.Millisecond, 20*time.Millisecond, 200*time.Millisecond),
	}, opts...)
	c, err := consumer.NewLitePull(group, all...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Close(ctx)
	})
	return c
}

// pollN polls until n messages arrived or wait passed.
func pollN(t testing.TB, c *consumer.LitePull, n int) []*consumer.Message {
	t.Helper()
	var out []*consumer.Message
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for len(out) < n && ctx.Err() == nil {
		msgs, err := c.Poll(ctx)
		if err != nil && ctx.Err() == nil {
			require.NoError(t, err)
		}
		out = append(out, msgs...)
	}
	return out
}

// value returns the value of the series of name with exactly labels (name=value pairs),
// and whether it exists. Counters, gauges and (sample count of) histograms are read.
func value(t testing.TB, g prometheus.Gatherer, name string, labels ...string) (float64, bool) {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !sameLabels(m.GetLabel(), want) {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue(), true
			case m.Gauge != nil:
				return m.Gauge.GetValue(), true
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount()), true
			}
		}
	}
	return 0, false
}

func sameLabels(got []*dto.LabelPair, want map[string]string) bool {
	if len(got) != len(want) {
		return false
	}
	for _, l := range got {
		if v, ok := want[l.GetName()]; !ok || v != l.GetValue() {
			return false
		}
	}
	return true
}

// get fetches path from srv and returns the status code and body.
func get(t testing.TB, srv *httptest.Server, path string) (int, string) {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

func serveMetrics(t testing.TB, m *metrics.Metrics, checks ...metrics.Check) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(metrics.NewHandler(m.Registry(), quiet(), checks...))
	t.Cleanup(srv.Close)
	return srv
}
