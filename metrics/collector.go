package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/runtime"
)

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

// trafficCollector exports the per-topic counters the Observer methods add to.
type trafficCollector struct{ m *Metrics }

var (
	descMsgsIn   = desc("flowd_messages_in_total", "Messages stored by sends (a batch counts each message), by topic; topics past the cap are under \"~other\".", "topic")
	descBytesIn  = desc("flowd_message_bytes_in_total", "Body bytes of the messages stored by sends, by topic.", "topic")
	descMsgsOut  = desc("flowd_messages_out_total", "Messages returned by pulls and pop receives, by topic (a message pulled or received twice counts twice).", "topic")
	descBytesOut = desc("flowd_message_bytes_out_total", "Stored bytes (headers, properties and body) of the messages returned by pulls, by topic.", "topic")
)

func (c *trafficCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descMsgsIn
	ch <- descBytesIn
	ch <- descMsgsOut
	ch <- descBytesOut
}

func (c *trafficCollector) Collect(ch chan<- prometheus.Metric) {
	emit := func(topic string, t *topicCounters) {
		counter(ch, descMsgsIn, t.msgsIn.Load(), topic)
		counter(ch, descBytesIn, t.bytesIn.Load(), topic)
		counter(ch, descMsgsOut, t.msgsOut.Load(), topic)
		counter(ch, descBytesOut, t.bytesOut.Load(), topic)
	}
	c.m.topics.Range(func(k, v any) bool {
		emit(k.(string), v.(*topicCounters))
		return true
	})
	o := &c.m.other
	if o.msgsIn.Load()+o.msgsOut.Load() > 0 {
		emit(OtherLabel, o)
	}
}

func counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v uint64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

// brokerCollector reads the broker's state at scrape time.
type brokerCollector struct {
	b    *broker.Broker
	opts Options
}

var (
	descParked        = desc("flowd_parked_pulls", "Long-polling pulls that found nothing and are waiting for a message or their suspend time.")
	descConns         = desc("flowd_connections", "Open client connections to the broker listener.")
	descEventsDropped = desc("flowd_events_dropped_total", "Broker events dropped because a subscriber's queue was full.")
	descTopics        = desc("flowd_topics", "Topics the broker has, its own, retry and dead-letter topics included.")
	descGroups        = desc("flowd_groups", "Consumer groups the broker knows (configured, with live members or with committed offsets).")
	descClients       = desc("flowd_clients", "Distinct client ids with live group members.")
	descLockedQueues  = desc("flowd_locked_queues", "Queue locks held by orderly and flowd consumers.")
	descMembers       = desc("flowd_group_members", "Live members of a consumer group; groups past the cap are summed under \"~other\".", "group")
	descGroupLag      = desc("flowd_group_lag_messages", "Messages a consumer group has still to consume, summed over its topics and queues (labelled groups only).", "group")
	descQueueLag      = desc("flowd_queue_lag_messages", "Messages a consumer group has still to consume in one queue: max offset minus committed offset (minus min offset when nothing was committed).", "group", "topic", "queue")
	descSegments      = desc("flowd_store_segments", "Commit-log segment files.")
	descLogBytes      = desc("flowd_store_commit_log_bytes", "Bytes of commit log stored: end of the written log minus the oldest offset still kept.")
	descUnflushed     = desc("flowd_store_unflushed_bytes", "Bytes of commit log written but not yet known durable (written end minus flushed offset).")
	descUndispatched  = desc("flowd_store_undispatched_bytes", "Bytes of commit log not yet dispatched to consume queues (written end minus dispatched offset).")
	descLogOffset     = desc("flowd_store_commit_log_offset_bytes", "Commit-log positions: min (oldest kept), max (written end), flushed, dispatched.", "position")
	descFsyncs        = desc("flowd_store_fsyncs_total", "Commit-log fsyncs since the store opened (group commit makes it smaller than the synchronous appends).")
	descCQs           = desc("flowd_store_consume_queues", "Consume queues (topic, queue id pairs).")
	descWritable      = desc("flowd_store_writable", "1 while the store accepts writes, 0 after a write failure stopped it (disk full, failed flush).")
	descReadErrors    = desc("flowd_store_read_errors_total", "Reads of store files (commit log, consume queues, key index) that failed with an I/O error or came back short since the store opened; no offset moves past a message that could not be read.")
	descTxn           = desc("flowd_transactions_pending", "Transactional half messages waiting for their outcome.")
	descPopInFlight   = desc("flowd_pop_in_flight", "Messages handed out to pop receivers and neither acknowledged nor expired yet.")
	descPopAcks       = desc("flowd_pop_acks_total", "Pop messages acknowledged since the broker started.")
	descPopRedeliv    = desc("flowd_pop_redeliveries_total", "Pop messages handed out again after their invisibility passed, since the broker started.")
	descPopDLQ        = desc("flowd_pop_dead_lettered_total", "Pop messages sent to their group's dead-letter topic (max attempts, or on request) since the broker started.")
)

func (c *brokerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descParked, descConns, descEventsDropped, descTopics, descGroups,
		descClients, descLockedQueues, descMembers, descGroupLag, descQueueLag, descSegments, descLogBytes,
		descUnflushed, descUndispatched, descLogOffset, descFsyncs, descCQs, descWritable, descReadErrors, descTxn,
		descPopInFlight, descPopAcks, descPopRedeliv, descPopDLQ} {
		ch <- d
	}
}

func (c *brokerCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.b.Status()
	gauge(ch, descParked, float64(st.WaitingPulls))
	gauge(ch, descConns, float64(c.b.Connections()))
	counter(ch, descEventsDropped, st.EventsDropped)
	gauge(ch, descTopics, float64(st.Topics))
	gauge(ch, descGroups, float64(st.Groups))
	gauge(ch, descClients, float64(st.Clients))
	gauge(ch, descLockedQueues, float64(st.LockedQueues))
	gauge(ch, descTxn, float64(c.b.PendingTransactions()))
	pop := c.b.PopTotals()
	gauge(ch, descPopInFlight, float64(pop.InFlight))
	counter(ch, descPopAcks, pop.Acked)
	counter(ch, descPopRedeliv, pop.Redelivered)
	counter(ch, descPopDLQ, pop.DeadLettered)

	s := st.Store
	gauge(ch, descSegments, float64(s.Segments))
	gauge(ch, descLogBytes, float64(s.CommitLogMaxOffset-s.CommitLogMinOffset))
	gauge(ch, descUnflushed, float64(max(s.CommitLogMaxOffset-s.FlushedOffset, 0)))
	gauge(ch, descUndispatched, float64(max(s.CommitLogMaxOffset-s.DispatchedOffset, 0)))
	gauge(ch, descLogOffset, float64(s.CommitLogMinOffset), "min")
	gauge(ch, descLogOffset, float64(s.CommitLogMaxOffset), "max")
	gauge(ch, descLogOffset, float64(s.FlushedOffset), "flushed")
	gauge(ch, descLogOffset, float64(s.DispatchedOffset), "dispatched")
	counter(ch, descFsyncs, uint64(s.Fsyncs))
	gauge(ch, descCQs, float64(s.ConsumeQueues))
	writable := 1.0
	if s.WriteFailure != nil {
		writable = 0
	}
	gauge(ch, descWritable, writable)
	counter(ch, descReadErrors, uint64(s.ReadErrors))

	// Groups come sorted by name: the first MaxGroups keep their label, so a group's series
	// does not move to "~other" because of traffic elsewhere. DescribeGroup (which walks the
	// offset table) runs for labelled groups only, which bounds a scrape's cost too.
	otherMembers, queueSeries := 0, 0
	groups := c.b.Groups()
	for i, g := range groups {
		if i >= c.opts.MaxGroups {
			otherMembers += g.Members
			continue
		}
		gauge(ch, descMembers, float64(g.Members), g.Name)
		info, err := c.b.DescribeGroup(g.Name)
		if err != nil {
			continue // forgotten since Groups listed it
		}
		gauge(ch, descGroupLag, float64(info.Lag), g.Name)
		for _, t := range info.Topics {
			for _, q := range t.Queues {
				if queueSeries >= c.opts.MaxQueueSeries {
					break
				}
				queueSeries++
				gauge(ch, descQueueLag, float64(q.Lag), g.Name, t.Topic, strconv.Itoa(int(q.QueueID)))
			}
		}
	}
	if len(groups) > c.opts.MaxGroups {
		gauge(ch, descMembers, float64(otherMembers), OtherLabel)
	}
}

// pluginCollector reads the plugins' runtime counters at scrape time.
type pluginCollector struct{ stats func() []plugins.PluginStats }

var (
	descPluginCalls     = desc("flowd_plugin_calls_total", "Calls into a plugin's active version since it was loaded (a new version starts from zero).", "plugin", "kind", "version")
	descPluginFaults    = desc("flowd_plugin_faults_total", "Faulted plugin calls by fault: trap, timeout (time limit per call), memory (memory cap), bad_output (malformed result), guest_error (error code).", "plugin", "kind", "version", "fault")
	descPluginReloads   = desc("flowd_plugin_reloads_total", "Faulted plugin instances replaced.", "plugin", "kind", "version")
	descPluginInstances = desc("flowd_plugin_instances", "Instances of a plugin's active version alive (idle or borrowed).", "plugin", "kind", "version")
	descPluginBorrowed  = desc("flowd_plugin_instances_busy", "Instances of a plugin's active version serving a call now.", "plugin", "kind", "version")
	descPluginLogDrops  = desc("flowd_plugin_log_lines_dropped_total", "Guest log lines dropped by the rate limit.", "plugin", "kind", "version")
)

func (c *pluginCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPluginCalls, descPluginFaults, descPluginReloads, descPluginInstances, descPluginBorrowed, descPluginLogDrops} {
		ch <- d
	}
}

func (c *pluginCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.stats() {
		l := []string{p.Name, string(p.Kind), p.Version}
		counter(ch, descPluginCalls, p.Calls, l...)
		for k := range runtime.NumFaultKinds {
			counter(ch, descPluginFaults, p.Faults[k], append(l, k.String())...)
		}
		counter(ch, descPluginReloads, p.Reloads, l...)
		gauge(ch, descPluginInstances, float64(p.Instances), l...)
		gauge(ch, descPluginBorrowed, float64(p.Borrowed), l...)
		counter(ch, descPluginLogDrops, p.LogLinesDropped, l...)
	}
}

// publisherCollector reads the NATS event publisher's counters at scrape time.
type publisherCollector struct{ stats func() control.PublisherStats }

var (
	descNATSPublished = desc("flowd_nats_events_published_total", "Broker events handed to the NATS connection.")
	descNATSBuffered  = desc("flowd_nats_events_buffered", "Broker events waiting for NATS to come back.")
	descNATSDropped   = desc("flowd_nats_events_dropped_total", "Broker events lost because NATS stayed unreachable longer than the buffer lasted.")
	descNATSConnected = desc("flowd_nats_connected", "1 while the NATS connection is up.")
)

func (c *publisherCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descNATSPublished, descNATSBuffered, descNATSDropped, descNATSConnected} {
		ch <- d
	}
}

func (c *publisherCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	counter(ch, descNATSPublished, s.Published)
	gauge(ch, descNATSBuffered, float64(s.Buffered))
	counter(ch, descNATSDropped, s.Dropped)
	connected := 0.0
	if s.Connected {
		connected = 1
	}
	gauge(ch, descNATSConnected, connected)
}

// pipelineCollector reads the hosted pipelines' counters at scrape time.
type pipelineCollector struct{ stats func() []PipelineStats }

var (
	descPipelineIn         = desc("flowd_pipeline_messages_in_total", "Messages a pipeline polled and processed since it started (a message read again from the retry topic counts again).", "pipeline")
	descPipelineOut        = desc("flowd_pipeline_records_out_total", "Records the pipeline's sink acknowledged since it started.", "pipeline")
	descPipelineFiltered   = desc("flowd_pipeline_messages_filtered_total", "Messages the pipeline's transforms turned into nothing (the selector's rejects never leave the broker).", "pipeline")
	descPipelineFailed     = desc("flowd_pipeline_messages_failed_total", "Messages the pipeline sent back to its retry topic after its delivery attempts.", "pipeline")
	descPipelineSinkErrors = desc("flowd_pipeline_sink_errors_total", "Failed delivery attempts of the pipeline's sink.", "pipeline")
)

func (c *pipelineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPipelineIn, descPipelineOut, descPipelineFiltered, descPipelineFailed, descPipelineSinkErrors} {
		ch <- d
	}
}

func (c *pipelineCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.stats() {
		counter(ch, descPipelineIn, p.In, p.Name)
		counter(ch, descPipelineOut, p.Out, p.Name)
		counter(ch, descPipelineFiltered, p.Filtered, p.Name)
		counter(ch, descPipelineFailed, p.Failed, p.Name)
		counter(ch, descPipelineSinkErrors, p.SinkErrors, p.Name)
	}
}
