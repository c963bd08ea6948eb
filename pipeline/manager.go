package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/consumer/allocate"
	"github.com/flowd-io/flowd/producer"
)

// Errors callers branch on.
var (
	// ErrExists: a pipeline of that name is running.
	ErrExists = errors.New("pipeline: already exists")
	// ErrNotFound: no pipeline of that name.
	ErrNotFound = errors.New("pipeline: not found")
	// ErrNotRunning: the pipeline has stopped or failed.
	ErrNotRunning = errors.New("pipeline: not running")
	// ErrUnavailable: the definition needs something the Manager was not given (a NATS
	// connection, a plugin resolver) or a plugin that does not exist.
	ErrUnavailable = errors.New("pipeline: resource unavailable")
	// ErrInvalidArgument: a malformed request (a seek without its position). A
	// *FieldError names the field at fault.
	ErrInvalidArgument = errors.New("pipeline: invalid argument")
)

// EventType names what happened to a pipeline.
type EventType string

// Event types.
const (
	EventStarted EventType = "started"
	EventStopped EventType = "stopped"
	EventPaused  EventType = "paused"
	EventResumed EventType = "resumed"
	EventFailed  EventType = "failed"
)

// Event is a change of a pipeline's state, for the control plane to publish.
type Event struct {
	Type     EventType
	Pipeline string
	Time     time.Time
	// Err is why it failed, or why it stopped when it was killed rather than stopped.
	Err error
}

// Controller is what the control plane needs of a Manager. A clustered implementation keeps
// the definitions elsewhere (NATS KV) and runs them on a local Manager.
type Controller interface {
	Start(ctx context.Context, def Definition) error
	Stop(ctx context.Context, name string) error
	Pause(ctx context.Context, name string) error
	Resume(ctx context.Context, name string) error
	Seek(ctx context.Context, name string, req SeekRequest) error
	Get(ctx context.Context, name string) (Status, error)
	List(ctx context.Context) ([]Status, error)
}

var _ Controller = (*Manager)(nil)

// Options are what a Manager's pipelines share.
type Options struct {
	// NameServers are this flowd's name servers: where pipelines without source name
	// servers of their own read, and where a topic sink without name servers of its own
	// writes. Required.
	NameServers []string
	// Logger; default slog.Default().
	Logger *slog.Logger
	// OnEvent receives every event, on the goroutine that caused it; it must not block for
	// long nor call the Manager. Default none.
	OnEvent func(Event)
	// Transforms resolves a transform name of a Definition, e.g. with a plugins.Registry's
	// Transform method. Required by definitions with transforms.
	Transforms func(name string) (Transformer, error)
	// Allocators resolves an allocator name that is not a built-in one, e.g. to a
	// *plugins.AllocatorStrategy over a registry's allocator. Default none.
	Allocators func(name string) (allocate.Strategy, error)
	// NATS is the connection NATS sinks publish on. Required by NATS sinks.
	NATS *nats.Conn
	// HTTPClient posts to webhooks; default a client with the sink's timeout.
	HTTPClient *http.Client
	// Stdout is where stdout sinks write; default os.Stdout.
	Stdout io.Writer
	// QueueEnd returns a queue's max offset (one past its last message), for the lag in
	// Status; a daemon hosting the broker reads it from its store. It is asked only for
	// pipelines that read through NameServers (a remote source's queues are not in this
	// store). Default none: lag -1.
	QueueEnd func(mq consumer.MessageQueue) (int64, bool)
	// ConsumerOptions and ProducerOptions are appended to those the Manager sets (timings,
	// client addresses). Client settings go in WithClientOptions, which add to the Manager's;
	// WithClient is refused, since every pipeline builds clients of its own. Default none.
	ConsumerOptions []consumer.Option
	ProducerOptions []producer.Option
}

// Manager runs pipelines by name in this process. It is safe for concurrent use.
type Manager struct {
	opts Options
	log  *slog.Logger

	mu        sync.Mutex
	pipelines map[string]*Pipeline
}

// NewManager returns a Manager with no pipelines.
func NewManager(opts Options) (*Manager, error) {
	if len(opts.NameServers) == 0 {
		return nil, fmt.Errorf("%w: name servers required", ErrInvalidArgument)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Manager{opts: opts, log: log, pipelines: map[string]*Pipeline{}}, nil
}

func (m *Manager) emit(t EventType, name string, err error) {
	if m.opts.OnEvent != nil {
		m.opts.OnEvent(Event{Type: t, Pipeline: name, Time: time.Now(), Err: err})
	}
}

// Start validates def and starts it. ctx bounds the pipeline's life: cancelling it kills the
// pipeline at once, committing only what the sink acknowledged; Stop drains instead. A
// stopped or failed pipeline of the same name is replaced.
func (m *Manager) Start(ctx context.Context, def Definition) error {
	if err := def.Validate(); err != nil {
		return err
	}
	def = def.WithDefaults()
	m.mu.Lock()
	if old, ok := m.pipelines[def.Name]; ok {
		if old == nil { // being started
			m.mu.Unlock()
			return fmt.Errorf("start %s: %w", def.Name, ErrExists)
		}
		select {
		case <-old.done:
		default:
			// Stopped or failed: its consumer and sink are closed, only its last event is
			// still going out, so the name is free (the daemon restarts a pipeline so).
			if !old.finished() {
				m.mu.Unlock()
				return fmt.Errorf("start %s: %w", def.Name, ErrExists)
			}
		}
	}
	p := &Pipeline{def: def, m: m, log: m.log.With("pipeline", def.Name), done: make(chan struct{}), changed: make(chan struct{}),
		state: StateRunning, gate: make(chan struct{}), queues: map[consumer.MessageQueue]*queueState{}}
	close(p.gate)
	m.pipelines[def.Name] = nil // reserves the name while the pipeline starts
	m.mu.Unlock()
	err := m.build(ctx, p)
	m.mu.Lock()
	if err != nil {
		delete(m.pipelines, def.Name)
	} else {
		m.pipelines[def.Name] = p
	}
	m.mu.Unlock()
	if err != nil {
		return err
	}
	m.emit(EventStarted, def.Name, nil)
	return nil
}

func (m *Manager) build(ctx context.Context, p *Pipeline) (err error) {
	def := p.def
	for _, name := range def.Transforms {
		if m.opts.Transforms == nil {
			return fmt.Errorf("start %s: transforms: %w: no transform resolver", def.Name, ErrUnavailable)
		}
		t, err := m.opts.Transforms(name)
		if err != nil {
			return fmt.Errorf("start %s: transform %s: %w: %w", def.Name, name, ErrUnavailable, err)
		}
		p.transforms = append(p.transforms, t)
	}
	strategy, err := allocate.ByName(def.Allocator)
	if err != nil {
		if m.opts.Allocators == nil {
			return fmt.Errorf("start %s: allocator: %w", def.Name, err)
		}
		if strategy, err = m.opts.Allocators(def.Allocator); err != nil {
			return fmt.Errorf("start %s: allocator %s: %w: %w", def.Name, def.Allocator, ErrUnavailable, err)
		}
	}
	from := consumer.ConsumeFromLast
	switch def.StartFrom {
	case StartFirst:
		from = consumer.ConsumeFromFirst
	case StartTimestamp:
		from = consumer.ConsumeFromTimestamp
	}
	source := m.opts.NameServers
	if len(def.SourceNameServers) > 0 {
		source = def.SourceNameServers
	}
	opts := []consumer.Option{
		consumer.WithClientOptions(client.WithNameServers(source...), client.WithLogger(p.log)),
		consumer.WithAutoCommit(false),
		consumer.WithConsumeFrom(from),
		consumer.WithAllocateStrategy(strategy),
		consumer.WithOnQueuesRevoked(p.onRevoked),
	}
	if from == consumer.ConsumeFromTimestamp {
		opts = append(opts, consumer.WithConsumeTimestamp(def.StartTimestamp))
	}
	if def.MaxReconsumeTimes > 0 {
		opts = append(opts, consumer.WithMaxReconsumeTimes(def.MaxReconsumeTimes))
	}
	if def.PullBatchSize > 0 {
		opts = append(opts, consumer.WithPullBatchSize(def.PullBatchSize))
	}
	c, err := consumer.NewLitePull(def.Group, append(opts, m.opts.ConsumerOptions...)...)
	if err != nil {
		return fmt.Errorf("start %s: consumer: %w", def.Name, err)
	}
	p.c = c
	defer func() {
		if err != nil {
			_ = c.Close(context.WithoutCancel(ctx))
		}
	}()
	for _, t := range def.Topics {
		if err := c.SubscribeSelector(t, selector{typ: def.Selector.Type, expr: def.Selector.Expression}); err != nil {
			return fmt.Errorf("start %s: subscribe %s: %w", def.Name, t, err)
		}
	}
	sink, err := m.newSink(ctx, def.Name, def.Sink)
	if err != nil {
		return fmt.Errorf("start %s: %w", def.Name, err)
	}
	p.sink = sink
	p.ctx, p.cancel = context.WithCancel(ctx)
	p.loopCtx, p.endLoop = context.WithCancel(p.ctx)
	if err := p.start(ctx); err != nil {
		p.cancel()
		_ = sink.Close(context.WithoutCancel(ctx))
		return err
	}
	return nil
}

func (m *Manager) get(name string) (*Pipeline, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.pipelines[name]
	if !ok || p == nil {
		return nil, fmt.Errorf("pipeline %s: %w", name, ErrNotFound)
	}
	return p, nil
}

// Stop drains the named pipeline: it stops polling, lets the sink acknowledge what was
// polled, commits, and leaves the group (its queues move to the other members). If ctx ends
// first the pipeline is killed (nothing more is committed) and the error says so. The
// pipeline is forgotten.
func (m *Manager) Stop(ctx context.Context, name string) error {
	p, err := m.get(name)
	if err != nil {
		return err
	}
	err = p.stop(ctx)
	m.mu.Lock()
	if m.pipelines[name] == p {
		delete(m.pipelines, name)
	}
	m.mu.Unlock()
	return err
}

// Pause stops the named pipeline's polling and waits until what it polled is processed.
// The pipeline keeps its queues.
func (m *Manager) Pause(ctx context.Context, name string) error {
	p, err := m.get(name)
	if err != nil {
		return err
	}
	if err := p.pause(ctx); err != nil {
		return err
	}
	m.emit(EventPaused, name, nil)
	return nil
}

// Resume resumes a paused pipeline.
func (m *Manager) Resume(_ context.Context, name string) error {
	p, err := m.get(name)
	if err != nil {
		return err
	}
	if err := p.resume(); err != nil {
		return err
	}
	m.emit(EventResumed, name, nil)
	return nil
}

// Seek moves the named pipeline's position in one or all of its queues. A queue the
// pipeline does not own and an offset outside the queue's stored range are a *FieldError
// ("queue", "offset"); a pipeline that has stopped or failed is ErrNotRunning.
func (m *Manager) Seek(ctx context.Context, name string, req SeekRequest) error {
	p, err := m.get(name)
	if err != nil {
		return err
	}
	// A stopped pipeline's consumer owns nothing: a seek of all its queues would succeed
	// having moved none.
	if p.finished() {
		return fmt.Errorf("seek %s: %w", name, ErrNotRunning)
	}
	if req.Queue != nil && !slices.Contains(p.c.Assignment(), *req.Queue) {
		return badArgument("queue", fmt.Errorf("pipeline %s does not own %s (its status lists the queues it owns)", name, req.Queue))
	}
	return seekError(p.seek(ctx, req), req)
}

// seekError tells the mistakes of a seek request the consumer found from failures: an
// offset outside the queue, a queue lost to a rebalance since Seek looked, a pipeline that
// stopped meanwhile.
func seekError(err error, req SeekRequest) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, consumer.ErrOffsetOutOfRange) && req.Position == SeekOffset:
		return badArgument("offset", err)
	case errors.Is(err, consumer.ErrNotAssigned) && req.Queue != nil:
		return badArgument("queue", err)
	case errors.Is(err, consumer.ErrNotRunning):
		return fmt.Errorf("%w: %w", ErrNotRunning, err)
	}
	return err
}

// Get returns the named pipeline's status.
func (m *Manager) Get(ctx context.Context, name string) (Status, error) {
	p, err := m.get(name)
	if err != nil {
		return Status{}, err
	}
	return p.status(ctx), nil
}

// List returns the status of every pipeline, by name.
func (m *Manager) List(ctx context.Context) ([]Status, error) {
	m.mu.Lock()
	ps := make([]*Pipeline, 0, len(m.pipelines))
	for _, p := range m.pipelines {
		if p != nil {
			ps = append(ps, p)
		}
	}
	m.mu.Unlock()
	out := make([]Status, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.status(ctx))
	}
	slices.SortFunc(out, func(a, b Status) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out, nil
}

// Counters returns the counters of every pipeline the Manager holds, by name. Unlike List
// it asks the broker nothing, so metrics can read it at every scrape.
func (m *Manager) Counters() map[string]Counters {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]Counters, len(m.pipelines))
	for name, p := range m.pipelines {
		if p != nil {
			out[name] = p.counters()
		}
	}
	return out
}

// Close stops every pipeline (draining, bounded by ctx).
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	names := make([]string, 0, len(m.pipelines))
	for n, p := range m.pipelines {
		if p != nil {
			names = append(names, n)
		}
	}
	m.mu.Unlock()
	var errs []error
	for _, n := range names {
		if err := m.Stop(ctx, n); err != nil && !errors.Is(err, ErrNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
