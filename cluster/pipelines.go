package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowd-io/flowd/pipeline/definition"
)

// Errors of PipelineStore's Create and Delete.
var (
	// ErrPipelineExists: the bucket holds a definition of that name already (the first
	// creation wins; delete it first to replace it).
	ErrPipelineExists = errors.New("pipeline definition exists already")
	// ErrPipelineNotFound: the bucket holds no definition of that name.
	ErrPipelineNotFound = errors.New("no pipeline definition of that name")
	// ErrPipelinesNotReady: the bucket could not be reached yet (JetStream down, or its
	// leader not elected while the cluster forms); the store keeps trying.
	ErrPipelinesNotReady = errors.New("pipeline definitions not reachable yet: JetStream is not ready (the cluster may still be forming)")
)

// PipelineRecord is a pipeline's entry in the pipelines bucket: its definition as created
// and who created it when.
type PipelineRecord struct {
	Definition definition.Definition `json:"definition"`
	Creator    string                `json:"creator"`
	Created    time.Time             `json:"created"`
}

// PipelineOptions configure a PipelineStore. As with Options, the zero value of every field
// but Conn is its documented default.
type PipelineOptions struct {
	// Conn is the NATS connection the bucket is reached through. Required; not closed by
	// the store.
	Conn *nats.Conn
	// Bucket is the KV bucket of definitions, one key per pipeline name. Default
	// "flowd_pipelines".
	Bucket string
	// Replicas is the bucket's replica count when this store creates it. Default 0:
	// min(3, the servers of the NATS cluster the connection knows of).
	Replicas int
	// Node is what PipelineRecord.Creator records of a creation made here.
	Node string
	// RetryInterval is how often a store that could not bind the bucket tries again.
	// Default 2 s.
	RetryInterval time.Duration
	// RequestTimeout bounds each JetStream call. Default 5 s.
	RequestTimeout time.Duration
	// Logger; default slog.Default().
	Logger *slog.Logger
	// OnChange receives every definition of the bucket, sorted by name, once the bucket is
	// loaded (even empty) and after every change; called in order on the store's watch
	// goroutine, so a slow OnChange delays the next change, never reorders it.
	OnChange func([]definition.Definition)
}

const defaultPipelinesBucket = "flowd_pipelines"

// PipelineStore is the cluster's pipeline definitions: a JetStream KV bucket watched into a
// local copy, so that every node hosting a store runs the same pipelines. It is apart from
// Member because a node with no cluster keeps its created pipelines the same way, in the
// bucket of its own JetStream (so in its data directory).
type PipelineStore struct {
	opts PipelineOptions
	log  *slog.Logger

	mu   sync.RWMutex
	kv   jetstream.KeyValue // nil until bound
	recs map[string]PipelineRecord

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// OpenPipelines binds (creating it if need be) the pipelines bucket and starts watching it.
// When JetStream cannot be reached it logs, returns the store and keeps trying every
// RetryInterval: Create and Delete fail with ErrPipelinesNotReady meanwhile, and OnChange is
// not called until the bucket is loaded.
func OpenPipelines(ctx context.Context, o PipelineOptions) (*PipelineStore, error) {
	if o.Conn == nil {
		return nil, errors.New("cluster pipelines: PipelineOptions.Conn is required")
	}
	if o.Bucket == "" {
		o.Bucket = defaultPipelinesBucket
	}
	if o.Replicas < 0 || o.Replicas > 5 {
		return nil, fmt.Errorf("cluster pipelines: Replicas %d is outside 0..5", o.Replicas)
	}
	if o.RetryInterval <= 0 {
		o.RetryInterval = defaultRetryInterval
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = defaultRequestTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &PipelineStore{opts: o, log: o.Logger.With("bucket", o.Bucket), recs: map[string]PipelineRecord{}}
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	kv, err := s.bind(ctx)
	if err != nil {
		s.log.Warn("cluster pipelines: bucket not reachable yet, retrying", "retry", o.RetryInterval, "err", err)
	}
	s.wg.Add(1)
	go s.run(kv)
	return s, nil
}

// bind creates or binds the bucket.
func (s *PipelineStore) bind(ctx context.Context) (jetstream.KeyValue, error) {
	js, err := jetstream.New(s.opts.Conn)
	if err != nil {
		return nil, fmt.Errorf("cluster pipelines: jetstream: %w", err)
	}
	replicas := s.opts.Replicas
	if replicas == 0 {
		replicas = max(1, min(3, len(s.opts.Conn.Servers())))
	}
	cfg := jetstream.KeyValueConfig{Bucket: s.opts.Bucket, Description: "flowd: pipeline definitions", History: 1, Replicas: replicas}
	ctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = js.KeyValue(ctx, cfg.Bucket) // the first creator's settings hold
	}
	if err != nil {
		return nil, fmt.Errorf("cluster pipelines: bucket %q: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// run binds the bucket (kv nil: not bound yet), then watches it until Close.
func (s *PipelineStore) run(kv jetstream.KeyValue) {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.RetryInterval)
	defer t.Stop()
	for kv == nil {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		var err error
		if kv, err = s.bind(s.ctx); err != nil {
			s.log.Debug("cluster pipelines: bucket still not reachable", "err", err)
			continue
		}
		s.log.Info("cluster pipelines: bucket bound after retrying")
	}
	for s.ctx.Err() == nil {
		w, err := kv.WatchAll(s.ctx)
		if err == nil {
			s.mu.Lock()
			s.kv = kv
			s.mu.Unlock()
			s.watch(w)
			if s.ctx.Err() != nil {
				return
			}
			err = errors.New("the watch ended")
		}
		s.log.Warn("cluster pipelines: watch, retrying", "err", err)
		select {
		case <-s.ctx.Done():
		case <-t.C:
		}
	}
}

// watch takes the bucket's changes into the copy and reports them until the watcher ends.
func (s *PipelineStore) watch(w jetstream.KeyWatcher) {
	defer func() { _ = w.Stop() }()
	loaded := false
	fresh := map[string]PipelineRecord{} // the initial values: they replace the copy at once
	for {
		select {
		case <-s.ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				loaded = true
				s.mu.Lock()
				s.recs = fresh
				s.mu.Unlock()
				s.report()
				continue
			}
			if !loaded {
				if name, rec, ok := s.decode(e); ok {
					fresh[name] = rec
				}
				continue
			}
			if s.applyEntry(e) {
				s.report()
			}
		}
	}
}

// decode reads one put entry; ok false for a deletion or an entry that is not a valid
// definition of its key's name (logged: a node never runs what it cannot check).
func (s *PipelineStore) decode(e jetstream.KeyValueEntry) (string, PipelineRecord, bool) {
	var rec PipelineRecord
	if e.Operation() != jetstream.KeyValuePut {
		return "", rec, false
	}
	name, err := decodeKey(e.Key())
	if err == nil {
		err = json.Unmarshal(e.Value(), &rec)
	}
	if err == nil && rec.Definition.Name != name {
		err = fmt.Errorf("the definition is named %q", rec.Definition.Name)
	}
	if err == nil {
		err = rec.Definition.Validate()
	}
	if err != nil {
		s.log.Warn("cluster pipelines: ignoring a malformed entry", "key", e.Key(), "err", err)
		return "", rec, false
	}
	return name, rec, true
}

// applyEntry applies one change after the load and reports whether the copy changed.
func (s *PipelineStore) applyEntry(e jetstream.KeyValueEntry) bool {
	if e.Operation() != jetstream.KeyValuePut {
		name, err := decodeKey(e.Key())
		if err != nil {
			return false
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		_, had := s.recs[name]
		delete(s.recs, name)
		return had
	}
	name, rec, ok := s.decode(e)
	if !ok {
		return false
	}
	s.mu.Lock()
	s.recs[name] = rec
	s.mu.Unlock()
	return true
}

func (s *PipelineStore) report() {
	if s.opts.OnChange != nil {
		s.opts.OnChange(s.Definitions())
	}
}

// Ready reports whether the bucket is bound and watched.
func (s *PipelineStore) Ready() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.kv != nil
}

// Definitions returns the watched copy's definitions, sorted by name.
func (s *PipelineStore) Definitions() []definition.Definition {
	s.mu.RLock()
	out := make([]definition.Definition, 0, len(s.recs))
	for _, rec := range s.recs {
		out = append(out, rec.Definition)
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(x, y definition.Definition) int { return cmp.Compare(x.Name, y.Name) })
	return out
}

// Get returns the watched copy's record of name.
func (s *PipelineStore) Get(name string) (PipelineRecord, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	rec, ok := s.recs[name]
	return rec, ok
}

func (s *PipelineStore) bucket() (jetstream.KeyValue, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.kv == nil {
		return nil, ErrPipelinesNotReady
	}
	return s.kv, nil
}

// Create validates def and stores it, unless the bucket holds that name already: KV Create
// is compare-and-set, so of two nodes creating one name at once the first wins and the
// second is told ErrPipelineExists. The error of an invalid definition wraps
// definition.ErrInvalidDefinition and names the field; nothing is stored then. Every store
// (this one included) reports the definition through OnChange once its watch brings it.
func (s *PipelineStore) Create(ctx context.Context, def definition.Definition) error {
	if err := def.Validate(); err != nil {
		return err
	}
	kv, err := s.bucket()
	if err != nil {
		return fmt.Errorf("create pipeline %q: %w", def.Name, err)
	}
	data, err := json.Marshal(PipelineRecord{Definition: def, Creator: s.opts.Node, Created: time.Now().UTC()})
	if err != nil {
		return fmt.Errorf("create pipeline %q: encode: %w", def.Name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	if _, err := kv.Create(ctx, encodeKey(def.Name), data); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("create pipeline %q: %w", def.Name, ErrPipelineExists)
		}
		return fmt.Errorf("create pipeline %q: %w", def.Name, err)
	}
	return nil
}

// Delete removes name's definition from the bucket, so that every node stops it; a name the
// bucket does not hold is ErrPipelineNotFound.
func (s *PipelineStore) Delete(ctx context.Context, name string) error {
	kv, err := s.bucket()
	if err != nil {
		return fmt.Errorf("delete pipeline %q: %w", name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	e, err := kv.Get(ctx, encodeKey(name))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("delete pipeline %q: %w", name, ErrPipelineNotFound)
	}
	if err != nil {
		return fmt.Errorf("delete pipeline %q: %w", name, err)
	}
	// On the revision read: a deletion racing another never removes a definition created
	// again in between.
	if err := kv.Delete(ctx, encodeKey(name), jetstream.LastRevision(e.Revision())); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return fmt.Errorf("delete pipeline %q: changed concurrently, try again: %w", name, err)
		}
		return fmt.Errorf("delete pipeline %q: %w", name, err)
	}
	return nil
}

// Close stops the watch; OnChange is not called after it returns. The bucket stays.
func (s *PipelineStore) Close() {
	s.cancel()
	s.wg.Wait()
}
