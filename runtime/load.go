package runtime

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// wasmHeader is the magic number and the only binary format version (1).
var wasmHeader = []byte{0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00}

// Load compiles, validates and warms one module version: it checks the bytes and the
// checksum, compiles (or takes the compiled code from the cache), refuses imports the host
// does not offer and required exports that are missing or mistyped, instantiates one
// instance (running _initialize and [Spec.Init]), checks the ABI marker and runs
// [Spec.SelfTest]. The module returned is ready to serve; on error nothing is left loaded.
func (r *Runtime) Load(ctx context.Context, spec Spec) (*Module, error) {
	if spec.Name == "" {
		return nil, errors.New("load module: Spec.Name is empty")
	}
	if err := spec.checkLimits(); err != nil {
		return nil, fmt.Errorf("load module %s: %w", spec.Name, err)
	}
	spec = spec.withDefaults()
	name := spec.Name
	if !bytes.HasPrefix(spec.Wasm, wasmHeader) {
		head := spec.Wasm[:min(len(spec.Wasm), 8)]
		return nil, fmt.Errorf("load module %s: not a WebAssembly binary (starts with %x, want %x): %w", name, head, wasmHeader, ErrInvalidModule)
	}
	sum := sha256.Sum256(spec.Wasm)
	got := hex.EncodeToString(sum[:])
	if spec.SHA256 != "" && !strings.EqualFold(got, spec.SHA256) {
		return nil, fmt.Errorf("load module %s: sha256 is %s, expected %s: %w", name, got, spec.SHA256, ErrChecksum)
	}
	spec.SHA256 = got // what the module is, whether or not the caller said
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("load module %s: runtime: %w", name, ErrClosed)
	}

	// One wazero runtime per module version: closing the version frees everything at once.
	// Compiled code is still shared through the cache (its key tells code with and without
	// the context-done checks apart). The checks are what let a call be stopped: without
	// them a looping guest can be neither timed out nor preempted by Go's scheduler, and
	// the next garbage collection waits for it forever.
	cfg := wazero.NewRuntimeConfig().
		WithCompilationCache(r.cache).
		WithCloseOnContextDone(!r.uninterruptible)
	wr := wazero.NewRuntimeWithConfig(ctx, cfg)
	ok := false
	defer func() {
		if !ok {
			_ = wr.Close(context.WithoutCancel(ctx))
		}
	}()

	cm, err := wr.CompileModule(ctx, spec.Wasm)
	if err != nil {
		return nil, fmt.Errorf("load module %s: compile: %v: %w", name, err, ErrInvalidModule)
	}
	defer func() {
		if !ok {
			_ = cm.Close(context.WithoutCancel(ctx))
		}
	}()
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, wr); err != nil {
		return nil, fmt.Errorf("load module %s: instantiate WASI: %w", name, err)
	}
	for _, h := range spec.Host {
		b := wr.NewHostModuleBuilder(h.Name)
		for _, f := range h.Functions {
			b.NewFunctionBuilder().WithGoModuleFunction(f.Fn, f.Params, f.Results).Export(f.Name)
		}
		if _, err := b.Instantiate(ctx); err != nil {
			return nil, fmt.Errorf("load module %s: instantiate host module %s: %w", name, h.Name, err)
		}
	}
	if err := checkImports(wr, cm); err != nil {
		return nil, fmt.Errorf("load module %s: %w", name, err)
	}
	if err := checkExports(cm, spec); err != nil {
		return nil, fmt.Errorf("load module %s: %w", name, err)
	}
	if err := checkMemory(cm, spec.MemoryLimitPages); err != nil {
		return nil, fmt.Errorf("load module %s: %w", name, err)
	}

	m := newModule(r, spec, wr, cm)
	first, err := m.start(ctx)
	if err != nil {
		return nil, fmt.Errorf("load module %s: %w", name, err)
	}
	m.idle = append(m.idle, first)
	m.serving.Store(true) // from here a fault is the policy's, not a failed load

	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		first.discard(ctx)
		return nil, fmt.Errorf("load module %s: runtime: %w", name, ErrClosed)
	}
	r.modules[m] = struct{}{}
	r.mu.Unlock()
	ok = true
	r.logger.LogAttrs(ctx, slog.LevelInfo, "wasm module loaded", m.attrs...)
	return m, nil
}

// start makes the first instance, checks its ABI marker and runs the self-test, all
// within Spec.StartTimeout.
func (m *Module) start(ctx context.Context) (*Instance, error) {
	sctx, cancel := m.startContext(ctx, "start and pass its self-test")
	defer cancel()
	first, err := m.newInstance(sctx)
	if err != nil {
		return nil, fmt.Errorf("first instance: %w", err)
	}
	if err := checkABI(sctx, first, m.spec.ABI); err != nil {
		first.discard(ctx)
		return nil, err
	}
	if m.spec.SelfTest != nil {
		if err := m.spec.SelfTest(sctx, first); err != nil {
			first.discard(ctx)
			return nil, fmt.Errorf("%w: %w", ErrSelfTest, err)
		}
		if first.faulted {
			first.discard(ctx)
			return nil, fmt.Errorf("%w: the instance faulted", ErrSelfTest)
		}
	}
	return first, nil
}

// startContext bounds a start by Spec.StartTimeout; its cause, when it ends the start, says
// so and wraps ErrTimeout.
func (m *Module) startContext(ctx context.Context, what string) (context.Context, context.CancelFunc) {
	limit := fmt.Errorf("the guest did not %s within %v: %w", what, m.spec.StartTimeout, ErrTimeout)
	return context.WithTimeoutCause(ctx, m.spec.StartTimeout, limit)
}

// checkImports refuses every import the host does not offer with the same signature. The
// host offers WASI and Spec.Host; no memories, tables or globals.
func checkImports(wr wazero.Runtime, cm wazero.CompiledModule) error {
	for _, def := range cm.ImportedFunctions() {
		mod, fn, _ := def.Import()
		host := wr.Module(mod)
		if host == nil {
			return fmt.Errorf("import %s.%s: host offers no module %q: %w", mod, fn, mod, ErrImport)
		}
		have, ok := host.ExportedFunctionDefinitions()[fn]
		if !ok {
			return fmt.Errorf("import %s.%s: host module %s has no function %q: %w", mod, fn, mod, fn, ErrImport)
		}
		if !sameSignature(def, have.ParamTypes(), have.ResultTypes()) {
			return fmt.Errorf("import %s.%s: guest expects %s, host offers %s: %w", mod, fn,
				signature(def.ParamTypes(), def.ResultTypes()), signature(have.ParamTypes(), have.ResultTypes()), ErrImport)
		}
	}
	for _, def := range cm.ImportedMemories() {
		mod, name, _ := def.Import()
		return fmt.Errorf("import %s.%s: host offers no memory: %w", mod, name, ErrImport)
	}
	return nil
}

func checkExports(cm wazero.CompiledModule, spec Spec) error {
	exports := cm.ExportedFunctions()
	for _, want := range spec.Exports {
		have, ok := exports[want.Name]
		if !ok {
			return fmt.Errorf("export %s: missing: %w", want.Name, ErrExport)
		}
		if !sameSignature(have, want.Params, want.Results) {
			return fmt.Errorf("export %s: is %s, want %s: %w", want.Name,
				signature(have.ParamTypes(), have.ResultTypes()), signature(want.Params, want.Results), ErrExport)
		}
	}
	if spec.ABI.Export != "" {
		have, ok := exports[spec.ABI.Export]
		if !ok {
			return fmt.Errorf("ABI marker export %s: missing: %w", spec.ABI.Export, ErrABIVersion)
		}
		res := have.ResultTypes()
		if len(have.ParamTypes()) != 0 || len(res) != 1 || (res[0] != api.ValueTypeI32 && res[0] != api.ValueTypeI64) {
			return fmt.Errorf("ABI marker export %s: is %s, want () -> i32 or () -> i64: %w", spec.ABI.Export,
				signature(have.ParamTypes(), res), ErrABIVersion)
		}
	}
	return nil
}

func checkMemory(cm wazero.CompiledModule, limit uint32) error {
	for name, def := range cm.ExportedMemories() {
		if def.Min() > limit {
			return fmt.Errorf("memory %s: needs %d pages at start, the limit is %d: %w", name, def.Min(), limit, ErrMemory)
		}
	}
	return nil
}

func checkABI(ctx context.Context, inst *Instance, abi ABI) error {
	if abi.Export == "" {
		return nil
	}
	var stack [1]uint64
	if err := inst.Call(ctx, inst.Function(abi.Export), stack[:]); err != nil {
		return fmt.Errorf("ABI marker export %s: %w: %w", abi.Export, ErrABIVersion, err)
	}
	got := stack[0]
	if inst.Function(abi.Export).Definition().ResultTypes()[0] == api.ValueTypeI32 {
		got = uint64(uint32(got))
	}
	if got != abi.Version {
		return fmt.Errorf("ABI marker export %s: module speaks version %d, host expects %d: %w", abi.Export, got, abi.Version, ErrABIVersion)
	}
	return nil
}

func sameSignature(def api.FunctionDefinition, params, results []api.ValueType) bool {
	return slices.Equal(def.ParamTypes(), params) && slices.Equal(def.ResultTypes(), results)
}

func signature(params, results []api.ValueType) string {
	var b strings.Builder
	b.WriteByte('(')
	for i, p := range params {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(api.ValueTypeName(p))
	}
	b.WriteString(") -> (")
	for i, p := range results {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(api.ValueTypeName(p))
	}
	b.WriteByte(')')
	return b.String()
}
