package control

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/runtime"
)

// Plugin event names, published by Publisher.Plugin on flowd.evt.<cluster>.plugin.<event>
// with the plugin's name as ce-subject.
const (
	// EventPluginDeployed: a plugin version was stored (plugin.deploy, or a file in the
	// daemon's plugin directory). Payload: plugin, pluginVersion, kind.
	EventPluginDeployed = "plugin.deployed"
	// EventPluginActivated: a version became the plugin's active one. Payload: plugin,
	// pluginVersion, kind.
	EventPluginActivated = "plugin.activated"
	// EventPluginFailed: a fault stopped the plugin's active version (its policy failed it
	// open or closed), published once per stop however many calls faulted at once; it stays
	// stopped until a version is activated. Payload: plugin, pluginVersion, reason.
	EventPluginFailed = "plugin.failed"
	// EventPluginRemoved: a version was deleted. Payload: plugin, pluginVersion.
	EventPluginRemoved = "plugin.removed"
)

// PluginEvent is a change of the plugin registry, for ServiceConfig.PluginEvents and
// Publisher.Plugin.
type PluginEvent struct {
	Type    string // one of the EventPlugin names
	Name    string
	Version string
	Kind    string // "filter", "allocator" or "transform"; empty when unknown
	Reason  string // what failed, for plugin.failed
}

// PluginView is one deployed version in plugin.list.
type PluginView struct {
	Manifest *plugins.Manifest `json:"manifest"`
	// Active is true when the version is active on the answering node.
	Active bool `json:"active"`
	// Nodes, in a cluster, is each node's report on this version (sorted by node): the
	// nodes it is active on, and those that refused it. Absent on a node alone.
	Nodes []PluginNode `json:"nodes,omitempty"`
	// Stats are the answering node's counters of the active version (plugins.Registry.Stats;
	// they start from zero when another version is activated). Absent on other versions.
	Stats *PluginCallStats `json:"stats,omitempty"`
}

// PluginCallStats are one active plugin version's call counters on the answering node.
type PluginCallStats struct {
	Calls uint64 `json:"calls"`
	// Faults counts faulted calls by kind (trap, timeout, memory, bad_output, guest_error);
	// every kind is present.
	Faults      map[string]uint64 `json:"faults"`
	FaultsTotal uint64            `json:"faults_total"`
	Reloads     uint64            `json:"reloads"`
	// MeanCallMicros is the mean call latency in microseconds (0 before the first call).
	MeanCallMicros float64 `json:"mean_call_us"`
	Instances      int     `json:"instances"`
	State          string  `json:"state"`
}

// pluginCallStats converts the registry's counters of one plugin version.
func pluginCallStats(st runtime.Stats) *PluginCallStats {
	out := &PluginCallStats{Calls: st.Calls, Faults: map[string]uint64{}, FaultsTotal: st.FaultsTotal(),
		Reloads: st.Reloads, Instances: st.Instances, State: st.State.String()}
	for k := range runtime.NumFaultKinds {
		out.Faults[k.String()] = st.Faults[k]
	}
	if st.Calls > 0 {
		out.MeanCallMicros = float64(st.CallTime.Microseconds()) / float64(st.Calls)
	}
	return out
}

// PluginNode is one node's report on a plugin version.
type PluginNode struct {
	Node   string `json:"node"`
	Active bool   `json:"active"`
	// Error is why the node refused the version (its module failed the manifest's sha256,
	// could not be fetched, or failed to load); the node keeps its previous version active.
	Error string    `json:"error,omitempty"`
	Time  time.Time `json:"time"`
}

// PluginReport is one node's report on a plugin, as a cluster keeps it: the version active
// on the node, and the version it last refused, with why.
type PluginReport struct {
	Node           string
	Active, Failed string
	Error          string
	Time           time.Time
}

// PluginReports is an optional interface of ServiceConfig.Membership: in a cluster whose
// nodes share their plugins, every node's report on a plugin, which the plugin commands
// show per version (PluginView.Nodes). The daemon implements it over the cluster's plugin
// store.
type PluginReports interface {
	PluginReports(name string) []PluginReport
}

// withNodes adds the nodes' reports on v's version to v, when the node is in a cluster.
func (s *Service) withNodes(v PluginView) PluginView {
	pr, ok := s.cfg.Membership.(PluginReports)
	if !ok || v.Manifest == nil {
		return v
	}
	for _, r := range pr.PluginReports(v.Manifest.Name) {
		active, failed := r.Active == v.Manifest.Version, r.Failed == v.Manifest.Version
		if !active && !failed {
			continue
		}
		n := PluginNode{Node: r.Node, Active: active, Time: r.Time}
		if failed {
			n.Error = r.Error
		}
		v.Nodes = append(v.Nodes, n)
	}
	return v
}

// PluginBucket is the JetStream object store bucket plugin.deploy reads a module from when
// the request names an object instead of carrying the module.
const PluginBucket = "FLOWD_PLUGINS"

// MaxPluginObject bounds a module read from PluginBucket.
const MaxPluginObject = 256 << 20

// PluginDeployRequest is the request of plugin.deploy: the manifest and either the module
// itself or the name of an object in the bucket FLOWD_PLUGINS holding it. A module in the
// request is bounded by the NATS server's max_payload (1 MiB by default: a module of about
// 750 KB once base64-encoded); larger ones go through the bucket.
type PluginDeployRequest struct {
	// Manifest is the version's manifest (plugins.Manifest), as a JSON object.
	Manifest json.RawMessage `json:"manifest"`
	// Module is the WebAssembly module, standard base64.
	Module string `json:"module,omitempty"`
	// Object names the object of PluginBucket holding the module.
	Object string `json:"object,omitempty"`
	// Activate makes the version active once it is deployed.
	Activate bool `json:"activate,omitempty"`
}

// PluginVersionRequest is the request of plugin.activate and plugin.remove.
type PluginVersionRequest struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// PluginReply is the reply of plugin.deploy, plugin.activate and plugin.remove.
type PluginReply struct {
	Origin
	Plugin PluginView `json:"plugin"`
}

// PluginListRequest is the request of plugin.list; Name, when set, lists one plugin.
type PluginListRequest struct {
	Name string `json:"name,omitempty"`
}

// PluginListReply is the reply of plugin.list, sorted by name and version.
type PluginListReply struct {
	Origin
	Plugins []PluginView `json:"plugins"`
}

// pluginEvent tells ServiceConfig.PluginEvents, if set.
func (s *Service) pluginEvent(e PluginEvent) {
	if s.cfg.PluginEvents != nil {
		s.cfg.PluginEvents(e)
	}
}

func (s *Service) pluginDeploy(ctx context.Context, data []byte) (any, error) {
	var req PluginDeployRequest
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	if len(req.Manifest) == 0 || string(req.Manifest) == "null" {
		return nil, badField("manifest", "required")
	}
	m, err := plugins.ParseManifest(req.Manifest)
	if err != nil {
		return nil, manifestError(err)
	}
	wasm, field, err := s.pluginModule(ctx, &req)
	if err != nil {
		return nil, err
	}
	if err := s.cfg.Plugins.Deploy(ctx, m, wasm); err != nil {
		return nil, pluginError(err, field)
	}
	s.pluginEvent(PluginEvent{Type: EventPluginDeployed, Name: m.Name, Version: m.Version, Kind: string(m.Kind)})
	if req.Activate {
		if err := s.cfg.Plugins.Activate(ctx, m.Name, m.Version); err != nil {
			return nil, pluginError(err, "module")
		}
		s.pluginEvent(PluginEvent{Type: EventPluginActivated, Name: m.Name, Version: m.Version, Kind: string(m.Kind)})
	}
	return PluginReply{Origin: s.origin(), Plugin: s.withNodes(PluginView{Manifest: m, Active: s.cfg.Plugins.ActiveVersion(m.Name) == m.Version})}, nil
}

// pluginModule returns the module of a deploy request and the field it came from.
func (s *Service) pluginModule(ctx context.Context, req *PluginDeployRequest) ([]byte, string, error) {
	switch {
	case req.Module != "" && req.Object != "":
		return nil, "", badField("object", "give module or object, not both")
	case req.Module != "":
		wasm, err := base64.StdEncoding.DecodeString(req.Module)
		if err != nil {
			return nil, "", badField("module", "not standard base64: %s", err)
		}
		return wasm, "module", nil
	case req.Object == "":
		return nil, "", badField("module", "required (the module, base64; or object, naming it in the bucket %s)", PluginBucket)
	}
	js, err := jetstream.New(s.nc)
	if err != nil {
		return nil, "", fmt.Errorf("plugin object %s: %w", req.Object, err)
	}
	bucket, err := js.ObjectStore(ctx, PluginBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, "", badField("object", "the bucket %s does not exist", PluginBucket)
	}
	if err != nil {
		return nil, "", fmt.Errorf("plugin object %s: bucket %s: %w", req.Object, PluginBucket, err)
	}
	info, err := bucket.GetInfo(ctx, req.Object)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, "", badField("object", "no object %q in the bucket %s", req.Object, PluginBucket)
	}
	if err != nil {
		return nil, "", fmt.Errorf("plugin object %s: %w", req.Object, err)
	}
	if info.Size > MaxPluginObject {
		return nil, "", badField("object", "%q is %d bytes, over the limit of %d", req.Object, info.Size, MaxPluginObject)
	}
	wasm, err := bucket.GetBytes(ctx, req.Object)
	if err != nil {
		return nil, "", fmt.Errorf("plugin object %s: %w", req.Object, err)
	}
	return wasm, "object", nil
}

func (s *Service) pluginActivate(ctx context.Context, data []byte) (any, error) {
	req, err := decodeVersion(data)
	if err != nil {
		return nil, err
	}
	if err := s.cfg.Plugins.Activate(ctx, req.Name, req.Version); err != nil {
		return nil, pluginError(err, "version")
	}
	m := s.cfg.Plugins.ActiveManifest(req.Name)
	kind := ""
	if m != nil {
		kind = string(m.Kind)
	}
	s.pluginEvent(PluginEvent{Type: EventPluginActivated, Name: req.Name, Version: req.Version, Kind: kind})
	return PluginReply{Origin: s.origin(), Plugin: s.withNodes(PluginView{Manifest: m, Active: true})}, nil
}

func (s *Service) pluginRemove(ctx context.Context, data []byte) (any, error) {
	req, err := decodeVersion(data)
	if err != nil {
		return nil, err
	}
	m, err := s.cfg.Plugins.Get(ctx, req.Name, req.Version)
	if err != nil {
		return nil, pluginError(err, "version")
	}
	if err := s.cfg.Plugins.Remove(ctx, req.Name, req.Version); err != nil {
		return nil, pluginError(err, "version")
	}
	s.pluginEvent(PluginEvent{Type: EventPluginRemoved, Name: req.Name, Version: req.Version, Kind: string(m.Kind)})
	return PluginReply{Origin: s.origin(), Plugin: PluginView{Manifest: m}}, nil
}

func (s *Service) pluginList(ctx context.Context, data []byte) (any, error) {
	var req PluginListRequest
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	all, err := s.cfg.Plugins.List(ctx)
	if err != nil {
		return nil, err
	}
	stats := map[string]runtime.Stats{}
	for _, st := range s.cfg.Plugins.Stats() {
		stats[st.Name+"@"+st.Version] = st.Stats
	}
	out := PluginListReply{Origin: s.origin(), Plugins: []PluginView{}}
	for _, in := range all {
		if req.Name == "" || in.Manifest.Name == req.Name {
			v := PluginView{Manifest: in.Manifest, Active: in.Active}
			if st, ok := stats[in.Manifest.Name+"@"+in.Manifest.Version]; ok && in.Active {
				v.Stats = pluginCallStats(st)
			}
			out.Plugins = append(out.Plugins, s.withNodes(v))
		}
	}
	return out, nil
}

func decodeVersion(data []byte) (PluginVersionRequest, error) {
	var req PluginVersionRequest
	if err := decode(data, &req); err != nil {
		return req, err
	}
	if req.Name == "" {
		return req, badField("name", "required")
	}
	if req.Version == "" {
		return req, badField("version", "required")
	}
	return req, nil
}

// manifestError is a 400 naming the manifest field at fault (manifest.<field>), or the
// manifest itself when the error names no field (not an object, data after it).
func manifestError(err error) error {
	if fr := fieldReply(err, "manifest"); fr != nil {
		return fr
	}
	return badField("manifest", "%s", err)
}

// pluginError maps a registry error to a reply; field names the request field that a bad
// module or version concerns.
func pluginError(err error, field string) error {
	var guest *plugins.GuestError
	switch {
	case errors.Is(err, plugins.ErrNotFound):
		return &cmdError{code: CodeNotFound, msg: err.Error()}
	case errors.Is(err, plugins.ErrExists), errors.Is(err, plugins.ErrActive):
		return &cmdError{code: CodeConflict, msg: err.Error()}
	case errors.Is(err, plugins.ErrManifest):
		return manifestError(err)
	case errors.Is(err, plugins.ErrKind):
		return badField("manifest.kind", "%s", err)
	case errors.As(err, &guest) && int32(guest.Code) == plugins.CodeParams:
		return badField("manifest.parameters", "%s", err)
	case errors.Is(err, runtime.ErrChecksum), errors.Is(err, plugins.ErrGuest):
		return badField(field, "%s", err)
	case errors.Is(err, runtime.ErrInvalidModule), errors.Is(err, runtime.ErrImport), errors.Is(err, runtime.ErrExport),
		errors.Is(err, runtime.ErrABIVersion), errors.Is(err, runtime.ErrSelfTest):
		return badField(field, "%s", err)
	case errors.Is(err, runtime.ErrMemory):
		// The module needs more memory than the manifest's limits.memory_pages allows.
		return badField(field, "%s", err)
	}
	return &cmdError{code: CodeInternal, msg: err.Error()}
}
