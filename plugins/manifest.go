package plugins

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/flowd-io/flowd/fields"
	"github.com/flowd-io/flowd/runtime"
)

// Manifest describes one plugin version. It is JSON, decoded strictly: an unknown field is
// an error naming it.
//
//	{
//	  "name": "big-orders", "kind": "filter", "version": "1.2.0", "abi": 1,
//	  "limits": {"memory_pages": 64, "call_timeout": "100ms", "max_instances": 2},
//	  "policy": {"on_fault": "fail_closed", "restart_budget": 3, "restart_window": "1m"},
//	  "parameters": {"threshold": "100"},
//	  "wants_body": true,
//	  "sha256": "…64 hex digits…"
//	}
type Manifest struct {
	// Name identifies the plugin: lower-case letters, digits, '.', '_' and '-', starting
	// with a letter or digit, at most 64 bytes (it names a directory). Required.
	Name string `json:"name"`
	// Kind is "filter", "allocator" or "transform". Required.
	Kind Kind `json:"kind"`
	// Version is a semantic version (2.0.0), e.g. "1.2.0" or "2.0.0-rc.1". Required.
	Version string `json:"version"`
	// ABI is the plugin ABI version; only 1 exists. Required.
	ABI int `json:"abi"`
	// Limits bound the plugin's resources.
	Limits Limits `json:"limits"`
	// Policy is what happens after a fault.
	Policy FaultPolicy `json:"policy"`
	// Parameters are passed to the guest's flowd_init. Keys are non-empty, at most 65 535
	// bytes.
	Parameters map[string]string `json:"parameters,omitempty"`
	// WantsBody asks for message bodies (filters only; transforms always get them). Default
	// false: a filter on tags, keys and properties costs less without the bodies.
	WantsBody bool `json:"wants_body,omitempty"`
	// SHA256 is the module's SHA-256, 64 hex digits. Required: the registry refuses a module
	// that does not match, at deploy and at every load.
	SHA256 string `json:"sha256"`
}

// Limits bound a plugin's resources.
type Limits struct {
	// MemoryPages caps each instance's memory in 64 KiB pages, 1 to 32 768. Default 512
	// (32 MiB). A Go guest needs at least 37.
	MemoryPages uint32 `json:"memory_pages,omitempty"`
	// CallTimeout limits each call, e.g. "100ms": a call still running at the limit is
	// stopped and is a fault, and the policy applies. Every call has a limit: without
	// call_timeout, the kind's default ([DefaultFilterTimeout], [DefaultAllocatorTimeout],
	// [DefaultTransformTimeout]). At most [MaxCallTimeout]. The self-test has a limit of
	// its own, [SelfTestTimeout].
	CallTimeout Duration `json:"call_timeout,omitempty"`
	// MaxInstances bounds the instances, and so the concurrent calls. Default GOMAXPROCS.
	MaxInstances int `json:"max_instances,omitempty"`
}

// FaultPolicy is what happens after a call faults (trap, time-out, memory, error code,
// malformed output).
type FaultPolicy struct {
	// OnFault is "fail_closed" (default: the plugin stops, its work is refused: a filter
	// delivers nothing), "fail_open" (the plugin stops and is bypassed: a filter lets
	// everything through) or "reload" (fresh instances, up to RestartBudget faults per
	// RestartWindow, then fail_closed).
	OnFault string `json:"on_fault,omitempty"`
	// RestartBudget for "reload". Default 3.
	RestartBudget int `json:"restart_budget,omitempty"`
	// RestartWindow for "reload", e.g. "1m". Default one minute.
	RestartWindow Duration `json:"restart_window,omitempty"`
}

// Fault policy names.
const (
	OnFaultFailClosed = "fail_closed"
	OnFaultFailOpen   = "fail_open"
	OnFaultReload     = "reload"
)

func (p FaultPolicy) runtimePolicy() runtime.Policy {
	switch p.OnFault {
	case OnFaultFailOpen:
		return runtime.PolicyFailOpen
	case OnFaultReload:
		return runtime.PolicyReload
	}
	return runtime.PolicyFailClosed
}

// Duration is a time.Duration written as a string in JSON ("250ms", "1m"), the duration of
// pipeline definitions too: a whole number is nanoseconds.
type Duration = fields.Duration

// Time limits of plugin calls. A manifest's limits.call_timeout replaces the kind's
// default, up to the ceiling; the self-test's limit is fixed.
const (
	// DefaultFilterTimeout limits a filter call (one window of a pull) without call_timeout.
	DefaultFilterTimeout = time.Second
	// DefaultTransformTimeout limits a transform call (one batch of a pipeline).
	DefaultTransformTimeout = time.Second
	// DefaultAllocatorTimeout limits an allocation (the whole group's assignment, once per
	// rebalance, within the consumer's allocate timeout).
	DefaultAllocatorTimeout = 5 * time.Second
	// SelfTestTimeout bounds the start of the first instance and the self-test together, at
	// deploy and at activation, whatever the manifest says (runtime.Spec.StartTimeout).
	SelfTestTimeout = 2 * time.Second
	// MaxCallTimeout is the most limits.call_timeout may be; a manifest asking for more is
	// refused.
	MaxCallTimeout = runtime.MaxCallTimeout
)

// callTimeout is the limit of each call of a plugin of kind k under these limits.
func (l Limits) callTimeout(k Kind) time.Duration {
	if l.CallTimeout > 0 {
		return time.Duration(l.CallTimeout)
	}
	switch k {
	case KindAllocator:
		return DefaultAllocatorTimeout
	case KindTransform:
		return DefaultTransformTimeout
	}
	return DefaultFilterTimeout
}

var (
	nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	// semverRE is the regular expression semver.org gives for semantic version 2.0.0.
	semverRE = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)
)

// ParseManifest decodes and validates a manifest. Unknown fields, trailing data and invalid
// values are errors wrapping [ErrManifest]; those about a field are a *fields.Error naming
// it by its key path ("limits.call_timeout").
func ParseManifest(data []byte) (*Manifest, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		if fe := fields.FromJSON(ErrManifest, err); fe != nil {
			return nil, fe
		}
		return nil, fmt.Errorf("%w: %w", ErrManifest, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: data after the manifest object", ErrManifest)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// Validate checks every field; the error is a *fields.Error wrapping [ErrManifest] and
// naming the first bad field.
func (m *Manifest) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fields.Errorf(ErrManifest, field, format, args...)
	}
	switch {
	case !nameRE.MatchString(m.Name):
		return bad("name", "%q is not 1 to 64 of [a-z0-9._-] starting with a letter or digit", m.Name)
	case m.Kind != KindFilter && m.Kind != KindAllocator && m.Kind != KindTransform:
		return bad("kind", "%q is not filter, allocator or transform", m.Kind)
	case !semverRE.MatchString(m.Version):
		return bad("version", "%q is not a semantic version like 1.2.0", m.Version)
	case m.ABI != ABIVersion:
		return bad("abi", "%d is not supported (this host speaks ABI %d)", m.ABI, ABIVersion)
	case m.Limits.MemoryPages > MaxMemoryPages:
		return bad("limits.memory_pages", "%d is over the maximum of %d", m.Limits.MemoryPages, MaxMemoryPages)
	case m.Limits.CallTimeout < 0:
		return bad("limits.call_timeout", "%v is negative", time.Duration(m.Limits.CallTimeout))
	case m.Limits.CallTimeout > Duration(MaxCallTimeout):
		return bad("limits.call_timeout", "%v is over the ceiling of %v", time.Duration(m.Limits.CallTimeout), MaxCallTimeout)
	case m.Limits.MaxInstances < 0:
		return bad("limits.max_instances", "%d is negative", m.Limits.MaxInstances)
	case m.Policy.OnFault != "" && m.Policy.OnFault != OnFaultFailClosed && m.Policy.OnFault != OnFaultFailOpen && m.Policy.OnFault != OnFaultReload:
		return bad("policy.on_fault", "%q is not fail_closed, fail_open or reload", m.Policy.OnFault)
	case m.Policy.RestartBudget < 0:
		return bad("policy.restart_budget", "%d is negative", m.Policy.RestartBudget)
	case m.Policy.RestartWindow < 0:
		return bad("policy.restart_window", "%v is negative", time.Duration(m.Policy.RestartWindow))
	case m.WantsBody && m.Kind != KindFilter:
		return bad("wants_body", "only filters choose; a %s always gets bodies", m.Kind)
	}
	for k, v := range m.Parameters {
		if k == "" || len(k) > maxU16 {
			return bad("parameters", "key of %d bytes (1 to %d)", len(k), maxU16)
		}
		if len(v) > 1<<30 {
			return bad("parameters."+k, "value of %d bytes", len(v))
		}
	}
	if len(m.SHA256) != 64 || strings.ToLower(m.SHA256) != m.SHA256 {
		return bad("sha256", "%q is not 64 lower-case hex digits", m.SHA256)
	}
	if _, err := hex.DecodeString(m.SHA256); err != nil {
		return bad("sha256", "%q is not 64 lower-case hex digits", m.SHA256)
	}
	return nil
}

// Spec is the [runtime.Spec] that loads this plugin version with [runtime.Runtime.Load]:
// the kind's required exports and signatures, flowd_alloc, the ABI marker
// flowd_abi_version = 1, flowd_init with the parameters on every instance, the limits (the
// kind's default time limit without call_timeout), the policy and the kind's self-test. The
// manifest must be valid.
func (m *Manifest) Spec(wasm []byte) runtime.Spec { return spec(m, wasm) }

// ID is "name@version".
func (m *Manifest) ID() string { return m.Name + "@" + m.Version }
