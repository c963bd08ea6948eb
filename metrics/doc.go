// Package metrics exposes flowd's state to Prometheus and answers health and readiness
// probes.
//
// Almost everything is read at scrape time: a prometheus.Collector asks the broker (Status,
// Groups, DescribeGroup, StoreStats), the plugin registry and the NATS publisher for their
// counters when /metrics is requested, so serving traffic costs nothing for it. Only what no
// snapshot can reconstruct — messages and bytes per topic, pull latency — is counted on the
// request path, through broker.Observer, which *Metrics implements with atomic adds on a
// per-topic entry found without allocating.
//
// # Label cardinality
//
// Topics and consumer groups are created by clients, so a label per topic or group could grow
// without bound. Options.MaxTopics and Options.MaxGroups cap them: the first topics (in the
// order traffic first names them) and the first groups (by name) get labels of their own,
// the rest are summed under the label value "other" (OtherLabel). Lag per queue is exported
// for labelled groups only, at most Options.MaxQueueSeries series; the rest is in the
// group's total.
package metrics
