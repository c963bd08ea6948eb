package plugins

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/flowd-io/flowd/runtime"
	"github.com/tetratelabs/wazero/api"
)

// ABIVersion is the plugin ABI version this package speaks (ABI.md).
const ABIVersion = 1

// Names of the ABI's exports.
const (
	ExportABIVersion = "flowd_abi_version"
	ExportAlloc      = "flowd_alloc"
	ExportInit       = "flowd_init"
	ExportFilter     = "flowd_filter"
	ExportAllocate   = "flowd_allocate"
	ExportTransform  = "flowd_transform"
)

// Limits of ABI version 1.
const (
	// MaxBatch is the most messages one filter or transform call carries; larger batches are
	// split.
	MaxBatch = 1024
	// MaxBatchBytes is the most input bytes one call carries, unless a single record is
	// larger.
	MaxBatchBytes = 4 << 20
	// MaxMemoryPages is the largest memory a plugin may have: packed (ptr<<32 | len) results
	// stay non-negative below 2 GiB.
	MaxMemoryPages = 32768
	maxU16         = math.MaxUint16
)

// Kind is what a plugin does.
type Kind string

// The plugin kinds of ABI version 1.
const (
	KindFilter    Kind = "filter"
	KindAllocator Kind = "allocator"
	KindTransform Kind = "transform"
)

var (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

// exportOf is the kind's entry point and its signature.
func (k Kind) export() (runtime.Export, bool) {
	switch k {
	case KindFilter:
		return runtime.Export{Name: ExportFilter, Params: []api.ValueType{i32, i32, i32}, Results: []api.ValueType{i32}}, true
	case KindAllocator:
		return runtime.Export{Name: ExportAllocate, Params: []api.ValueType{i32, i32}, Results: []api.ValueType{i64}}, true
	case KindTransform:
		return runtime.Export{Name: ExportTransform, Params: []api.ValueType{i32, i32, i32}, Results: []api.ValueType{i64}}, true
	}
	return runtime.Export{}, false
}

// version is what the instances of one loaded plugin version share: its manifest and
// configuration. Faults, whoever detects them, are the runtime's to count and to apply the
// policy to (see [state.fail]).
type version struct {
	man       *Manifest
	name, ver string
	kind      Kind
	wantsBody bool
	params    []byte // encoded for flowd_init
}

// fail turns an ABI-level failure of the call just made (a guest error code, malformed
// output) into a fault of the instance, so that the runtime counts it, discards the instance
// and applies the one policy and restart budget; other errors (runtime faults, which went
// that way already, and the host's own errors) pass through.
func (st *state) fail(ctx context.Context, fn string, err error) error {
	if err == nil {
		return nil
	}
	var fe *runtime.FaultError
	switch {
	case errors.As(err, &fe):
		return err
	case errors.Is(err, ErrGuest):
		return st.inst.Fault(ctx, runtime.FaultGuestError, fn, err)
	case errors.Is(err, ErrBadOutput):
		return st.inst.Fault(ctx, runtime.FaultBadOutput, fn, err)
	}
	return err
}

// state is one instance's handles and buffers, kept with Instance.SetData.
type state struct {
	v     *version
	inst  *runtime.Instance
	alloc api.Function
	call  api.Function

	buf, bufCap uint32 // the input buffer from flowd_alloc
	stack       [3]uint64
}

// stateOf returns the ABI state of inst, checking its kind.
func stateOf(inst *runtime.Instance, kind Kind) (*state, error) {
	st, ok := inst.Data().(*state)
	if !ok {
		return nil, fmt.Errorf("plugin %s: instance has no plugin state: %w", inst.Module().Name(), ErrKind)
	}
	if st.v.kind != kind {
		return nil, fmt.Errorf("plugin %s is a %s, not a %s: %w", st.v.name, st.v.kind, kind, ErrKind)
	}
	return st, nil
}

// input returns a view of n bytes of guest memory to write a call's input into, calling
// flowd_alloc only when the buffer the instance has is too small.
func (st *state) input(ctx context.Context, n int) ([]byte, error) {
	if n > math.MaxInt32 {
		return nil, fmt.Errorf("plugin %s: input of %d bytes: %w", st.v.name, n, ErrTooLarge)
	}
	if uint32(n) > st.bufCap {
		size := max(uint32(n), 4096, min(2*st.bufCap, math.MaxInt32))
		st.stack[0] = uint64(size)
		if err := st.inst.Call(ctx, st.alloc, st.stack[:]); err != nil {
			return nil, err
		}
		ptr := uint32(st.stack[0])
		if ptr == 0 {
			return nil, fmt.Errorf("flowd_alloc(%d): out of memory: %w", size, &GuestError{Code: int64(CodeNoMemory)})
		}
		if uint64(ptr)+uint64(size) > uint64(st.inst.Memory().Size()) {
			return nil, fmt.Errorf("flowd_alloc(%d) returned %#x, past the end of memory (%d bytes): %w",
				size, ptr, st.inst.Memory().Size(), ErrBadOutput)
		}
		st.buf, st.bufCap = ptr, size
	}
	view, ok := st.inst.Memory().Read(st.buf, uint32(n))
	if !ok {
		return nil, fmt.Errorf("input buffer %#x+%d outside memory: %w", st.buf, n, ErrBadOutput)
	}
	return view, nil
}

// output returns the guest memory a packed (ptr<<32 | len) result names.
func (st *state) output(packed uint64) ([]byte, error) {
	if int64(packed) < 0 {
		return nil, &GuestError{Code: int64(packed)}
	}
	ptr, n := uint32(packed>>32), uint32(packed)
	view, ok := st.inst.Memory().Read(ptr, n)
	if !ok {
		return nil, fmt.Errorf("result of %d bytes at %#x outside memory (%d bytes): %w", n, ptr, st.inst.Memory().Size(), ErrBadOutput)
	}
	return view, nil
}

// spec builds the runtime.Spec of a plugin version: the kind's exports, the ABI marker,
// Init (function handles, flowd_init with the parameters) and the kind's self-test.
func spec(m *Manifest, wasm []byte) runtime.Spec {
	export, _ := m.Kind.export()
	v := &version{
		man:       m,
		name:      m.Name,
		ver:       m.Version,
		kind:      m.Kind,
		wantsBody: m.WantsBody,
		params:    encodeParams(m.Parameters),
	}
	s := runtime.Spec{
		Name:             m.Name,
		Version:          m.Version,
		Wasm:             wasm,
		SHA256:           m.SHA256,
		MaxInstances:     m.Limits.MaxInstances,
		MemoryLimitPages: m.Limits.MemoryPages,
		CallTimeout:      m.Limits.callTimeout(m.Kind),
		StartTimeout:     SelfTestTimeout,
		Policy:           m.Policy.runtimePolicy(),
		RestartBudget:    m.Policy.RestartBudget,
		RestartWindow:    time.Duration(m.Policy.RestartWindow),
		Exports: []runtime.Export{
			{Name: ExportAlloc, Params: []api.ValueType{i32}, Results: []api.ValueType{i32}},
			export,
		},
		ABI: runtime.ABI{Export: ExportABIVersion, Version: ABIVersion},
		Init: func(ctx context.Context, inst *runtime.Instance) error {
			return initInstance(ctx, inst, v)
		},
	}
	switch m.Kind {
	case KindFilter:
		s.SelfTest = selfTestFilter
	case KindAllocator:
		s.SelfTest = selfTestAllocator
	case KindTransform:
		s.SelfTest = selfTestTransform
	}
	return s
}

// initInstance checks the marker (flowd_init must not run on a guest of another ABI),
// keeps the function handles and passes the parameters.
func initInstance(ctx context.Context, inst *runtime.Instance, v *version) error {
	export, _ := v.kind.export()
	st := &state{v: v, inst: inst, alloc: inst.Function(ExportAlloc), call: inst.Function(export.Name)}
	if st.alloc == nil || st.call == nil || inst.Memory() == nil {
		return fmt.Errorf("plugin %s: needs %s, %s and a memory: %w", v.name, ExportAlloc, export.Name, runtime.ErrExport)
	}
	if mark := inst.Function(ExportABIVersion); mark != nil {
		if err := inst.Call(ctx, mark, st.stack[:]); err != nil {
			return fmt.Errorf("plugin %s: %s: %w", v.name, ExportABIVersion, err)
		}
		if got := uint32(st.stack[0]); got != ABIVersion {
			return fmt.Errorf("plugin %s: speaks ABI version %d, host expects %d: %w", v.name, got, ABIVersion, runtime.ErrABIVersion)
		}
	}
	inst.SetData(st)
	initFn := inst.Function(ExportInit)
	if initFn == nil {
		return nil
	}
	def := initFn.Definition()
	if !slices.Equal(def.ParamTypes(), []api.ValueType{i32, i32}) || !slices.Equal(def.ResultTypes(), []api.ValueType{i32}) {
		return fmt.Errorf("plugin %s: export %s must be (i32, i32) -> i32: %w", v.name, ExportInit, runtime.ErrExport)
	}
	buf, err := st.input(ctx, len(v.params))
	if err != nil {
		return fmt.Errorf("plugin %s: parameters: %w", v.name, err)
	}
	copy(buf, v.params)
	st.stack[0], st.stack[1] = uint64(st.buf), uint64(len(v.params))
	if err := inst.Call(ctx, initFn, st.stack[:]); err != nil {
		return fmt.Errorf("plugin %s: %s: %w", v.name, ExportInit, err)
	}
	if code := int32(st.stack[0]); code != 0 {
		return fmt.Errorf("plugin %s: %s refused the parameters: %w", v.name, ExportInit, &GuestError{Code: int64(code)})
	}
	return nil
}

// encodeParams is the flowd_init input: u32 count, then (u16 key, u32 value) sorted by key.
func encodeParams(params map[string]string) []byte {
	keys := make([]string, 0, len(params))
	n := 4
	for k, v := range params {
		keys = append(keys, k)
		n += 6 + len(k) + len(v)
	}
	slices.Sort(keys)
	b := make([]byte, 0, n)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(keys)))
	for _, k := range keys {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(k)))
		b = append(b, k...)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(params[k])))
		b = append(b, params[k]...)
	}
	return b
}

// putStr16 writes a u16-prefixed string at b[off:] and returns the new offset.
func putStr16(b []byte, off int, s string) int {
	binary.LittleEndian.PutUint16(b[off:], uint16(len(s)))
	return off + 2 + copy(b[off+2:], s)
}

func putBytes32(b []byte, off int, s []byte) int {
	binary.LittleEndian.PutUint32(b[off:], uint32(len(s)))
	return off + 4 + copy(b[off+4:], s)
}
