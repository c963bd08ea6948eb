package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/consumer/allocate"
	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/metrics"
	"github.com/flowd-io/flowd/pipeline"
	"github.com/flowd-io/flowd/plugins"
)

// pipelineDrainTimeout bounds how long the daemon waits for a pipeline to deliver and
// commit what it polled when it stops it (shutdown, or a reload removing or changing it).
const pipelineDrainTimeout = 30 * time.Second

// pipelineHost runs the pipelines of the configuration file and those created over NATS
// (shared through the pipelines bucket) on a pipeline.Manager. The pipelines live until the
// daemon stops them: their context is not the signal context, so that SIGTERM drains them
// (Stop) rather than killing them.
type pipelineHost struct {
	m    *pipeline.Manager
	ctx  context.Context
	log  *slog.Logger
	emit func(pipeline.Event)
	node string // the broker's name, for messages

	// mu serialises the changes (a reload, the bucket's watch) and guards what follows.
	mu sync.Mutex
	// running is the definitions started, by name: what a change compares against.
	running map[string]pipeline.Definition
	// file and shared are the definitions of the configuration file and of the bucket.
	file, shared []pipeline.Definition
	// ready is set by the first apply (start's step 6): shared definitions reported
	// before are kept until then. closed is set by close: nothing starts after it.
	ready, closed bool
}

// newPipelineHost creates the Manager once the broker serves. Pipelines read through this
// daemon's name service, or through the broker's own listener (which answers route
// requests too) when the name service is off, unless their definition names source name
// servers of another flowd. Transforms and allocator plugins come from
// the plugin registry; events go to the publisher, and NATS sinks publish on the control
// plane's connection, when NATS is on (nc nil: off).
func newPipelineHost(ctx context.Context, b *broker.Broker, reg *plugins.Registry, nc *nats.Conn, pub func(pipeline.Event), log *slog.Logger) (*pipelineHost, error) {
	ns := b.NamesrvAddr()
	if ns == "" {
		ns = b.Addr()
	}
	log = log.With("component", "pipeline")
	h := &pipelineHost{ctx: context.WithoutCancel(ctx), log: log, running: map[string]pipeline.Definition{}}
	h.emit = func(e pipeline.Event) {
		if e.Err != nil {
			log.Warn("pipeline "+string(e.Type), "pipeline", e.Pipeline, "err", e.Err)
		} else {
			log.Info("pipeline "+string(e.Type), "pipeline", e.Pipeline)
		}
		if pub != nil {
			pub(e)
		}
	}
	brokerName := b.Status().BrokerName
	h.node = brokerName
	m, err := pipeline.NewManager(pipeline.Options{
		NameServers: []string{ns},
		Logger:      log,
		OnEvent:     h.emit,
		NATS:        nc,
		Transforms: func(name string) (pipeline.Transformer, error) {
			t, err := reg.Transform(name)
			if err != nil {
				return nil, err
			}
			return t, nil
		},
		Allocators: func(name string) (allocate.Strategy, error) {
			a, err := reg.Allocator(name)
			if err != nil {
				return nil, err
			}
			return &plugins.AllocatorStrategy{Allocator: a}, nil
		},
		QueueEnd: func(mq consumer.MessageQueue) (int64, bool) {
			if mq.BrokerName != brokerName {
				return 0, false
			}
			return b.StoreMax(mq.Topic, int32(mq.QueueID)), true
		},
	})
	if err != nil {
		return nil, fmt.Errorf("serve: pipelines: %w", err)
	}
	h.m = m
	return h, nil
}

// apply makes defs the configuration file's pipelines and the running pipelines those of
// the file and the bucket: it stops (draining) the ones removed, restarts the ones changed
// and starts the new ones. A pipeline that does not start is logged and reported as
// pipeline.failed; the others still run.
func (h *pipelineHost) apply(defs []pipeline.Definition) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.file, h.ready = defs, true
	return h.syncLocked()
}

// setShared makes defs the bucket's pipelines (the watch's report) and applies them once
// the host is ready.
func (h *pipelineHost) setShared(defs []pipeline.Definition) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.shared = defs
	if !h.ready || h.closed {
		return
	}
	if err := h.syncLocked(); err != nil {
		h.log.Error("pipelines created over NATS: not all applied (tried again at the next change)", "err", err)
	}
}

// inFile reports whether the configuration file defines a pipeline of that name.
func (h *pipelineHost) inFile(name string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.ContainsFunc(h.file, func(d pipeline.Definition) bool { return d.Name == name })
}

// syncLocked runs the file's pipelines and the bucket's, the file's winning a name both
// hold (logged: the bucket refuses such a creation on this node, but another node's file
// may have the name).
func (h *pipelineHost) syncLocked() error {
	if h.closed {
		return nil
	}
	defs := slices.Clone(h.file)
	for _, d := range h.shared {
		if slices.ContainsFunc(h.file, func(f pipeline.Definition) bool { return f.Name == d.Name }) {
			h.log.Warn("a pipeline created over NATS has the name of one of the configuration file: the file's runs here", "pipeline", d.Name)
			continue
		}
		defs = append(defs, d)
	}
	want := map[string]pipeline.Definition{}
	for _, d := range defs {
		want[d.Name] = d
	}
	var errs []error
	for name, old := range h.running {
		if d, ok := want[name]; ok && reflect.DeepEqual(d, old) {
			continue
		}
		if err := h.stop(name); err != nil {
			errs = append(errs, err)
		}
	}
	for _, d := range defs {
		if _, ok := h.running[d.Name]; ok {
			continue
		}
		if err := h.m.Start(h.ctx, d); err != nil {
			err = fmt.Errorf("pipeline %s: %w", d.Name, err)
			h.emit(pipeline.Event{Type: pipeline.EventFailed, Pipeline: d.Name, Time: time.Now(), Err: err})
			errs = append(errs, err)
			continue
		}
		h.running[d.Name] = d
	}
	return errors.Join(errs...)
}

func (h *pipelineHost) stop(name string) error {
	delete(h.running, name)
	ctx, cancel := context.WithTimeout(h.ctx, pipelineDrainTimeout)
	defer cancel()
	if err := h.m.Stop(ctx, name); err != nil && !errors.Is(err, pipeline.ErrNotFound) {
		return fmt.Errorf("stop pipeline %s: %w", name, err)
	}
	return nil
}

// close drains every pipeline within pipelineDrainTimeout (and ctx), so that the rest of
// the shutdown keeps its share of the bound.
func (h *pipelineHost) close(ctx context.Context) error {
	h.mu.Lock()
	h.closed = true
	clear(h.running)
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, pipelineDrainTimeout)
	defer cancel()
	return h.m.Close(ctx)
}

// lagUnknown explains the word pipeline list writes for a lag it cannot know.
const lagUnknown = "LAG unknown: a queue with no committed offset yet, a source on another flowd (source_name_servers), or a pipeline not running"

func printPipelines(w io.Writer, ps ...pipeline.Status) {
	fmt.Fprintln(w, "NAME\tSTATE\tTOPICS\tSINK\tIN\tOUT\tFILTERED\tFAILED\tLAG")
	unknown := false
	for _, p := range ps {
		lag := pipelineLag(p)
		if lag == "unknown" {
			unknown = true
		}
		sink := p.Definition.Sink.Type
		switch {
		case p.Definition.Sink.Topic != "":
			sink += ":" + p.Definition.Sink.Topic
		case p.Definition.Sink.Subject != "":
			sink += ":" + p.Definition.Sink.Subject
		}
		state := string(p.State)
		if p.Err != "" {
			state += " (" + p.Err + ")"
		}
		c := p.Counters
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\n", p.Name, state, strings.Join(p.Definition.Topics, ","), sink,
			c.In, c.Out, c.Filtered, c.Failed, lag)
	}
	if unknown {
		fmt.Fprintln(w, lagUnknown)
	}
}

// pipelineLag is the messages a pipeline has still to read in the queues it owns, or
// "unknown" when that cannot be told: a stopped or failed pipeline owns no queue, and a
// queue's lag is -1 when it has no committed offset or lives on another flowd.
func pipelineLag(p pipeline.Status) string {
	if p.State != pipeline.StateRunning && p.State != pipeline.StatePaused {
		return "unknown"
	}
	lag := int64(0)
	for _, q := range p.Queues {
		if q.Lag < 0 {
			return "unknown"
		}
		lag += q.Lag
	}
	return fmt.Sprint(lag)
}

func pipelineCommand() *cobra.Command {
	o := &clientOpts{}
	cmd := &cobra.Command{Use: "pipeline", Short: "Create, delete, list, pause, resume and seek the pipelines of a running daemon"}
	o.addFlags(cmd)
	list := &cobra.Command{
		Use: "list [NAME]", Short: "List the pipelines with their state and counters", Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var req control.PipelineListRequest
			if len(args) == 1 {
				req.Name = args[0]
			}
			return call(cmd, o, "pipeline.list", req, func(w io.Writer, r *control.PipelineListReply) { printPipelines(w, r.Pipelines...) })
		},
	}
	nameCmd := func(verb, short string) *cobra.Command {
		return &cobra.Command{
			Use: verb + " NAME", Short: short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return call(cmd, o, "pipeline."+verb, control.PipelineRequest{Name: args[0]},
					func(w io.Writer, r *control.PipelineReply) { printPipelines(w, r.Pipeline) })
			},
		}
	}
	var ts, topic, brokerName string
	var queueID int
	var offset int64
	seek := &cobra.Command{
		Use:   "seek NAME first|last|timestamp|offset",
		Short: "Move a pipeline's position in all its queues, or in one (--topic, --queue; required with offset)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := control.PipelineSeekRequest{Name: args[0], Position: args[1], Offset: offset}
			if ts != "" {
				t, err := time.Parse(time.RFC3339Nano, ts)
				if err != nil {
					return fmt.Errorf("pipeline seek: --timestamp: %w", err)
				}
				req.Timestamp = t
			}
			if topic != "" {
				req.Queue = &consumer.MessageQueue{Topic: topic, BrokerName: brokerName, QueueID: queueID}
			}
			return call(cmd, o, "pipeline.seek", req, func(w io.Writer, r *control.PipelineReply) { printPipelines(w, r.Pipeline) })
		},
	}
	seek.Flags().StringVar(&ts, "timestamp", "", "RFC 3339 time, with position timestamp")
	seek.Flags().Int64Var(&offset, "offset", 0, "queue offset, with position offset")
	seek.Flags().StringVar(&topic, "topic", "", "topic of the one queue to move")
	seek.Flags().IntVar(&queueID, "queue", 0, "queue id of the one queue to move")
	seek.Flags().StringVar(&brokerName, "broker-name", "broker-a", "broker name of the one queue to move")
	cmd.AddCommand(list, nameCmd("pause", "Stop a pipeline's polling; it keeps its queues"),
		nameCmd("resume", "Resume a paused pipeline"), seek)
	cmd.AddCommand(pipelineDefineCommands(o)...)
	return cmd
}

// stats returns the pipelines' counters for metrics.
func (h *pipelineHost) stats() []metrics.PipelineStats {
	counters := h.m.Counters()
	out := make([]metrics.PipelineStats, 0, len(counters))
	for name, c := range counters {
		out = append(out, metrics.PipelineStats{Name: name, In: c.In, Out: c.Out, Filtered: c.Filtered, Failed: c.Failed, SinkErrors: c.SinkErrors})
	}
	return out
}
