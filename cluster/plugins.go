package cluster

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/runtime"
)

// ErrPluginsNotJoined is wrapped by a plugin change (deploy, activate, remove) made while the
// node has not reached the cluster's plugin buckets: a change is the cluster's, so it waits
// for JetStream rather than diverging on one node.
var ErrPluginsNotJoined = errors.New("the cluster's plugin store is not reachable yet (JetStream unreachable or still forming): try again")

// PluginOptions configure a PluginStore. The zero value of every field but Node means its
// documented default.
type PluginOptions struct {
	// Node names this node in the per-node reports (PluginReport). Required: the broker's
	// name in the daemon.
	Node string

	// ModulesBucket is the object store of the modules, one object per version (named
	// <name>@<version>/<sha256>). Default "flowd_plugin_modules": not "flowd_plugins", which
	// differs from plugin.deploy's upload bucket FLOWD_PLUGINS only by case, and the two
	// would share a directory on a file system that ignores case.
	ModulesBucket string

	// VersionsBucket is the KV bucket of the deployed versions, the active version of each
	// plugin and each node's report. Default "flowd_plugin_versions".
	VersionsBucket string

	// Replicas is the buckets' replica count when this node creates them. Default 0:
	// min(3, the servers of the NATS cluster the connection knows of).
	Replicas int

	// SyncTimeout bounds how long Start waits to reach JetStream and catch up (the buckets
	// read, every version fetched, the active versions compiled and swapped in); past it
	// the catch-up goes on in the background. Default 15 s.
	SyncTimeout time.Duration

	// RetryInterval is how often a node that could not reach JetStream at Start tries
	// again. Default 2 s.
	RetryInterval time.Duration

	// RequestTimeout bounds each JetStream call but a module's transfer. Default 5 s.
	RequestTimeout time.Duration

	// Logger receives the store's logs. Default slog.Default().
	Logger *slog.Logger

	// OnEvent is told of what this node did following the cluster (a version activated
	// here, or refused), on the store's watch goroutine: it must return quickly.
	OnEvent func(PluginEvent)
}

const (
	defaultModulesBucket  = "flowd_plugin_modules"
	defaultVersionsBucket = "flowd_plugin_versions"
	defaultSyncTimeout    = 15 * time.Second
	// maxModule bounds a module fetched from the modules bucket, as plugin.deploy bounds
	// one it reads from its upload bucket.
	maxModule = 256 << 20
)

func (o PluginOptions) withDefaults() (PluginOptions, error) {
	if o.Node == "" {
		return o, errors.New("cluster plugins: PluginOptions.Node is required")
	}
	o.ModulesBucket = cmp.Or(o.ModulesBucket, defaultModulesBucket)
	o.VersionsBucket = cmp.Or(o.VersionsBucket, defaultVersionsBucket)
	o.SyncTimeout = cmp.Or(o.SyncTimeout, defaultSyncTimeout)
	o.RetryInterval = cmp.Or(o.RetryInterval, defaultRetryInterval)
	o.RequestTimeout = cmp.Or(o.RequestTimeout, defaultRequestTimeout)
	if o.Replicas < 0 || o.Replicas > 5 {
		return o, fmt.Errorf("cluster plugins: Replicas %d is outside 0..5", o.Replicas)
	}
	if o.SyncTimeout < 0 || o.RetryInterval < 0 || o.RequestTimeout < 0 {
		return o, errors.New("cluster plugins: SyncTimeout, RetryInterval and RequestTimeout must not be negative")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

// PluginEventType says what a PluginEvent reports.
type PluginEventType int

// Plugin event types.
const (
	// PluginActivated: this node swapped in the version the cluster made active.
	PluginActivated PluginEventType = iota + 1
	// PluginFailed: this node refused a version of the cluster (its module failed the
	// manifest's sha256, could not be fetched, or failed to load); Reason says why.
	PluginFailed
)

// String is the event's name, as the control plane publishes it.
func (t PluginEventType) String() string {
	switch t {
	case PluginActivated:
		return "plugin.activated"
	case PluginFailed:
		return "plugin.failed"
	}
	return fmt.Sprintf("plugin.event.%d", int(t))
}

// PluginEvent is one thing this node did following the cluster's plugins.
type PluginEvent struct {
	Type    PluginEventType
	Name    string
	Version string
	Kind    string
	Reason  string
}

// PluginVersion is a deployed version's entry in the versions bucket.
type PluginVersion struct {
	Manifest *plugins.Manifest
	// Object names the module in the modules bucket.
	Object   string
	Deployer string // the node it was deployed on
	Deployed time.Time
}

// pluginVersionEntry is PluginVersion on the wire: the manifest as its JSON object, read
// back with plugins.ParseManifest.
type pluginVersionEntry struct {
	Manifest json.RawMessage `json:"manifest"`
	Object   string          `json:"object"`
	Deployer string          `json:"deployer"`
	Deployed time.Time       `json:"deployed"`
}

// PluginActive is a plugin's entry of its active version: the last activation the bucket
// took, on whichever node.
type PluginActive struct {
	Version string    `json:"version"`
	Node    string    `json:"node"`
	Boot    string    `json:"boot"` // the process that wrote it: its own echo is not loaded again
	Time    time.Time `json:"time"`
}

// PluginReport is one node's report on one plugin: the version active there, and the
// version it last refused (or failed to activate) with why.
type PluginReport struct {
	Node   string    `json:"node"`
	Active string    `json:"active,omitempty"`
	Failed string    `json:"failed,omitempty"`
	Error  string    `json:"error,omitempty"`
	Time   time.Time `json:"time"`
}

// PluginStore is a plugins.Store shared by the nodes of a cluster: the modules in a
// JetStream object store, the versions, the active version of each plugin and each node's
// report in a KV bucket. Each node keeps a local copy (cache, a plugins.DirStore), which
// the registry loads at start before JetStream answers, and which a watch keeps in step:
// a version deployed anywhere is fetched, checked against its manifest's sha256 and
// cached; an activation anywhere is swapped in here (Registry.Follow). The read path
// never waits on NATS: it runs the modules the registry loaded. docs/cluster.md has the
// rules.
type PluginStore struct {
	opts  PluginOptions
	log   *slog.Logger
	cache plugins.Store
	boot  string // this process, in the active entries it writes

	mu sync.RWMutex
	// kv and obj are set once, by the goroutine that reaches JetStream; nil until then.
	kv       jetstream.KeyValue
	obj      jetstream.ObjectStore
	versions map[string]PluginVersion           // by name@version: the bucket's copy
	active   map[string]PluginActive            // by plugin
	reports  map[string]map[string]PluginReport // by plugin, then node
	synced   bool                               // the catch-up is done: List answers from the copy

	reg    *plugins.Registry
	nc     *nats.Conn
	ready  chan struct{} // closed once the catch-up is done
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

var _ plugins.Store = (*PluginStore)(nil)

// NewPluginStore returns a store over the local copy cache that answers from it alone
// until Start.
func NewPluginStore(cache plugins.Store, o PluginOptions) (*PluginStore, error) {
	opts, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &PluginStore{
		opts: opts, log: opts.Logger, cache: cache, boot: nuid.Next(),
		versions: map[string]PluginVersion{}, active: map[string]PluginActive{}, reports: map[string]map[string]PluginReport{},
		ready: make(chan struct{}), ctx: ctx, cancel: cancel,
	}, nil
}

// Keys of the versions bucket; each name is one token (encodeKey escapes '.').
func versionKey(name, version string) string {
	return "version." + encodeKey(name) + "." + encodeKey(version)
}
func activeKey(name string) string { return "active." + encodeKey(name) }
func reportKey(name, node string) string {
	return "node." + encodeKey(name) + "." + encodeKey(node)
}

// objectName names a version's module; the checksum in it keeps two nodes deploying one
// version with different modules at once from overwriting each other's object.
func objectName(m *plugins.Manifest) string { return m.ID() + "/" + m.SHA256 }

// handles returns the buckets, or ErrPluginsNotJoined.
func (s *PluginStore) handles() (jetstream.KeyValue, jetstream.ObjectStore, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.kv == nil {
		return nil, nil, ErrPluginsNotJoined
	}
	return s.kv, s.obj, nil
}

// Put implements plugins.Store: the module into the object store, then the version's
// entry with KV Create, so that of two nodes deploying one version the first wins (the same
// module again is no error), then the local copy.
func (s *PluginStore) Put(ctx context.Context, m *plugins.Manifest, wasm []byte) error {
	kv, obj, err := s.handles()
	if err != nil {
		return fmt.Errorf("store plugin %s: %w", m.ID(), err)
	}
	if err := s.kindOf(m); err != nil {
		return err
	}
	rec, err := s.lookupVersion(ctx, kv, m.Name, m.Version)
	switch {
	case err == nil && rec.Manifest.SHA256 == m.SHA256:
		return s.cachePut(ctx, m, wasm)
	case err == nil:
		return fmt.Errorf("store plugin %s: deployed in the cluster with sha256 %s: %w", m.ID(), rec.Manifest.SHA256, plugins.ErrExists)
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return fmt.Errorf("store plugin %s: %w", m.ID(), err)
	}
	if err := s.publishVersion(ctx, kv, obj, m, wasm); err != nil {
		return err
	}
	return s.cachePut(ctx, m, wasm)
}

// kindOf refuses a version of another kind than the cluster's versions of its plugin.
func (s *PluginStore) kindOf(m *plugins.Manifest) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, v := range s.versions {
		if v.Manifest.Name == m.Name && v.Manifest.Kind != m.Kind {
			return fmt.Errorf("store plugin %s: a %s, but %s is a %s in the cluster: %w", m.ID(), m.Kind, m.Name, v.Manifest.Kind, plugins.ErrKind)
		}
	}
	return nil
}

func (s *PluginStore) cachePut(ctx context.Context, m *plugins.Manifest, wasm []byte) error {
	if err := s.cache.Put(ctx, m, wasm); err != nil {
		return fmt.Errorf("store plugin %s: local copy: %w", m.ID(), err)
	}
	return nil
}

// lookupVersion reads a version's entry from the bucket (not the watched copy, which may
// lag a deploy elsewhere).
func (s *PluginStore) lookupVersion(ctx context.Context, kv jetstream.KeyValue, name, version string) (PluginVersion, error) {
	cctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	e, err := kv.Get(cctx, versionKey(name, version))
	if err != nil {
		return PluginVersion{}, err
	}
	return decodeVersion(e.Value())
}

func decodeVersion(data []byte) (PluginVersion, error) {
	var w pluginVersionEntry
	if err := json.Unmarshal(data, &w); err != nil {
		return PluginVersion{}, fmt.Errorf("plugin version entry: %w", err)
	}
	m, err := plugins.ParseManifest(w.Manifest)
	if err != nil {
		return PluginVersion{}, fmt.Errorf("plugin version entry: %w", err)
	}
	return PluginVersion{Manifest: m, Object: w.Object, Deployer: w.Deployer, Deployed: w.Deployed}, nil
}

// publishVersion writes the module and then the version's entry (Create): a node that
// sees the entry finds the object.
func (s *PluginStore) publishVersion(ctx context.Context, kv jetstream.KeyValue, obj jetstream.ObjectStore, m *plugins.Manifest, wasm []byte) error {
	name := objectName(m)
	if _, err := obj.PutBytes(ctx, name, wasm); err != nil {
		return fmt.Errorf("store plugin %s: module into the bucket %s: %w", m.ID(), s.opts.ModulesBucket, err)
	}
	mb, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("store plugin %s: encode manifest: %w", m.ID(), err)
	}
	rec := PluginVersion{Manifest: m, Object: name, Deployer: s.opts.Node, Deployed: time.Now().UTC()}
	data, err := json.Marshal(pluginVersionEntry{Manifest: mb, Object: rec.Object, Deployer: rec.Deployer, Deployed: rec.Deployed})
	if err != nil {
		return fmt.Errorf("store plugin %s: encode: %w", m.ID(), err)
	}
	cctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	if _, err = kv.Create(cctx, versionKey(m.Name, m.Version), data); errors.Is(err, jetstream.ErrKeyExists) {
		// Deployed at the same moment elsewhere: the first entry holds.
		other, gerr := s.lookupVersion(ctx, kv, m.Name, m.Version)
		if gerr == nil && other.Manifest.SHA256 == m.SHA256 {
			return nil // the same module: the same object
		}
		_ = obj.Delete(cctx, name) // this node's module lost
		return fmt.Errorf("store plugin %s: deployed concurrently in the cluster with another module: %w", m.ID(), plugins.ErrExists)
	}
	if err != nil {
		return fmt.Errorf("store plugin %s: version entry: %w", m.ID(), err)
	}
	s.mu.Lock()
	s.versions[m.ID()] = rec
	s.mu.Unlock()
	return nil
}

// Get implements plugins.Store from the local copy; a version the cluster has that the
// copy does not yet (its watch lags a deploy elsewhere) is fetched first.
func (s *PluginStore) Get(ctx context.Context, name, version string) (*plugins.Manifest, []byte, error) {
	m, wasm, err := s.cache.Get(ctx, name, version)
	if err == nil || !errors.Is(err, plugins.ErrNotFound) {
		return m, wasm, err
	}
	s.mu.RLock()
	rec, ok := s.versions[name+"@"+version]
	s.mu.RUnlock()
	if !ok {
		kv, _, herr := s.handles()
		if herr != nil {
			return nil, nil, err
		}
		if rec, herr = s.lookupVersion(ctx, kv, name, version); herr != nil {
			return nil, nil, err // not in the cluster either: ErrNotFound
		}
	}
	wasm, ferr := s.fetchRetrying(ctx, rec)
	if ferr != nil {
		return nil, nil, ferr
	}
	return rec.Manifest, wasm, nil
}

// fetch reads a version's module from the object store, checks it against the manifest's
// sha256 and stores it in the local copy.
func (s *PluginStore) fetch(ctx context.Context, rec PluginVersion) ([]byte, error) {
	m := rec.Manifest
	_, obj, err := s.handles()
	if err != nil {
		return nil, fmt.Errorf("fetch plugin %s: %w", m.ID(), err)
	}
	info, err := obj.GetInfo(ctx, rec.Object)
	if err != nil {
		return nil, fmt.Errorf("fetch plugin %s: object %s of the bucket %s: %w", m.ID(), rec.Object, s.opts.ModulesBucket, err)
	}
	if info.Size > maxModule {
		return nil, fmt.Errorf("fetch plugin %s: object %s is %d bytes, over the limit of %d: %w", m.ID(), rec.Object, info.Size, maxModule, runtime.ErrInvalidModule)
	}
	wasm, err := obj.GetBytes(ctx, rec.Object)
	if err != nil {
		return nil, fmt.Errorf("fetch plugin %s: object %s of the bucket %s: %w", m.ID(), rec.Object, s.opts.ModulesBucket, err)
	}
	sum := sha256.Sum256(wasm)
	if got := hex.EncodeToString(sum[:]); got != m.SHA256 {
		return nil, fmt.Errorf("fetch plugin %s: the module in the cluster (object %s) has sha256 %s, the manifest says %s: refused: %w",
			m.ID(), rec.Object, got, m.SHA256, runtime.ErrChecksum)
	}
	if err := s.cachePut(ctx, m, wasm); err != nil {
		return nil, err
	}
	return wasm, nil
}

// Delete implements plugins.Store: the version's entry, then its module, then the local
// copy; every node's watch deletes its own copy.
func (s *PluginStore) Delete(ctx context.Context, name, version string) error {
	kv, obj, err := s.handles()
	if err != nil {
		return fmt.Errorf("remove plugin %s@%s: %w", name, version, err)
	}
	rec, err := s.lookupVersion(ctx, kv, name, version)
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("remove plugin %s@%s: %w", name, version, err)
	}
	cctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	if err == nil {
		if err := kv.Delete(cctx, versionKey(name, version)); err != nil {
			return fmt.Errorf("remove plugin %s@%s: version entry: %w", name, version, err)
		}
		if err := obj.Delete(cctx, rec.Object); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			s.log.Warn("cluster plugins: the removed version's module stays in the bucket", "plugin", name, "version", version, "object", rec.Object, "err", err)
		}
	}
	s.mu.Lock()
	delete(s.versions, name+"@"+version)
	s.mu.Unlock()
	return s.cache.Delete(ctx, name, version)
}

// List implements plugins.Store: the cluster's versions once the catch-up is done, the
// local copy's before.
func (s *PluginStore) List(ctx context.Context) ([]*plugins.Manifest, error) {
	s.mu.RLock()
	if !s.synced {
		s.mu.RUnlock()
		return s.cache.List(ctx)
	}
	out := make([]*plugins.Manifest, 0, len(s.versions))
	for _, v := range s.versions {
		out = append(out, v.Manifest)
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b *plugins.Manifest) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.Version, b.Version))
	})
	return out, nil
}

// Active implements plugins.Store: the cluster's active versions once the catch-up is
// done, the local copy's before (what the registry loads at start).
func (s *PluginStore) Active(ctx context.Context) (map[string]string, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if !s.synced {
		return s.cache.Active(ctx)
	}
	out := make(map[string]string, len(s.active))
	for name, a := range s.active {
		out[name] = a.Version
	}
	return out, nil
}

// SetActive implements plugins.Store: the plugin's active entry (the last write wins),
// the local copy, and this node's report. The registry calls it once the version loaded,
// just before it swaps it in.
func (s *PluginStore) SetActive(ctx context.Context, name, version string) error {
	kv, _, err := s.handles()
	if err != nil {
		return fmt.Errorf("activate plugin %s@%s: %w", name, version, err)
	}
	cctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	a := PluginActive{Version: version, Node: s.opts.Node, Boot: s.boot, Time: time.Now().UTC()}
	if version == "" {
		err = kv.Delete(cctx, activeKey(name))
	} else {
		data, _ := json.Marshal(a)
		_, err = kv.Put(cctx, activeKey(name), data)
	}
	if err != nil {
		return fmt.Errorf("activate plugin %s@%s: active entry: %w", name, version, err)
	}
	s.mu.Lock()
	if version == "" {
		delete(s.active, name)
	} else {
		s.active[name] = a
	}
	s.mu.Unlock()
	if err := s.cache.SetActive(ctx, name, version); err != nil {
		return fmt.Errorf("activate plugin %s@%s: local copy: %w", name, version, err)
	}
	s.report(ctx, name, PluginReport{Active: version})
	return nil
}

// Reports returns every node's report on the plugin, sorted by node.
func (s *PluginStore) Reports(name string) []PluginReport {
	s.mu.RLock()
	out := make([]PluginReport, 0, len(s.reports[name]))
	for _, r := range s.reports[name] {
		out = append(out, r)
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b PluginReport) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// ActiveInCluster returns the plugin's active entry in the cluster's copy.
func (s *PluginStore) ActiveInCluster(name string) (PluginActive, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	a, ok := s.active[name]
	return a, ok
}

// report writes this node's report on a plugin.
func (s *PluginStore) report(ctx context.Context, name string, r PluginReport) {
	r.Node, r.Time = s.opts.Node, time.Now().UTC()
	s.mu.Lock()
	if s.reports[name] == nil {
		s.reports[name] = map[string]PluginReport{}
	}
	s.reports[name][r.Node] = r
	kv := s.kv
	s.mu.Unlock()
	if kv == nil {
		return
	}
	data, _ := json.Marshal(r)
	cctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	if _, err := kv.Put(cctx, reportKey(name, r.Node), data); err != nil {
		s.log.Warn("cluster plugins: this node's report not written", "plugin", name, "err", err)
	}
}
