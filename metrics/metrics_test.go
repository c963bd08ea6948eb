package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/metrics"
	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/runtime"
)

// What producers send and consumers pull shows per topic, scraped over HTTP, and a group's
// lag is what it has still to consume.
func TestTrafficAndLagMatchWhatWasSentAndConsumed(t *testing.T) {
	m := metrics.New(metrics.Options{})
	b := startBroker(t, m, nil)
	createTopic(t, b, "orders", 2)
	p := newProducer(t, b)
	sent := produce(t, p, "orders", "order", 10)

	srv := serveMetrics(t, m)
	require.NoError(t, testutil.ScrapeAndCompare(srv.URL+"/metrics", strings.NewReader(fmt.Sprintf(`
# HELP flowd_message_bytes_in_total Body bytes of the messages stored by sends, by topic.
# TYPE flowd_message_bytes_in_total counter
flowd_message_bytes_in_total{topic="orders"} %d
# HELP flowd_messages_in_total Messages stored by sends (a batch counts each message), by topic; topics past the cap are under "~other".
# TYPE flowd_messages_in_total counter
flowd_messages_in_total{topic="orders"} 10
`, sent)), "flowd_messages_in_total", "flowd_message_bytes_in_total"))

	c := newConsumer(t, b, "billing", consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
	require.NoError(t, c.Subscribe("orders", "*"))
	require.NoError(t, c.Start(context.Background()))
	require.Len(t, pollN(t, c, 10), 10)
	require.NoError(t, c.Commit(context.Background()))

	out, _ := value(t, m.Registry(), "flowd_messages_out_total", "topic", "orders")
	assert.Equal(t, 10.0, out, "every message was pulled once")
	bytesOut, _ := value(t, m.Registry(), "flowd_message_bytes_out_total", "topic", "orders")
	assert.Greater(t, bytesOut, float64(sent), "pulls return stored messages: bodies plus headers")
	immediate, _ := value(t, m.Registry(), "flowd_pull_duration_seconds", "parked", "false")
	parked, _ := value(t, m.Registry(), "flowd_pull_duration_seconds", "parked", "true")
	assert.Positive(t, immediate+parked, "the pulls were timed")
	require.Eventually(t, func() bool {
		lag, ok := value(t, m.Registry(), "flowd_group_lag_messages", "group", "billing")
		return ok && lag == 0
	}, wait, tick, "the group consumed and committed everything")

	require.NoError(t, c.Close(context.Background()))
	produce(t, p, "orders", "late", 5)
	// The store dispatches asynchronously: lag counts a message once it is readable.
	require.Eventually(t, func() bool {
		lag, ok := value(t, m.Registry(), "flowd_group_lag_messages", "group", "billing")
		return ok && lag == 5
	}, wait, tick, "the five late messages are lag")
	info, err := b.DescribeGroup("billing")
	require.NoError(t, err)
	perQueue := 0.0
	i := slices.IndexFunc(info.Topics, func(gt broker.GroupTopic) bool { return gt.Topic == "orders" })
	require.GreaterOrEqual(t, i, 0)
	for _, q := range info.Topics[i].Queues {
		v, ok := value(t, m.Registry(), "flowd_queue_lag_messages", "group", "billing", "topic", "orders", "queue", fmt.Sprint(q.QueueID))
		require.True(t, ok)
		assert.Equal(t, float64(q.Lag), v)
		perQueue += v
	}
	assert.Equal(t, 5.0, perQueue)
	conns, _ := value(t, m.Registry(), "flowd_connections")
	assert.Positive(t, conns, "the producer is connected")
	size, _ := value(t, m.Registry(), "flowd_store_commit_log_bytes")
	assert.Equal(t, float64(b.StoreStats().CommitLogMaxOffset), size)
}

// A long poll that waits shows as a parked pull, and its answer lands in the parked
// latency series.
func TestParkedPullsCountLongPollsWhileTheyWait(t *testing.T) {
	m := metrics.New(metrics.Options{})
	b := startBroker(t, m, nil)
	createTopic(t, b, "quiet", 1)
	c := newConsumer(t, b, "waiters", consumer.WithBrokerSuspend(10*time.Second))
	require.NoError(t, c.Subscribe("quiet", "*"))
	require.NoError(t, c.Start(context.Background()))

	require.Eventually(t, func() bool {
		v, _ := value(t, m.Registry(), "flowd_parked_pulls")
		return v >= 1
	}, wait, tick, "the consumer's pull parks on the empty queue")

	produce(t, newProducer(t, b), "quiet", "wake", 1)
	require.Len(t, pollN(t, c, 1), 1)
	// The broker times a woken pull once its answer is queued, so the consumer may hold the
	// message a moment before the observation lands.
	require.Eventually(t, func() bool {
		parked, _ := value(t, m.Registry(), "flowd_pull_duration_seconds", "parked", "true")
		return parked > 0
	}, wait, tick, "the woken pull was observed as parked")
}

// A member joining a group is a rebalance, counted from the broker's GroupRebalanced
// events, and the group's member count follows.
func TestRebalancesAreCountedWhenAMemberJoins(t *testing.T) {
	m := metrics.New(metrics.Options{})
	b := startBroker(t, m, nil)
	createTopic(t, b, "jobs", 4)
	rebalances := func() float64 {
		v, _ := value(t, m.Registry(), "flowd_group_rebalances_total", "group", "workers")
		return v
	}
	members := func() float64 {
		v, _ := value(t, m.Registry(), "flowd_group_members", "group", "workers")
		return v
	}

	first := newConsumer(t, b, "workers", consumer.WithHandoverLocks(true))
	require.NoError(t, first.Subscribe("jobs", "*"))
	require.NoError(t, first.Start(context.Background()))
	require.Eventually(t, func() bool { return rebalances() >= 1 && members() == 1 }, wait, tick)
	before := rebalances()

	second := newConsumer(t, b, "workers", consumer.WithHandoverLocks(true))
	require.NoError(t, second.Subscribe("jobs", "*"))
	require.NoError(t, second.Start(context.Background()))
	require.Eventually(t, func() bool { return members() == 2 }, wait, tick)
	require.Eventually(t, func() bool { return rebalances() > before }, wait, tick,
		"the second member's join moved queues")
}

// /healthz answers while the process serves; /readyz turns not-ready when the store stops
// taking writes.
func TestReadyzFailsWhenTheStoreFails(t *testing.T) {
	ffs := vfs.NewFaultFS(nil)
	ffs.Match(func(name string) bool { return strings.Contains(name, "commitlog") })
	m := metrics.New(metrics.Options{})
	b := startBroker(t, m, func(cfg *broker.Config) {
		cfg.Store.FS = ffs
		cfg.Store.FlushMode = store.FlushSync
	})
	createTopic(t, b, "doomed", 1)
	srv := serveMetrics(t, m, metrics.BrokerChecks(b)...)

	code, body := get(t, srv, "/readyz")
	require.Equal(t, http.StatusOK, code, body)
	writable, _ := value(t, m.Registry(), "flowd_store_writable")
	require.Equal(t, 1.0, writable)

	ffs.FailSyncs(syscall.EIO)
	p := newProducer(t, b)
	_, err := p.Send(context.Background(), &producer.Message{Topic: "doomed", Body: []byte("x")})
	require.Error(t, err)

	require.Eventually(t, func() bool {
		code, _ := get(t, srv, "/readyz")
		return code == http.StatusServiceUnavailable
	}, wait, tick)
	_, body = get(t, srv, "/readyz")
	assert.Contains(t, body, "store:")
	assert.NotContains(t, body, "broker:", "the broker still serves")
	writable, _ = value(t, m.Registry(), "flowd_store_writable")
	assert.Equal(t, 0.0, writable)
	_, counted := value(t, m.Registry(), "flowd_messages_in_total", "topic", "doomed")
	assert.False(t, counted, "a send the store refused is not counted")
	code, _ = get(t, srv, "/healthz")
	assert.Equal(t, http.StatusOK, code, "the process is alive")
}

// A read the store cannot make counts in flowd_store_read_errors_total; the store keeps
// taking writes (and /readyz stays ready: readiness is about writes).
func TestStoreReadErrorsAreCounted(t *testing.T) {
	ffs := vfs.NewFaultFS(nil)
	m := metrics.New(metrics.Options{})
	b := startBroker(t, m, func(cfg *broker.Config) { cfg.Store.FS = ffs })
	createTopic(t, b, "scratched", 1)
	p := newProducer(t, b)
	res, err := p.Send(context.Background(), &producer.Message{Topic: "scratched", Body: []byte("x")})
	require.NoError(t, err)
	srv := serveMetrics(t, m, metrics.BrokerChecks(b)...)
	errs, ok := value(t, m.Registry(), "flowd_store_read_errors_total")
	require.True(t, ok, "exported before any read failed")
	require.Zero(t, errs)

	ffs.FailReads(&vfs.ReadFault{Match: func(n string) bool { return strings.Contains(n, "/commitlog/") }})
	_, err = b.MessageByID(res.OffsetMsgID)
	require.ErrorIs(t, err, store.ErrReadFailed)
	ffs.FailReads(nil)
	errs, _ = value(t, m.Registry(), "flowd_store_read_errors_total")
	assert.Equal(t, 1.0, errs)
	code, body := get(t, srv, "/readyz")
	assert.Equal(t, http.StatusOK, code, body)
	_, err = b.MessageByID(res.OffsetMsgID)
	require.NoError(t, err, "the message reads again")
}

// /readyz turns not-ready when NATS is configured and disconnected, and ready again when it
// comes back.
func TestReadyzFollowsTheNATSCheck(t *testing.T) {
	var connected atomic.Bool
	connected.Store(true)
	m := metrics.New(metrics.Options{DisableRuntimeMetrics: true})
	srv := serveMetrics(t, m, metrics.NATSCheck(connected.Load))

	code, _ := get(t, srv, "/readyz")
	require.Equal(t, http.StatusOK, code)
	connected.Store(false)
	code, body := get(t, srv, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "nats:")
	connected.Store(true)
	code, _ = get(t, srv, "/readyz")
	assert.Equal(t, http.StatusOK, code)
}

// The broker check fails once the broker is shut down.
func TestReadyzFailsWhenTheBrokerStopped(t *testing.T) {
	cfg := broker.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", NamesrvListen: "off", Logger: quiet()}
	b, err := broker.New(cfg)
	require.NoError(t, err)
	require.NoError(t, b.Start())
	m := metrics.New(metrics.Options{DisableRuntimeMetrics: true})
	srv := serveMetrics(t, m, metrics.BrokerChecks(b)...)
	code, _ := get(t, srv, "/readyz")
	require.Equal(t, http.StatusOK, code)

	require.NoError(t, b.Shutdown(context.Background()))
	code, body := get(t, srv, "/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "broker:")
}

// Topics past MaxTopics and groups past MaxGroups are summed under "~other", so the series
// count stays bounded whatever clients name.
func TestLabelCapsSumTheRestUnderOther(t *testing.T) {
	m := metrics.New(metrics.Options{MaxTopics: 2, MaxGroups: 1, DisableRuntimeMetrics: true})
	for i, topic := range []string{"a", "b", "c", "d", "a"} {
		m.MessagesIn(topic, i+1, 10*(i+1))
	}
	m.MessagesOut("d", 7, 70)
	in := func(topic string) float64 {
		v, _ := value(t, m.Registry(), "flowd_messages_in_total", "topic", topic)
		return v
	}
	assert.Equal(t, 1.0+5, in("a"))
	assert.Equal(t, 2.0, in("b"))
	assert.Equal(t, 3.0+4, in(metrics.OtherLabel))
	_, ok := value(t, m.Registry(), "flowd_messages_in_total", "topic", "c")
	assert.False(t, ok, "c is past the cap")
	out, _ := value(t, m.Registry(), "flowd_messages_out_total", "topic", metrics.OtherLabel)
	assert.Equal(t, 7.0, out)
	assert.Equal(t, 3, testutil.CollectAndCount(m.Registry(), "flowd_messages_in_total"))

	b := startBroker(t, m, nil)
	createTopic(t, b, "t", 1)
	for _, g := range []string{"g1", "g2", "g3"} {
		c := newConsumer(t, b, g)
		require.NoError(t, c.Subscribe("t", "*"))
		require.NoError(t, c.Start(context.Background()))
	}
	require.Eventually(t, func() bool {
		g1, _ := value(t, m.Registry(), "flowd_group_members", "group", "g1")
		rest, _ := value(t, m.Registry(), "flowd_group_members", "group", metrics.OtherLabel)
		return g1 == 1 && rest == 2
	}, wait, tick)
	assert.Equal(t, 2, testutil.CollectAndCount(m.Registry(), "flowd_group_members"))
	assert.Equal(t, 1, testutil.CollectAndCount(m.Registry(), "flowd_group_lag_messages"), "lag of labelled groups only")
}

// The observer's methods are on the send and pull paths: they must not allocate once a
// topic is known.
func TestObserverDoesNotAllocate(t *testing.T) {
	m := metrics.New(metrics.Options{DisableRuntimeMetrics: true})
	m.MessagesIn("hot", 1, 1)
	allocs := testing.AllocsPerRun(1000, func() {
		m.MessagesIn("hot", 1, 100)
		m.MessagesOut("hot", 32, 4096)
		m.PullLatency(time.Millisecond, false)
		m.PullLatency(time.Second, true)
	})
	assert.Zero(t, allocs)
}

// Plugin and NATS publisher counters are read from their sources at scrape time.
func TestPluginAndPublisherCollectors(t *testing.T) {
	m := metrics.New(metrics.Options{DisableRuntimeMetrics: true})
	calls := uint64(0)
	m.WatchPlugins(func() []plugins.PluginStats {
		return []plugins.PluginStats{{Name: "big-orders", Version: "1.2.0", Kind: plugins.KindFilter,
			Stats: runtime.Stats{Calls: calls, Faults: [runtime.NumFaultKinds]uint64{runtime.FaultTrap: 2, runtime.FaultTimeout: 1}, Instances: 3, Borrowed: 1}}}
	})
	pub := control.PublisherStats{Published: 41, Buffered: 3, Dropped: 2, Connected: true}
	m.WatchPublisher(func() control.PublisherStats { return pub })

	calls = 9
	l := []string{"plugin", "big-orders", "kind", "filter", "version", "1.2.0"}
	v, _ := value(t, m.Registry(), "flowd_plugin_calls_total", l...)
	assert.Equal(t, 9.0, v)
	v, _ = value(t, m.Registry(), "flowd_plugin_faults_total", append(l, "fault", "trap")...)
	assert.Equal(t, 2.0, v)
	v, _ = value(t, m.Registry(), "flowd_plugin_faults_total", append(l, "fault", "timeout")...)
	assert.Equal(t, 1.0, v)
	v, _ = value(t, m.Registry(), "flowd_plugin_instances", l...)
	assert.Equal(t, 3.0, v)

	v, _ = value(t, m.Registry(), "flowd_nats_events_published_total")
	assert.Equal(t, 41.0, v)
	v, _ = value(t, m.Registry(), "flowd_nats_connected")
	assert.Equal(t, 1.0, v)
	pub.Connected = false
	v, _ = value(t, m.Registry(), "flowd_nats_connected")
	assert.Equal(t, 0.0, v)
	problems, err := testutil.GatherAndLint(m.Registry())
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// Topics first seen concurrently respect the cap exactly, and no message is lost.
func TestTopicCapHoldsUnderConcurrentFirstSends(t *testing.T) {
	m := metrics.New(metrics.Options{MaxTopics: 5, DisableRuntimeMetrics: true})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				m.MessagesIn(fmt.Sprintf("t%d", (g*50+i)%20), 1, 1)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, 6, testutil.CollectAndCount(m.Registry(), "flowd_messages_in_total"), "5 topics and ~other")
	mfs, err := m.Registry().Gather()
	require.NoError(t, err)
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "flowd_messages_in_total" {
			for _, s := range mf.GetMetric() {
				total += s.GetCounter().GetValue()
			}
		}
	}
	assert.Equal(t, 400.0, total)
}

// A batch counts each of its messages and their bodies; a send the store refuses counts
// nothing.
func TestBatchSendsCountEachMessage(t *testing.T) {
	m := metrics.New(metrics.Options{DisableRuntimeMetrics: true})
	b := startBroker(t, m, nil)
	createTopic(t, b, "batched", 1)
	p := newProducer(t, b)
	_, err := p.SendBatch(context.Background(),
		&producer.Message{Topic: "batched", Body: []byte("one")},
		&producer.Message{Topic: "batched", Body: []byte("three")},
		&producer.Message{Topic: "batched", Body: []byte("sixsix")})
	require.NoError(t, err)
	n, _ := value(t, m.Registry(), "flowd_messages_in_total", "topic", "batched")
	assert.Equal(t, 3.0, n)
	bytes, _ := value(t, m.Registry(), "flowd_message_bytes_in_total", "topic", "batched")
	assert.Equal(t, float64(len("one")+len("three")+len("sixsix")), bytes)
}

// Plugin calls and store flushes are timed through the runtime's and the store's hooks:
// each call or flush is one observation, plugins past the cap go under ~other, and
// observing allocates nothing.
func TestPluginCallAndFlushLatency(t *testing.T) {
	m := metrics.New(metrics.Options{DisableRuntimeMetrics: true, MaxPlugins: 2})
	m.PluginCall("region", 3*time.Microsecond, nil)
	m.PluginCall("region", 2*time.Millisecond, errors.New("trap"))
	m.PluginCall("redact", time.Millisecond, nil)
	m.PluginCall("third", time.Millisecond, nil)
	m.PluginCall("fourth", time.Millisecond, nil)
	for plugin, want := range map[string]float64{"region": 2, "redact": 1, metrics.OtherLabel: 2} {
		v, ok := value(t, m.Registry(), "flowd_plugin_call_duration_seconds", "plugin", plugin)
		assert.True(t, ok, plugin)
		assert.Equal(t, want, v, plugin)
	}
	_, ok := value(t, m.Registry(), "flowd_plugin_call_duration_seconds", "plugin", "third")
	assert.False(t, ok, "past the cap")

	// The broker's store reports its flushes once the daemon sets the hook.
	b := startBroker(t, m, func(c *broker.Config) {
		c.Store.OnFlush = m.StoreFlush
		c.Store.FlushMode = store.FlushSync
	})
	createTopic(t, b, "flushed", 1)
	produce(t, newProducer(t, b), "flushed", "f", 5)
	require.Eventually(t, func() bool {
		v, _ := value(t, m.Registry(), "flowd_store_flush_duration_seconds")
		return v > 0
	}, 10*time.Second, 10*time.Millisecond)

	allocs := testing.AllocsPerRun(1000, func() {
		m.PluginCall("region", time.Microsecond, nil)
		m.PluginCall("fourth", time.Microsecond, nil)
		m.StoreFlush(time.Millisecond, 4096, nil)
	})
	assert.Zero(t, allocs)
	problems, err := testutil.GatherAndLint(m.Registry())
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// Pipeline counters are read at scrape time.
func TestPipelineCollector(t *testing.T) {
	m := metrics.New(metrics.Options{DisableRuntimeMetrics: true})
	stats := []metrics.PipelineStats{{Name: "clean", In: 10, Out: 7, Filtered: 2, Failed: 1, SinkErrors: 4}}
	m.WatchPipelines(func() []metrics.PipelineStats { return stats })
	for name, want := range map[string]float64{
		"flowd_pipeline_messages_in_total": 10, "flowd_pipeline_records_out_total": 7,
		"flowd_pipeline_messages_filtered_total": 2, "flowd_pipeline_messages_failed_total": 1,
		"flowd_pipeline_sink_errors_total": 4,
	} {
		v, ok := value(t, m.Registry(), name, "pipeline", "clean")
		assert.True(t, ok, name)
		assert.Equal(t, want, v, name)
	}
	stats[0].Out = 9
	v, _ := value(t, m.Registry(), "flowd_pipeline_records_out_total", "pipeline", "clean")
	assert.Equal(t, 9.0, v)
	problems, err := testutil.GatherAndLint(m.Registry())
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// A replica-set member's state is read at scrape time.
func TestReplicaSetCollector(t *testing.T) {
	m := metrics.New(metrics.Options{DisableRuntimeMetrics: true})
	stats := metrics.ReplicaSetStats{Master: true, Epoch: 3, Elections: 2, Fenced: 1, Replicas: []metrics.ReplicaLag{
		{Node: "b-2", LagBytes: 0, InSync: true}, {Node: "b-3", LagBytes: 5 << 20, LagTime: 7 * time.Second},
	}}
	m.WatchReplicaSet(func() metrics.ReplicaSetStats { return stats })
	for name, want := range map[string]float64{
		"flowd_replication_master": 1, "flowd_replication_epoch": 3, "flowd_replication_in_sync_replicas": 1,
		"flowd_replication_elections_total": 2, "flowd_replication_fenced_total": 1, "flowd_replication_lag_bytes": 0,
	} {
		v, ok := value(t, m.Registry(), name)
		assert.True(t, ok, name)
		assert.Equal(t, want, v, name)
	}
	v, ok := value(t, m.Registry(), "flowd_replication_replica_lag_bytes", "replica", "b-3")
	assert.True(t, ok)
	assert.Equal(t, float64(5<<20), v)
	v, _ = value(t, m.Registry(), "flowd_replication_replica_lag_seconds", "replica", "b-3")
	assert.Equal(t, 7.0, v)
	stats.Master, stats.Replicas, stats.LagBytes = false, nil, 1234
	v, _ = value(t, m.Registry(), "flowd_replication_master")
	assert.Equal(t, 0.0, v)
	v, _ = value(t, m.Registry(), "flowd_replication_lag_bytes")
	assert.Equal(t, 1234.0, v)
	// The lease stream's health is exported once known: 1 while whole, 0 while not.
	_, ok = value(t, m.Registry(), "flowd_replication_lease_stream_whole")
	assert.False(t, ok, "not exported before the lease stream was read")
	stats.LeaseStreamKnown, stats.LeaseStreamWhole = true, true
	v, _ = value(t, m.Registry(), "flowd_replication_lease_stream_whole")
	assert.Equal(t, 1.0, v)
	stats.LeaseStreamWhole = false
	v, ok = value(t, m.Registry(), "flowd_replication_lease_stream_whole")
	assert.True(t, ok)
	assert.Equal(t, 0.0, v)
	problems, err := testutil.GatherAndLint(m.Registry())
	require.NoError(t, err)
	assert.Empty(t, problems)
}
