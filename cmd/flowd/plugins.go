package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowd-io/flowd/broker/filter"
	"github.com/flowd-io/flowd/cluster"
	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/metrics"
	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/plugins/wasmfilter"
	"github.com/flowd-io/flowd/runtime"
)

// pluginHost is the daemon's Wasm runtime and plugin registry, and the read path's filter
// registry with WASM plugged in. It lives longer than the broker: created before it, closed
// after it.
type pluginHost struct {
	rt      *runtime.Runtime
	reg     *plugins.Registry
	filters *filter.Registry
	log     *slog.Logger
	// cs is the cluster's plugin store the registry runs on, in a cluster (nats.cluster.listen
	// or nats.urls); nil on a node alone, whose registry runs on <data-dir>/plugins.
	cs *cluster.PluginStore

	mu   sync.Mutex
	sink func(control.PluginEvent) // the event publisher, once NATS is up; nil until then
}

// openPlugins opens <data-dir>/plugins with a runtime caching compiled code in
// <data-dir>/wasm-cache, and builds the filter registry: TAG, SQL92 and WASM. onCall, when
// not nil, is told of every call into a plugin (metrics). With cs set (in a cluster) the
// registry runs on the cluster's plugin store, <data-dir>/plugins its local copy, which it
// loads now: the node serves its plugins before JetStream answers, and follows the cluster
// once joinPlugins has run.
func openPlugins(ctx context.Context, dataDir string, cs *cluster.PluginOptions, onCall func(string, time.Duration, error), log *slog.Logger) (*pluginHost, error) {
	rt, err := runtime.New(ctx, runtime.Options{CacheDir: filepath.Join(dataDir, "wasm-cache"), Logger: log.With("component", "wasm"), OnCall: onCall})
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	dir, err := plugins.NewDirStore(filepath.Join(dataDir, "plugins"))
	if err != nil {
		return nil, errors.Join(fmt.Errorf("serve: %w", err), rt.Close(ctx))
	}
	h := &pluginHost{rt: rt, log: log}
	var st plugins.Store = dir
	if cs != nil {
		o := *cs
		o.Logger, o.OnEvent = log.With("component", "plugins"), h.clusterEvent
		h.cs, err = cluster.NewPluginStore(dir, o)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("serve: %w", err), rt.Close(ctx))
		}
		st = h.cs
	}
	if h.reg, err = plugins.NewRegistry(ctx, rt, st, log.With("component", "plugins")); err != nil {
		return nil, errors.Join(fmt.Errorf("serve: %w", err), rt.Close(ctx))
	}
	reg := h.reg
	h.filters = filter.NewRegistry(filter.DefaultCacheSize)
	h.filters.Register(filter.TypeSQL92, filter.SQL92(filter.ParseSQL92))
	h.filters.Register(filter.TypeWasm, wasmfilter.Compiler(reg, wasmfilter.Options{
		Logger: log.With("component", "plugins"),
		OnFault: func(f wasmfilter.Fault) {
			log.Error("wasm filter stopped by its fault policy", "plugin", f.Name, "version", f.Version, "err", f.Err)
			h.emit(control.PluginEvent{Type: control.EventPluginFailed, Name: f.Name, Version: f.Version, Kind: string(plugins.KindFilter), Reason: f.Err.Error()})
		},
	}))
	return h, nil
}

// clusterEvent publishes what this node did following the cluster's plugins (a version
// activated here, or refused) as the node's plugin event.
func (h *pluginHost) clusterEvent(e cluster.PluginEvent) {
	h.emit(control.PluginEvent{Type: e.Type.String(), Name: e.Name, Version: e.Version, Kind: e.Kind, Reason: e.Reason})
}

// joinPlugins makes the registry follow the cluster's plugins through nc and pushes the
// store's Close; it returns once the node caught up (bounded: cluster.PluginOptions
// SyncTimeout), so that the broker, started after it, finds every plugin of the cluster a
// subscription names. Nothing on a node alone.
func (h *pluginHost) joinPlugins(ctx context.Context, nc *nats.Conn, cl *closers) error {
	if h.cs == nil {
		return nil
	}
	cl.push("cluster plugins", h.cs.Close) // first: a start cut short stops its watch too
	if err := h.cs.Start(ctx, nc, h.reg); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// checks is the readiness of the plugins: in a cluster, not ready until the node caught
// up with the cluster's plugins.
//
// It holds back readiness only while the node is a member of the cluster (joined reports
// it) and has not caught up: a node serving alone (JetStream unreachable, or not formed yet)
// serves its local copy, as it serves its own routes, and is ready as a node alone is.
func (h *pluginHost) checks(joined func() bool) []metrics.Check {
	if h.cs == nil {
		return nil
	}
	return []metrics.Check{{Name: "cluster plugins", Fn: func(context.Context) error {
		if joined() && !h.cs.Synced() {
			return fmt.Errorf("catching up with the cluster's plugins: %w", metrics.ErrNotReady)
		}
		return nil
	}}}
}

// setSink routes plugin events to fn (nil: drop them).
func (h *pluginHost) setSink(fn func(control.PluginEvent)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sink = fn
}

func (h *pluginHost) emit(e control.PluginEvent) {
	h.mu.Lock()
	fn := h.sink
	h.mu.Unlock()
	if fn != nil {
		fn(e)
	}
}

// close closes the registry (waiting for calls in flight), then the runtime.
func (h *pluginHost) close(ctx context.Context) error {
	return errors.Join(h.reg.Close(ctx), h.rt.Close(ctx))
}

// watchDir deploys and activates the plugins dropped in dir, polling it every interval
// until ctx is done: a module <name>.wasm next to its manifest <name>.json. A manifest
// without "sha256" gets the module's. A changed pair is deployed again (a new version, from
// the manifest; the same version with another module is refused, since versions are
// immutable). A pair whose version is deployed already is skipped, so a restart does not
// re-activate it over a version activated since. Errors are logged with the file's name and
// retried only once a file changes; they never stop the daemon. Removing the files leaves
// the plugin deployed.
func (h *pluginHost) watchDir(ctx context.Context, dir string, interval time.Duration) {
	seen := map[string]string{} // <name> → the state of its two files last handled
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		h.scanDir(ctx, dir, seen)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// scanDir handles every pair of dir whose files changed since seen.
func (h *pluginHost) scanDir(ctx context.Context, dir string, seen map[string]string) {
	mods, err := filepath.Glob(filepath.Join(dir, "*.wasm"))
	if err != nil {
		h.log.Error("plugin directory", "dir", dir, "err", err)
		return
	}
	for _, mod := range mods {
		base := strings.TrimSuffix(mod, ".wasm")
		man := base + ".json"
		state, ok := fileState(mod, man)
		if !ok || seen[base] == state {
			continue
		}
		seen[base] = state
		if err := h.deployFiles(ctx, mod, man); err != nil {
			h.log.Error("plugin file not deployed", "file", mod, "manifest", man, "err", err)
		}
	}
}

// fileState is the sizes and modification times of both files; ok is false while one is
// missing.
func fileState(paths ...string) (string, bool) {
	var b strings.Builder
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return "", false
		}
		fmt.Fprintf(&b, "%d/%d;", fi.Size(), fi.ModTime().UnixNano())
	}
	return b.String(), true
}

// deployFiles deploys the module at mod with the manifest at man and activates it.
func (h *pluginHost) deployFiles(ctx context.Context, mod, man string) error {
	wasm, err := os.ReadFile(mod)
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(man)
	if err != nil {
		return err
	}
	raw, err = withSHA256(raw, wasm)
	if err != nil {
		return fmt.Errorf("manifest %s: %w", man, err)
	}
	m, err := plugins.ParseManifest(raw)
	if err != nil {
		return fmt.Errorf("manifest %s: %w", man, err)
	}
	// A version deployed already (the files were seen before a restart) is left alone: the
	// operator may have activated another one since, and a restart must not undo that.
	if old, err := h.reg.Get(ctx, m.Name, m.Version); err == nil && old.SHA256 == m.SHA256 {
		return nil
	}
	if err := h.reg.Deploy(ctx, m, wasm); err != nil {
		return err
	}
	h.emit(control.PluginEvent{Type: control.EventPluginDeployed, Name: m.Name, Version: m.Version, Kind: string(m.Kind)})
	if err := h.reg.Activate(ctx, m.Name, m.Version); err != nil {
		return err
	}
	h.emit(control.PluginEvent{Type: control.EventPluginActivated, Name: m.Name, Version: m.Version, Kind: string(m.Kind)})
	return nil
}

// withSHA256 adds the module's checksum to a manifest that has none; a manifest that has
// one is left alone (and checked by Deploy).
func withSHA256(raw, wasm []byte) ([]byte, error) {
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&fields); err != nil {
		return nil, err
	}
	if _, ok := fields["sha256"]; ok {
		return raw, nil
	}
	sum := sha256.Sum256(wasm)
	fields["sha256"], _ = json.Marshal(hex.EncodeToString(sum[:]))
	return json.Marshal(fields)
}
