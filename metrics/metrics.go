package metrics

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/plugins"
)

// OtherLabel is the label value under which topics and groups past their cap are summed.
// The "~" is not allowed in topic or group names (broker.ValidateTopic, ValidateGroup), so
// it never collides with a real one.
const OtherLabel = "~other"

// Defaults of Options.
const (
	DefaultMaxTopics      = 200
	DefaultMaxGroups      = 100
	DefaultMaxQueueSeries = 2000
	DefaultMaxPlugins     = 100
)

// Options configures a Metrics.
type Options struct {
	// MaxTopics caps the topics with a label of their own in the traffic metrics; traffic of
	// further topics is counted under "other". Default DefaultMaxTopics (200).
	MaxTopics int
	// MaxGroups caps the consumer groups with a label of their own (members, lag,
	// rebalances); the rest are summed under "other". Default DefaultMaxGroups (100).
	MaxGroups int
	// MaxQueueSeries caps the per-queue lag series (group, topic, queue); queues past it
	// are still in flowd_group_lag_messages. Default DefaultMaxQueueSeries (2000).
	MaxQueueSeries int
	// PullBuckets are the pull latency histogram's buckets, in seconds. Default: 100 µs to
	// 30 s, roughly ×2.5 apart, so both an immediate read and a full long poll fall in one.
	PullBuckets []float64
	// PluginCallBuckets are the plugin call latency histogram's buckets, in seconds.
	// Default: 1 µs to 1 s (a filter window is microseconds, a transform batch may be more).
	PluginCallBuckets []float64
	// FlushBuckets are the store flush latency histogram's buckets, in seconds. Default:
	// 50 µs to 5 s (an fsync on NVMe is tens of microseconds, on a busy disk much more).
	FlushBuckets []float64
	// MaxPlugins caps the plugins with a call latency series of their own; calls of further
	// plugins are observed under "~other". Default DefaultMaxPlugins (100).
	MaxPlugins int
	// DisableRuntimeMetrics leaves out the Go runtime and process collectors (go_*,
	// process_*). Default false: they are registered.
	DisableRuntimeMetrics bool
}

func (o Options) withDefaults() Options {
	if o.MaxTopics <= 0 {
		o.MaxTopics = DefaultMaxTopics
	}
	if o.MaxGroups <= 0 {
		o.MaxGroups = DefaultMaxGroups
	}
	if o.MaxQueueSeries <= 0 {
		o.MaxQueueSeries = DefaultMaxQueueSeries
	}
	if len(o.PluginCallBuckets) == 0 {
		o.PluginCallBuckets = []float64{.000001, .0000025, .000005, .00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}
	}
	if len(o.FlushBuckets) == 0 {
		o.FlushBuckets = []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}
	}
	if o.MaxPlugins <= 0 {
		o.MaxPlugins = DefaultMaxPlugins
	}
	if len(o.PullBuckets) == 0 {
		o.PullBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	}
	return o
}

// Metrics is flowd's Prometheus registry and the broker.Observer that feeds its request-path
// counters. Create it before the broker (its Observer goes into broker.Config), then attach
// the broker and the optional sources with WatchBroker, WatchPlugins and WatchPublisher.
type Metrics struct {
	opts Options
	reg  *prometheus.Registry

	topics     sync.Map // topic name → *topicCounters; entries are never removed
	topicCount atomic.Int64
	newTopic   sync.Mutex // serialises creating entries, so the cap is exact
	other      topicCounters

	pullImmediate, pullParked prometheus.Observer

	pluginCalls  *prometheus.HistogramVec
	pluginObs    sync.Map // plugin name → prometheus.Observer; entries are never removed
	pluginCount  atomic.Int64
	newPlugin    sync.Mutex // serialises creating entries, so the cap is exact
	flushLatency prometheus.Observer

	rebalances *cappedCounter
}

// topicCounters is one topic's traffic, kept as atomics so that the request path adds
// without locks or allocation.
type topicCounters struct {
	msgsIn, bytesIn, msgsOut, bytesOut atomic.Uint64
}

// New returns a Metrics with its own registry (the global default registry is not used).
func New(opts Options) *Metrics {
	opts = opts.withDefaults()
	m := &Metrics{opts: opts, reg: prometheus.NewRegistry()}
	pull := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "flowd_pull_duration_seconds",
		Help:    "Time from a pull's decoded header to its answer. parked=\"true\": the pull long-polled, so its time is mostly waiting for a message.",
		Buckets: opts.PullBuckets,
	}, []string{"parked"})
	m.pullImmediate = pull.WithLabelValues("false")
	m.pullParked = pull.WithLabelValues("true")
	m.rebalances = newCappedCounter(prometheus.Opts{
		Name: "flowd_group_rebalances_total",
		Help: "Times a consumer group's queue assignment settled on a new value (GroupRebalanced events).",
	}, "group", opts.MaxGroups)
	m.pluginCalls = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "flowd_plugin_call_duration_seconds",
		Help:    "Time of one call into a plugin (a filter window, a transform batch, an allocation), faulted calls included; plugins past the cap are under \"~other\".",
		Buckets: opts.PluginCallBuckets,
	}, []string{"plugin"})
	flush := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "flowd_store_flush_duration_seconds",
		Help:    "Time of one commit-log flush (the fsyncs of the segments written since the last one).",
		Buckets: opts.FlushBuckets,
	})
	m.flushLatency = flush
	m.reg.MustRegister(pull, m.pluginCalls, flush, m.rebalances, &trafficCollector{m: m})
	if !opts.DisableRuntimeMetrics {
		m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return m
}

// Registry returns the registry, to serve (NewHandler) or to register more collectors on.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

var _ broker.Observer = (*Metrics)(nil)

// topic returns the counters of topic, creating them while fewer than MaxTopics exist.
// A known topic costs one sync.Map load; an unknown one past the cap one atomic load.
func (m *Metrics) topic(name string) *topicCounters {
	if c, ok := m.topics.Load(name); ok {
		return c.(*topicCounters)
	}
	if m.topicCount.Load() >= int64(m.opts.MaxTopics) {
		return &m.other
	}
	m.newTopic.Lock()
	defer m.newTopic.Unlock()
	if c, ok := m.topics.Load(name); ok {
		return c.(*topicCounters)
	}
	if m.topicCount.Load() >= int64(m.opts.MaxTopics) {
		return &m.other
	}
	c := new(topicCounters)
	m.topics.Store(name, c)
	m.topicCount.Add(1)
	return c
}

// MessagesIn implements broker.Observer.
func (m *Metrics) MessagesIn(topic string, n, bytes int) {
	c := m.topic(topic)
	c.msgsIn.Add(uint64(n))
	c.bytesIn.Add(uint64(bytes))
}

// MessagesOut implements broker.Observer.
func (m *Metrics) MessagesOut(topic string, n, bytes int) {
	c := m.topic(topic)
	c.msgsOut.Add(uint64(n))
	c.bytesOut.Add(uint64(bytes))
}

// PullLatency implements broker.Observer.
func (m *Metrics) PullLatency(d time.Duration, parked bool) {
	if parked {
		m.pullParked.Observe(d.Seconds())
	} else {
		m.pullImmediate.Observe(d.Seconds())
	}
}

// PluginCall observes one call into a plugin; it is a runtime.Options.OnCall (module is
// the plugin's name). A known plugin costs one sync.Map load and an observation: no
// allocation.
func (m *Metrics) PluginCall(module string, d time.Duration, _ error) {
	m.pluginObserver(module).Observe(d.Seconds())
}

func (m *Metrics) pluginObserver(name string) prometheus.Observer {
	if o, ok := m.pluginObs.Load(name); ok {
		return o.(prometheus.Observer)
	}
	m.newPlugin.Lock()
	defer m.newPlugin.Unlock()
	if o, ok := m.pluginObs.Load(name); ok {
		return o.(prometheus.Observer)
	}
	if m.pluginCount.Load() >= int64(m.opts.MaxPlugins) {
		name = OtherLabel
		if o, ok := m.pluginObs.Load(name); ok {
			return o.(prometheus.Observer)
		}
	} else {
		m.pluginCount.Add(1)
	}
	o := m.pluginCalls.WithLabelValues(name)
	m.pluginObs.Store(name, o)
	return o
}

// StoreFlush observes one commit-log flush; it is a store.Options.OnFlush.
func (m *Metrics) StoreFlush(d time.Duration, _ int, _ error) {
	m.flushLatency.Observe(d.Seconds())
}

// WatchBroker registers the collector that reads b at scrape time and subscribes to b's
// events to count rebalances. It returns a function that unsubscribes and unregisters; call
// it before shutting b down, or let b's shutdown end the subscription.
func (m *Metrics) WatchBroker(b *broker.Broker) (stop func()) {
	c := &brokerCollector{b: b, opts: m.opts}
	m.reg.MustRegister(c)
	cancel := b.Subscribe(func(e broker.Event) {
		if e.Type == broker.GroupRebalanced {
			m.rebalances.inc(e.Group)
		}
	})
	return func() {
		cancel()
		m.reg.Unregister(c)
	}
}

// WatchPlugins registers a collector of the plugins' runtime counters; pass the
// registry's Stats method (plugins.Registry.Stats).
func (m *Metrics) WatchPlugins(stats func() []plugins.PluginStats) {
	m.reg.MustRegister(&pluginCollector{stats: stats})
}

// PipelineStats are one pipeline's counters since it started (pipeline.Counters).
type PipelineStats struct {
	Name                                  string
	In, Out, Filtered, Failed, SinkErrors uint64
}

// WatchPipelines registers a collector of the hosted pipelines' counters; stats is called at
// every scrape and must be cheap (no broker requests).
func (m *Metrics) WatchPipelines(stats func() []PipelineStats) {
	m.reg.MustRegister(&pipelineCollector{stats: stats})
}

// WatchPublisher registers a collector of the NATS event publisher's counters; pass its
// Stats method (control.Publisher.Stats).
func (m *Metrics) WatchPublisher(stats func() control.PublisherStats) {
	m.reg.MustRegister(&publisherCollector{stats: stats})
}

// cappedCounter is a counter with one label whose values beyond the first max are summed
// under OtherLabel. It is for off-path counts (events), so a mutex is fine.
type cappedCounter struct {
	desc *prometheus.Desc
	max  int

	mu     sync.Mutex
	counts map[string]float64
	other  float64
}

func newCappedCounter(o prometheus.Opts, label string, max int) *cappedCounter {
	return &cappedCounter{
		desc:   prometheus.NewDesc(o.Name, o.Help, []string{label}, nil),
		max:    max,
		counts: map[string]float64{},
	}
}

func (c *cappedCounter) inc(value string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.counts[value]; ok || len(c.counts) < c.max {
		c.counts[value]++
		return
	}
	c.other++
}

func (c *cappedCounter) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *cappedCounter) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for v, n := range c.counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, n, v)
	}
	if c.other > 0 {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, c.other, OtherLabel)
	}
}
