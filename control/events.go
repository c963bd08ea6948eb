package control

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/internal/subjects"
	"github.com/flowd-io/flowd/pipeline"
	"github.com/flowd-io/flowd/protocol"
)

// EventsStreamName is the JetStream stream that keeps events when EventsConfig.Stream is set.
const EventsStreamName = "FLOWD_EVENTS"

// Headers of an event message besides the CloudEvents ones.
const (
	// HeaderSeq carries the broker's event sequence number (broker.Event.Seq) in decimal.
	// Daemon events (broker.started, broker.stopping, broker.events_dropped) have none.
	HeaderSeq = "flowd-seq"
	// HeaderMsgID is JetStream's de-duplication header; it carries the ce-id.
	HeaderMsgID = jetstream.MsgIDHeader
)

// Event names of the daemon itself, published next to the broker's own events.
const (
	// EventBrokerStarted: the broker serves. Payload: version, nats.
	EventBrokerStarted = "broker.started"
	// EventBrokerStopping: the daemon is shutting down; the broker's last events follow.
	// Payload: lastSeq, published, dropped, brokerDropped.
	EventBrokerStopping = "broker.stopping"
	// EventsDropped: events were lost while NATS was unreachable (the buffer was full).
	// Payload: dropped (this time), droppedTotal, brokerDropped.
	EventsDropped = "broker.events_dropped"
)

// EventsConfig configures the Publisher. The zero value is valid.
type EventsConfig struct {
	// Cluster is the cluster's name: the third token of every event subject, so it must be
	// a valid NATS subject token (internal/subjects.Token: no ".", "*", ">", "$" at the
	// start, or white space).
	// Default "local", the broker's default.
	Cluster string
	// Node is the broker's name within the cluster, in ce-source. Default "broker-a".
	Node string
	// Version is the daemon's version, reported in broker.started. Default "dev".
	Version string

	// Buffer is how many events are kept while NATS is unreachable; they are published in
	// order on reconnect. When it is full the oldest event is dropped and counted
	// (Publisher.Dropped), and an events_dropped event follows the reconnect. Default 10000.
	Buffer int

	// OffsetInterval coalesces offset commits: a group's commits within one interval become
	// one offset.committed event holding the latest offset of each queue. Default 1 s;
	// negative publishes every commit as an event of its own.
	OffsetInterval time.Duration

	// Stream keeps events in the JetStream stream FLOWD_EVENTS (subjects flowd.evt.>),
	// created or updated at start, de-duplicated by event id. Default false.
	Stream bool
	// StreamMaxAge is how long the stream keeps an event. Default 24 h.
	StreamMaxAge time.Duration
	// StreamMaxBytes bounds the stream's size; the oldest events go first. Default 1 GiB.
	StreamMaxBytes int64
	// StreamReplicas is the stream's replica count in a NATS cluster. Default 1.
	StreamReplicas int
	// StreamDuplicates is the window in which a re-published event id is dropped. Default
	// 2 min (JetStream's default).
	StreamDuplicates time.Duration

	// Logger receives drops, reconnect flushes and publish errors. Default slog.Default().
	Logger *slog.Logger
}

func (c *EventsConfig) withDefaults() EventsConfig {
	cfg := *c
	if cfg.Cluster == "" {
		cfg.Cluster = "local"
	}
	if cfg.Node == "" {
		cfg.Node = "broker-a"
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = 10000
	}
	if cfg.OffsetInterval == 0 {
		cfg.OffsetInterval = time.Second
	}
	if cfg.StreamMaxAge <= 0 {
		cfg.StreamMaxAge = 24 * time.Hour
	}
	if cfg.StreamMaxBytes <= 0 {
		cfg.StreamMaxBytes = 1 << 30
	}
	if cfg.StreamReplicas <= 0 {
		cfg.StreamReplicas = 1
	}
	if cfg.StreamDuplicates <= 0 {
		cfg.StreamDuplicates = 2 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// EventData is the JSON payload of every event. Fields that do not apply to an event are
// left out; docs/control.md lists which each event carries.
type EventData struct {
	Cluster string    `json:"cluster"`
	Broker  string    `json:"broker"`
	Seq     uint64    `json:"seq,omitempty"`
	Time    time.Time `json:"time"`

	Topic    string `json:"topic,omitempty"`
	Queues   int    `json:"queues,omitempty"`
	Group    string `json:"group,omitempty"`
	ClientID string `json:"clientId,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// Offsets of offset.committed: the latest commit of each queue within the interval.
	Offsets []OffsetCommit `json:"offsets,omitempty"`
	// Allocation of group.rebalanced: each member's client id and the queues it holds.
	Allocation map[string][]protocol.MessageQueue `json:"allocation,omitempty"`
	// Allocators of group.allocator_mismatch: each member's client id and allocator identity.
	Allocators map[string]string `json:"allocators,omitempty"`

	// Version and NATS (the server's client URL) of broker.started.
	Version string `json:"version,omitempty"`
	NATS    string `json:"nats,omitempty"`
	// LastSeq and Published of broker.stopping: the last broker event seen, and how many
	// events were published.
	LastSeq   uint64 `json:"lastSeq,omitempty"`
	Published uint64 `json:"published,omitempty"`
	// Dropped (events lost while NATS was unreachable, this time), DroppedTotal (since
	// start) and BrokerDropped (lost inside the broker: broker.Broker.EventsDropped) of
	// broker.events_dropped and broker.stopping.
	Dropped       uint64 `json:"dropped,omitempty"`
	DroppedTotal  uint64 `json:"droppedTotal,omitempty"`
	BrokerDropped uint64 `json:"brokerDropped,omitempty"`

	// Plugin, PluginVersion and Kind of the plugin events (plugin.deployed, .activated,
	// .failed, .removed); Reason carries a failure's error.
	Plugin        string `json:"plugin,omitempty"`
	PluginVersion string `json:"pluginVersion,omitempty"`
	Kind          string `json:"kind,omitempty"`

	// Pipeline of the pipeline events (pipeline.started, .stopped, .paused, .resumed,
	// .failed); Reason carries why it failed or was killed.
	Pipeline string `json:"pipeline,omitempty"`

	// ClusterBroker, ClusterNode and ClusterAddr of the cluster events (cluster.broker_joined,
	// .broker_left, .name_taken): the broker the registry change is about, its node and its
	// remoting address; Reason carries why it left, or the name clash.
	ClusterBroker string `json:"clusterBroker,omitempty"`
	ClusterNode   string `json:"clusterNode,omitempty"`
	ClusterAddr   string `json:"clusterAddr,omitempty"`
}

// OffsetCommit is one queue's committed offset in an offset.committed event.
type OffsetCommit struct {
	Topic   string `json:"topic"`
	QueueID int32  `json:"queueId"`
	Offset  int64  `json:"offset"`
	// Seq is the broker event sequence of this commit.
	Seq uint64 `json:"seq"`
}

// Publisher publishes the broker's events on NATS as CloudEvents 1.0 in binary mode.
//
// # Notes
//
// One mutex orders every publication, so events leave in the order of their Seq: before a
// non-offset event is published, the offset commits still being coalesced are published
// first. While the connection is down events wait in a bounded buffer (dropping the oldest)
// and are published, in order, on reconnect; the broker is never held up, because the
// broker already queues events per subscriber off its hot paths.
type Publisher struct {
	cfg    EventsConfig
	log    *slog.Logger
	n      *NATS
	nc     *nats.Conn
	b      *broker.Broker
	source string
	boot   string // prefix of ce-id: unique per publisher, so ids never repeat across restarts
	cancel func()

	mu            sync.Mutex
	closed        bool
	buf           []*nats.Msg
	pending       map[string]*offsetBatch
	timer         *time.Timer
	lastSeq       uint64
	droppedLogged uint64 // dropped count at the last report

	dropped   atomic.Uint64
	published atomic.Uint64
}

type offsetBatch struct {
	group   string
	maxSeq  uint64
	time    time.Time
	broker  string
	cluster string
	queues  map[string]OffsetCommit // by topic@queue
}

// NewPublisher creates the events stream when asked, then subscribes to the broker's
// events and publishes them on n's connection until Close. Call it before b.Start so that
// no event of the start is missed, and call Started once the broker serves.
func NewPublisher(ctx context.Context, n *NATS, b *broker.Broker, cfg EventsConfig) (*Publisher, error) {
	cfg = cfg.withDefaults()
	if err := subjects.Token(cfg.Cluster); err != nil {
		return nil, fmt.Errorf("events: cluster: %w: %w", err, ErrBadConfig)
	}
	p := &Publisher{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "events"),
		n:       n,
		nc:      n.Conn(),
		b:       b,
		source:  "flowd://" + url.PathEscape(cfg.Cluster) + "/" + url.PathEscape(cfg.Node),
		boot:    nuid.Next(),
		pending: map[string]*offsetBatch{},
	}
	if cfg.Stream {
		if err := p.ensureStream(ctx); err != nil {
			return nil, err
		}
	}
	n.watchReconnect(p.reconnected)
	p.cancel = b.Subscribe(p.handle)
	return p, nil
}

// StreamConfig is the configuration NewPublisher gives the FLOWD_EVENTS stream.
func (c EventsConfig) StreamConfig() jetstream.StreamConfig {
	c = c.withDefaults()
	return jetstream.StreamConfig{
		Name:        EventsStreamName,
		Description: "flowd control events",
		Subjects:    []string{EventSubjectPrefix + ".>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      c.StreamMaxAge,
		MaxBytes:    c.StreamMaxBytes,
		Replicas:    c.StreamReplicas,
		Duplicates:  c.StreamDuplicates,
	}
}

func (p *Publisher) ensureStream(ctx context.Context) error {
	js, err := jetstream.New(p.nc)
	if err != nil {
		return fmt.Errorf("events: jetstream: %w", err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, p.cfg.StreamConfig()); err != nil {
		return fmt.Errorf("events: stream %s: %w", EventsStreamName, err)
	}
	return nil
}

// Started publishes broker.started. Call it once the broker serves.
func (p *Publisher) Started() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.emitLocked(p.daemonMsg(EventBrokerStarted, EventData{Version: p.cfg.Version, NATS: p.n.ListenURL()}))
}

// Stopping publishes the offset commits still being coalesced and broker.stopping. Call it
// before the broker shuts down; events the broker raises while it stops still follow.
func (p *Publisher) Stopping() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.flushOffsetsLocked()
	p.emitLocked(p.daemonMsg(EventBrokerStopping, EventData{
		LastSeq: p.lastSeq, Published: p.published.Load(),
		DroppedTotal: p.dropped.Load(), BrokerDropped: p.b.EventsDropped(),
	}))
}

// Plugin publishes a plugin event (EventPluginDeployed, …) with the plugin's name as
// ce-subject. It never blocks on NATS: while the connection is down the event waits in the
// buffer like a broker event.
func (p *Publisher) Plugin(e PluginEvent) {
	d := EventData{Plugin: e.Name, PluginVersion: e.Version, Kind: e.Kind, Reason: e.Reason}
	d.Cluster, d.Broker, d.Time = p.cfg.Cluster, p.cfg.Node, time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.emitLocked(p.message(e.Type, p.boot+"."+strings.ReplaceAll(e.Type, ".", "-")+"."+nuid.Next(), e.Name, 0, d))
}

// Pipeline event names, published by Publisher.Pipeline on
// flowd.evt.<cluster>.pipeline.<event> with the pipeline's name as ce-subject.
const (
	// EventPipelineStarted: a pipeline started (at daemon start, or on a reload that added
	// or changed it). Payload: pipeline.
	EventPipelineStarted = "pipeline.started"
	// EventPipelineStopped: a pipeline stopped: drained by a stop, or killed (then reason
	// says why). Payload: pipeline, reason.
	EventPipelineStopped = "pipeline.stopped"
	// EventPipelinePaused: pipeline.pause stopped its polling. Payload: pipeline.
	EventPipelinePaused = "pipeline.paused"
	// EventPipelineResumed: pipeline.resume restarted its polling. Payload: pipeline.
	EventPipelineResumed = "pipeline.resumed"
	// EventPipelineFailed: a pipeline failed and stopped. Payload: pipeline, reason.
	EventPipelineFailed = "pipeline.failed"
)

// Pipeline publishes a pipeline event (pipeline.Options.OnEvent in the daemon) on
// flowd.evt.<cluster>.pipeline.<type>, with the pipeline's name as ce-subject. Like Plugin it
// never blocks on NATS.
func (p *Publisher) Pipeline(e pipeline.Event) {
	name := "pipeline." + string(e.Type)
	d := EventData{Pipeline: e.Pipeline}
	if e.Err != nil {
		d.Reason = e.Err.Error()
	}
	d.Cluster, d.Broker, d.Time = p.cfg.Cluster, p.cfg.Node, e.Time
	if d.Time.IsZero() {
		d.Time = time.Now()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.emitLocked(p.message(name, p.boot+"."+strings.ReplaceAll(name, ".", "-")+"."+nuid.Next(), e.Pipeline, 0, d))
}

// Close stops following the broker, publishes what is left (coalesced commits, and the
// buffer if NATS is reachable) and waits until the server has it, bounded by ctx. Events
// still buffered because NATS is unreachable are dropped, counted and logged. It does not
// close the connection: NATS.Close does.
func (p *Publisher) Close(ctx context.Context) error {
	p.cancel()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	if p.timer != nil {
		p.timer.Stop()
	}
	p.flushOffsetsLocked()
	p.flushBufferLocked()
	if left := len(p.buf); left > 0 {
		p.dropped.Add(uint64(left))
		p.buf = nil
		p.log.Warn("NATS unreachable at shutdown: events not published", "dropped", left, "droppedTotal", p.dropped.Load())
	}
	p.mu.Unlock()
	if !p.nc.IsConnected() {
		return nil
	}
	if err := p.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("events: flush: %w", err)
	}
	return nil
}

// PublisherStats is a snapshot of a Publisher's counters, for a status command.
type PublisherStats struct {
	// Published is how many events were handed to the connection.
	Published uint64 `json:"published"`
	// Buffered is how many events wait for NATS to come back.
	Buffered int `json:"buffered"`
	// Dropped is how many events were lost while NATS was unreachable (Publisher.Dropped).
	Dropped uint64 `json:"dropped"`
	// BrokerDropped is how many events the broker lost before the publisher saw them.
	BrokerDropped uint64 `json:"brokerDropped"`
	// LastSeq is the Seq of the latest broker event the publisher saw.
	LastSeq uint64 `json:"lastSeq"`
	// Connected reports whether the NATS connection is up.
	Connected bool `json:"connected"`
}

// Stats returns the publisher's counters.
func (p *Publisher) Stats() PublisherStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return PublisherStats{
		Published: p.published.Load(), Buffered: len(p.buf), Dropped: p.dropped.Load(),
		BrokerDropped: p.b.EventsDropped(), LastSeq: p.lastSeq, Connected: p.nc.IsConnected(),
	}
}

// Dropped is how many events were lost because NATS stayed unreachable longer than the
// buffer lasted (or at shutdown). Events lost inside the broker are broker.EventsDropped.
func (p *Publisher) Dropped() uint64 { return p.dropped.Load() }

// Published is how many events were handed to the connection.
func (p *Publisher) Published() uint64 { return p.published.Load() }

// Buffered is how many events wait for NATS to come back.
func (p *Publisher) Buffered() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.buf)
}

// handle runs on the broker's subscriber goroutine for this publisher.
func (p *Publisher) handle(e broker.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.lastSeq = max(p.lastSeq, e.Seq)
	if e.Type == broker.OffsetCommitted && p.cfg.OffsetInterval > 0 {
		p.coalesceLocked(e)
		return
	}
	p.flushOffsetsLocked()
	if e.Type == broker.OffsetCommitted {
		b := &offsetBatch{group: e.Group, queues: map[string]OffsetCommit{}}
		b.add(e)
		p.emitLocked(p.offsetMsg(b))
		return
	}
	p.emitLocked(p.brokerMsg(e))
}

func (b *offsetBatch) add(e broker.Event) {
	b.maxSeq, b.time, b.broker, b.cluster = e.Seq, e.Time, e.Broker, e.Cluster
	b.queues[e.Topic+"@"+strconv.Itoa(int(e.QueueID))] = OffsetCommit{Topic: e.Topic, QueueID: e.QueueID, Offset: e.Offset, Seq: e.Seq}
}

func (p *Publisher) coalesceLocked(e broker.Event) {
	b := p.pending[e.Group]
	if b == nil {
		b = &offsetBatch{group: e.Group, queues: map[string]OffsetCommit{}}
		p.pending[e.Group] = b
	}
	b.add(e)
	if p.timer == nil {
		p.timer = time.AfterFunc(p.cfg.OffsetInterval, p.offsetTimer)
	}
}

func (p *Publisher) offsetTimer() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.flushOffsetsLocked()
	}
}

// flushOffsetsLocked publishes the coalesced commits, one event per group, in the order of
// each group's latest commit.
func (p *Publisher) flushOffsetsLocked() {
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	if len(p.pending) == 0 {
		return
	}
	batches := make([]*offsetBatch, 0, len(p.pending))
	for _, b := range p.pending {
		batches = append(batches, b)
	}
	clear(p.pending)
	slices.SortFunc(batches, func(a, b *offsetBatch) int { return cmpUint(a.maxSeq, b.maxSeq) })
	for _, b := range batches {
		p.emitLocked(p.offsetMsg(b))
	}
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// emitLocked publishes m, or buffers it while the connection is down or earlier events
// still wait.
func (p *Publisher) emitLocked(m *nats.Msg) {
	if len(p.buf) > 0 && p.nc.IsConnected() {
		p.flushBufferLocked()
	}
	if len(p.buf) > 0 || !p.nc.IsConnected() {
		p.bufferLocked(m)
		return
	}
	if err := p.nc.PublishMsg(m); err != nil {
		p.log.Warn("publish event", "subject", m.Subject, "err", err)
		p.bufferLocked(m)
		return
	}
	p.published.Add(1)
}

func (p *Publisher) bufferLocked(m *nats.Msg) {
	if len(p.buf) >= p.cfg.Buffer {
		n := len(p.buf) - p.cfg.Buffer + 1
		p.buf = slices.Delete(p.buf, 0, n)
		if p.dropped.Add(uint64(n)) == p.droppedLogged+uint64(n) {
			p.log.Warn("NATS unreachable and the event buffer is full: dropping the oldest events", "buffer", p.cfg.Buffer)
		}
	}
	p.buf = append(p.buf, m)
}

// flushBufferLocked publishes buffered events in order until the buffer is empty or the
// connection fails again; then reports events dropped since the last report.
func (p *Publisher) flushBufferLocked() {
	sent := 0
	for len(p.buf) > 0 && p.nc.IsConnected() {
		if err := p.nc.PublishMsg(p.buf[0]); err != nil {
			p.log.Warn("publish buffered event", "subject", p.buf[0].Subject, "err", err)
			break
		}
		p.buf[0] = nil
		p.buf = p.buf[1:]
		sent++
	}
	p.published.Add(uint64(sent))
	if len(p.buf) == 0 {
		p.buf = nil
	}
	if sent > 0 {
		p.log.Info("published events buffered while NATS was unreachable", "events", sent, "left", len(p.buf))
	}
	total := p.dropped.Load()
	if total == p.droppedLogged || len(p.buf) > 0 || !p.nc.IsConnected() {
		return
	}
	lost := total - p.droppedLogged
	p.droppedLogged = total
	p.log.Warn("events lost while NATS was unreachable", "dropped", lost, "droppedTotal", total)
	m := p.daemonMsg(EventsDropped, EventData{Dropped: lost, DroppedTotal: total, BrokerDropped: p.b.EventsDropped()})
	if err := p.nc.PublishMsg(m); err != nil {
		p.bufferLocked(m)
		return
	}
	p.published.Add(1)
}

func (p *Publisher) reconnected() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.flushBufferLocked()
}

// brokerMsg maps one broker event (not an offset commit) to its message.
func (p *Publisher) brokerMsg(e broker.Event) *nats.Msg {
	d := EventData{
		Cluster: e.Cluster, Broker: e.Broker, Seq: e.Seq, Time: e.Time,
		Topic: e.Topic, Queues: e.Queues, Group: e.Group, ClientID: e.ClientID, Reason: e.Reason,
		Allocation: e.Allocation, Allocators: e.Allocators,
	}
	for q, off := range e.Offsets { // offset.reset
		d.Offsets = append(d.Offsets, OffsetCommit{Topic: e.Topic, QueueID: q, Offset: off, Seq: e.Seq})
	}
	slices.SortFunc(d.Offsets, func(x, y OffsetCommit) int { return cmp.Compare(x.QueueID, y.QueueID) })
	subject := e.Group
	switch e.Type {
	case broker.TopicCreated, broker.TopicDeleted, broker.TopicUpdated:
		subject = e.Topic
	case broker.StoreFailed:
		subject = e.Broker
	}
	return p.message(e.Type.String(), p.boot+"."+strconv.FormatUint(e.Seq, 10), subject, e.Seq, d)
}

func (p *Publisher) offsetMsg(b *offsetBatch) *nats.Msg {
	offs := make([]OffsetCommit, 0, len(b.queues))
	for _, o := range b.queues {
		offs = append(offs, o)
	}
	slices.SortFunc(offs, func(x, y OffsetCommit) int { return cmpUint(x.Seq, y.Seq) })
	d := EventData{Cluster: b.cluster, Broker: b.broker, Seq: b.maxSeq, Time: b.time, Group: b.group, Offsets: offs}
	return p.message(broker.OffsetCommitted.String(), p.boot+"."+strconv.FormatUint(b.maxSeq, 10), b.group, b.maxSeq, d)
}

func (p *Publisher) daemonMsg(name string, d EventData) *nats.Msg {
	d.Cluster, d.Broker, d.Time = p.cfg.Cluster, p.cfg.Node, time.Now()
	return p.message(name, p.boot+"."+strings.ReplaceAll(name, ".", "-")+"."+nuid.Next(), p.cfg.Node, 0, d)
}

// message builds a binary-mode CloudEvent. name is "<kind>.<event>".
func (p *Publisher) message(name, id, subject string, seq uint64, d EventData) *nats.Msg {
	kind, event, ok := strings.Cut(name, ".")
	if !ok {
		kind, event = "broker", name
	}
	data, err := json.Marshal(d)
	if err != nil { // EventData has only plain fields
		panic(fmt.Sprintf("encode event %s: %v", name, err))
	}
	m := nats.NewMsg(EventSubjectPrefix + "." + p.cfg.Cluster + "." + kind + "." + event)
	m.Data = data
	h := m.Header
	h.Set("ce-specversion", "1.0")
	h.Set("ce-id", id)
	h.Set("ce-type", "io.flowd."+kind+".v1."+event)
	h.Set("ce-source", p.source)
	h.Set("ce-time", d.Time.UTC().Format(time.RFC3339Nano))
	if subject != "" {
		h.Set("ce-subject", subject)
	}
	h.Set("Content-Type", "application/json")
	if seq > 0 {
		h.Set(HeaderSeq, strconv.FormatUint(seq, 10))
	}
	h.Set(HeaderMsgID, id)
	return m
}
