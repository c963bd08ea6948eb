package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowd-io/flowd/plugins"
)

// Start connects the store to the cluster through nc and makes reg, the registry running
// on it, follow the cluster's plugins. It returns once the catch-up is done: the buckets
// read, the versions this node lacks fetched and checked, the local versions the cluster
// lacks published, and the cluster's active versions swapped in. It waits at most
// PluginOptions.SyncTimeout, trying JetStream again every PluginOptions.RetryInterval
// meanwhile (a node whose NATS server is still joining the cluster reaches it within
// seconds); past it, it logs and returns nil, and the catch-up goes on in the background:
// the registry serves the local copy meanwhile, and plugin changes are refused until
// JetStream answers.
func (s *PluginStore) Start(ctx context.Context, nc *nats.Conn, reg *plugins.Registry) error {
	if s.reg != nil {
		return errors.New("cluster plugins: Start called twice")
	}
	s.reg, s.nc = reg, nc
	dctx, cancel := context.WithTimeout(ctx, s.opts.SyncTimeout)
	defer cancel()
	for {
		err := s.connect(dctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return err
		}
		if dl, _ := dctx.Deadline(); time.Until(dl) < s.opts.RetryInterval {
			s.log.Warn("cluster plugins not reachable: serving the local copy and retrying", "retry", s.opts.RetryInterval, "err", err)
			s.wg.Add(1)
			go s.retry()
			return nil
		}
		select {
		case <-dctx.Done():
		case <-time.After(s.opts.RetryInterval):
		}
	}
	select {
	case <-s.ready:
	case <-dctx.Done():
		if ctx.Err() != nil {
			return fmt.Errorf("cluster plugins: catching up: %w", ctx.Err())
		}
		s.log.Warn("cluster plugins: still catching up; serving meanwhile", "waited", s.opts.SyncTimeout)
	}
	return nil
}

// Synced reports whether the catch-up is done.
func (s *PluginStore) Synced() bool {
	select {
	case <-s.ready:
		return true
	default:
		return false
	}
}

// Ready is closed once the catch-up is done.
func (s *PluginStore) Ready() <-chan struct{} { return s.ready }

func (s *PluginStore) retry() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.RetryInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		err := s.connect(s.ctx)
		if err == nil {
			s.log.Info("cluster plugins reached after retrying")
			return
		}
		s.log.Warn("cluster plugins still not reachable", "err", err)
	}
}

// connect creates or binds the buckets and starts the watch.
func (s *PluginStore) connect(ctx context.Context) error {
	js, err := jetstream.New(s.nc)
	if err != nil {
		return fmt.Errorf("cluster plugins: jetstream: %w", err)
	}
	replicas := s.opts.Replicas
	if replicas == 0 {
		replicas = max(1, min(3, len(s.nc.Servers())))
	}
	cctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	kcfg := jetstream.KeyValueConfig{Bucket: s.opts.VersionsBucket, Description: "flowd: plugin versions, active versions, node reports", History: 1, Replicas: replicas}
	kv, err := js.CreateKeyValue(cctx, kcfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = js.KeyValue(cctx, kcfg.Bucket) // the first creator's settings hold
	}
	if err != nil {
		return fmt.Errorf("cluster plugins: bucket %q: %w", kcfg.Bucket, err)
	}
	ocfg := jetstream.ObjectStoreConfig{Bucket: s.opts.ModulesBucket, Description: "flowd: plugin modules", Replicas: replicas}
	obj, err := js.CreateObjectStore(cctx, ocfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		obj, err = js.ObjectStore(cctx, ocfg.Bucket)
	}
	if err != nil {
		return fmt.Errorf("cluster plugins: object store %q: %w", ocfg.Bucket, err)
	}
	w, err := kv.WatchAll(s.ctx)
	if err != nil {
		return fmt.Errorf("cluster plugins: watch %q: %w", kcfg.Bucket, err)
	}
	s.mu.Lock()
	s.kv, s.obj = kv, obj
	s.mu.Unlock()
	s.wg.Add(1)
	go s.watch(w)
	return nil
}

// watch is the one goroutine that follows the bucket: it keeps the copy, fetches versions,
// makes the registry follow activations and writes this node's reports.
func (s *PluginStore) watch(w jetstream.KeyWatcher) {
	defer s.wg.Done()
	defer func() { _ = w.Stop() }()
	loaded := false
	for {
		select {
		case <-s.ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				if !loaded {
					loaded = true
					s.catchUp(s.ctx)
					close(s.ready)
				}
				continue
			}
			s.apply(s.ctx, e, loaded)
		}
	}
}

// apply takes one change of the bucket into the copy and, once loaded (live), acts on it.
func (s *PluginStore) apply(ctx context.Context, e jetstream.KeyValueEntry, live bool) {
	kind, name, rest, err := splitPluginKey(e.Key())
	if err != nil {
		s.log.Warn("cluster plugins: ignoring a key", "err", err)
		return
	}
	put := e.Operation() == jetstream.KeyValuePut
	switch kind {
	case "version":
		s.applyVersion(ctx, name, rest, put, e.Value(), live)
	case "active":
		if !put {
			s.mu.Lock()
			delete(s.active, name)
			s.mu.Unlock()
			return
		}
		var a PluginActive
		if err := json.Unmarshal(e.Value(), &a); err != nil || a.Version == "" {
			s.log.Warn("cluster plugins: ignoring a malformed active entry", "key", e.Key(), "err", err)
			return
		}
		s.mu.Lock()
		s.active[name] = a
		s.mu.Unlock()
		if live {
			s.follow(ctx, name, a.Version, a.Boot != s.boot)
		}
	case "node":
		var r PluginReport
		if put && json.Unmarshal(e.Value(), &r) != nil {
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		switch {
		case !put:
			delete(s.reports[name], rest)
		case s.reports[name] == nil:
			s.reports[name] = map[string]PluginReport{rest: r}
		default:
			s.reports[name][rest] = r
		}
	}
}

func (s *PluginStore) applyVersion(ctx context.Context, name, version string, put bool, data []byte, live bool) {
	id := name + "@" + version
	if !put {
		s.mu.Lock()
		delete(s.versions, id)
		s.mu.Unlock()
		if live {
			if err := s.cache.Delete(ctx, name, version); err != nil {
				s.log.Error("cluster plugins: the local copy of a version removed in the cluster", "plugin", name, "version", version, "err", err)
			}
		}
		return
	}
	rec, err := decodeVersion(data)
	if err != nil || rec.Manifest.ID() != id {
		s.log.Warn("cluster plugins: ignoring a malformed version entry", "plugin", name, "version", version, "err", err)
		return
	}
	s.mu.Lock()
	s.versions[id] = rec
	s.mu.Unlock()
	if live {
		s.ensureCached(ctx, rec)
	}
}

// ensureCached fetches a version the local copy lacks (or holds with another module: the
// cluster's wins); a module that cannot be fetched or fails its checksum is reported.
func (s *PluginStore) ensureCached(ctx context.Context, rec PluginVersion) {
	m := rec.Manifest
	if have, _, err := s.cache.Get(ctx, m.Name, m.Version); err == nil && have.SHA256 == m.SHA256 {
		return
	} else if err == nil {
		_ = s.cache.Delete(ctx, m.Name, m.Version)
	}
	if _, err := s.fetchRetrying(ctx, rec); err != nil {
		s.refused(ctx, m.Name, m.Version, string(m.Kind), err)
	}
}

// fetchRetrying fetches rec, trying again for up to SyncTimeout while JetStream does not
// answer yet: a node whose NATS server has just joined the cluster's routes sees the
// buckets before the streams behind them answer it ("no responders"), and such a version
// is not refused, only late. A module that is wrong (size, checksum) is refused at once.
func (s *PluginStore) fetchRetrying(ctx context.Context, rec PluginVersion) ([]byte, error) {
	deadline := time.Now().Add(s.opts.SyncTimeout)
	wait := 50 * time.Millisecond
	for {
		wasm, err := s.fetch(ctx, rec)
		if err == nil || !notAnsweringYet(err) || time.Now().Add(wait).After(deadline) {
			return wasm, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// notAnsweringYet tells a JetStream that has not answered (no responders, a timeout) from
// one that answered no.
func notAnsweringYet(err error) bool {
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoStreamResponse)
}

// follow makes the registry follow the cluster's activation of name@version (again: load
// it afresh even if it is active, as an activation elsewhere asks) and reports the outcome.
// It reports whether the registry swapped the version in.
func (s *PluginStore) follow(ctx context.Context, name, version string, again bool) bool {
	swapped, err := s.reg.Follow(ctx, name, version, again)
	if err != nil {
		s.refused(ctx, name, version, "", err)
		return false
	}
	s.recordLocal(ctx, name, version)
	if !swapped {
		return false // this node's own activation: SetActive reported it
	}
	kind := ""
	if m := s.reg.ActiveManifest(name); m != nil {
		kind = string(m.Kind)
	}
	s.log.Info("cluster plugins: activated the cluster's version", "plugin", name, "version", version)
	s.report(ctx, name, PluginReport{Active: version})
	s.event(PluginEvent{Type: PluginActivated, Name: name, Version: version, Kind: kind})
	return true
}

// recordLocal records version as name's active one in the local copy, which the registry
// loads at the node's next start, before JetStream answers.
func (s *PluginStore) recordLocal(ctx context.Context, name, version string) {
	local, err := s.cache.Active(ctx)
	if err == nil && local[name] == version {
		return
	}
	if err == nil {
		err = s.cache.SetActive(ctx, name, version)
	}
	if err != nil {
		s.log.Error("cluster plugins: record the active version in the local copy", "plugin", name, "version", version, "err", err)
	}
}

// refused logs, reports and tells of a version this node could not take.
func (s *PluginStore) refused(ctx context.Context, name, version, kind string, err error) {
	s.log.Error("cluster plugins: refused a version of the cluster", "plugin", name, "version", version, "err", err)
	s.report(ctx, name, PluginReport{Active: s.reg.ActiveVersion(name), Failed: version, Error: err.Error()})
	s.event(PluginEvent{Type: PluginFailed, Name: name, Version: version, Kind: kind, Reason: err.Error()})
}

func (s *PluginStore) event(e PluginEvent) {
	if s.opts.OnEvent != nil {
		s.opts.OnEvent(e)
	}
}

// catchUp runs once the bucket is loaded. The local copy's versions the cluster lacks are
// published (a node never drops a plugin because it was away) and so is its active version
// of a plugin the cluster has none for; then every version of the cluster is fetched and
// every active version of the cluster swapped in, the cluster's copy winning.
func (s *PluginStore) catchUp(ctx context.Context) {
	kv, obj, _ := s.handles()
	local, err := s.cache.List(ctx)
	if err != nil {
		s.log.Error("cluster plugins: the local copy", "err", err)
	}
	for _, m := range local {
		s.mu.RLock()
		_, known := s.versions[m.ID()]
		s.mu.RUnlock()
		if known {
			continue
		}
		lm, wasm, err := s.cache.Get(ctx, m.Name, m.Version)
		if err == nil {
			err = s.publishVersion(ctx, kv, obj, lm, wasm)
		}
		if err != nil {
			s.log.Error("cluster plugins: a local version not published", "plugin", m.Name, "version", m.Version, "err", err)
		}
	}
	s.publishLocalActive(ctx, kv)
	s.mu.RLock()
	versions := make([]PluginVersion, 0, len(s.versions))
	for _, v := range s.versions {
		versions = append(versions, v)
	}
	active := make(map[string]string, len(s.active))
	for name, a := range s.active {
		active[name] = a.Version
	}
	s.mu.RUnlock()
	for _, v := range versions {
		s.ensureCached(ctx, v)
	}
	for name, version := range active {
		if !s.follow(ctx, name, version, false) && s.reg.ActiveVersion(name) == version {
			s.report(ctx, name, PluginReport{Active: version})
		}
	}
	s.mu.Lock()
	s.synced = true
	s.mu.Unlock()
}

// publishLocalActive writes the local copy's active version of each plugin the cluster has
// no active version of (with Create: an activation elsewhere meanwhile wins).
func (s *PluginStore) publishLocalActive(ctx context.Context, kv jetstream.KeyValue) {
	local, err := s.cache.Active(ctx)
	if err != nil {
		s.log.Error("cluster plugins: the local copy's active versions", "err", err)
		return
	}
	for name, version := range local {
		s.mu.RLock()
		_, known := s.active[name]
		_, deployed := s.versions[name+"@"+version]
		s.mu.RUnlock()
		if known || !deployed {
			continue
		}
		a := PluginActive{Version: version, Node: s.opts.Node, Boot: s.boot, Time: time.Now().UTC()}
		data, _ := json.Marshal(a)
		cctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
		_, err := kv.Create(cctx, activeKey(name), data)
		cancel()
		if err != nil {
			s.log.Warn("cluster plugins: the local active version not published", "plugin", name, "version", version, "err", err)
			continue
		}
		s.mu.Lock()
		s.active[name] = a
		s.mu.Unlock()
	}
}

// splitPluginKey takes a key of the versions bucket apart: its kind (version, active,
// node), the plugin's name, and the version or node ("" for active).
func splitPluginKey(key string) (kind, name, rest string, err error) {
	parts := strings.Split(key, ".")
	want := map[string]int{"version": 3, "active": 2, "node": 3}[parts[0]]
	if want == 0 || len(parts) != want {
		return "", "", "", fmt.Errorf("cluster plugins: key %q is not flowd's", key)
	}
	if name, err = decodeKey(parts[1]); err != nil {
		return "", "", "", err
	}
	if want == 3 {
		if rest, err = decodeKey(parts[2]); err != nil {
			return "", "", "", err
		}
	}
	return parts[0], name, rest, nil
}

// Close stops following the cluster. It neither closes the registry nor the local copy.
func (s *PluginStore) Close(context.Context) error {
	s.cancel()
	s.wg.Wait()
	return nil
}
