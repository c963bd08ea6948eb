package runtime

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/wazero/api"
)

var (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

// goGuest builds testdata/guest once per test binary run.
var goGuest struct {
	once sync.Once
	dir  string
	wasm []byte
	err  error

	shared bool // dir is the parent process's (see isolated): use its build, keep it
}

// guestEnv, in a child test process (see isolated), is its parent's build directory: the
// module and the compilation cache.
const guestEnv = "FLOWD_RUNTIME_GUEST_DIR"

func TestMain(m *testing.M) {
	code := m.Run()
	if goGuest.dir != "" && !goGuest.shared {
		_ = os.RemoveAll(goGuest.dir)
	}
	os.Exit(code)
}

// goGuestWasm returns the Go wasip1 reactor built from testdata/guest.
func goGuestWasm(t testing.TB) []byte {
	t.Helper()
	goGuest.once.Do(func() {
		if dir := os.Getenv(guestEnv); dir != "" {
			goGuest.dir, goGuest.shared = dir, true
			goGuest.wasm, goGuest.err = os.ReadFile(filepath.Join(dir, "guest.wasm"))
			return
		}
		dir, err := os.MkdirTemp("", "flowd-runtime-test-")
		if err != nil {
			goGuest.err = err
			return
		}
		goGuest.dir = dir
		out := filepath.Join(dir, "guest.wasm")
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, "./testdata/guest")
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if b, err := cmd.CombinedOutput(); err != nil {
			goGuest.err = &buildError{err: err, out: string(b)}
			return
		}
		goGuest.wasm, goGuest.err = os.ReadFile(out)
	})
	require.NoError(t, goGuest.err)
	return goGuest.wasm
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return "build guest: " + e.err.Error() + "\n" + e.out }

// sharedCacheDir is one compilation cache for the tests that do not test the cache, so the
// Go guest compiles once per configuration rather than once per test.
func sharedCacheDir(t testing.TB) string {
	t.Helper()
	goGuestWasm(t)
	d := filepath.Join(goGuest.dir, "cache")
	require.NoError(t, os.MkdirAll(d, 0o755))
	return d
}

func newRuntime(t testing.TB, logger *slog.Logger) *Runtime {
	t.Helper()
	rt, err := New(context.Background(), Options{CacheDir: sharedCacheDir(t), Logger: logger})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rt.Close(context.Background())) })
	return rt
}

// A hand-assembled module, the way a C or Rust guest without WASI looks.
type wfunc struct {
	name            string // export name
	params, results []api.ValueType
	body            []byte // instructions, without the final end
}

type wimport struct {
	module, name    string
	params, results []api.ValueType
}

type wmod struct {
	imports  []wimport
	funcs    []wfunc
	memPages uint32 // 0: no memory; otherwise exported as "memory", no maximum
}

// Instructions used by the hand-assembled modules.
var (
	bodyAdd       = []byte{0x20, 0, 0x20, 1, 0x6a}                                              // local.get 0; local.get 1; i32.add
	bodyTrap      = []byte{0x00}                                                                // unreachable
	bodyLoop      = []byte{0x03, 0x40, 0x0c, 0x00, 0x0b}                                        // loop; br 0; end
	bodyGrowOrDie = []byte{0x20, 0, 0x40, 0, 0x41, 0x7f, 0x46, 0x04, 0x40, 0x00, 0x0b, 0x41, 1} // memory.grow; -1 → unreachable; 1
	bodyGrow      = []byte{0x20, 0, 0x40, 0}                                                    // memory.grow (returns -1 when refused)
	bodyCallImp   = []byte{0x10, 0}                                                             // call import 0
)

func bodyConst(v byte) []byte { return []byte{0x41, v & 0x3f} } // i32.const v (v < 64)

func uleb(b []byte, v uint32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			b = append(b, c|0x80)
			continue
		}
		return append(b, c)
	}
}

func wname(b []byte, s string) []byte { return append(uleb(b, uint32(len(s))), s...) }

func wsig(b []byte, params, results []api.ValueType) []byte {
	b = append(b, 0x60)
	b = uleb(b, uint32(len(params)))
	b = append(b, params...)
	b = uleb(b, uint32(len(results)))
	return append(b, results...)
}

func (w wmod) bytes() []byte {
	out := append([]byte{}, wasmHeader...)
	section := func(id byte, body []byte) {
		out = append(out, id)
		out = uleb(out, uint32(len(body)))
		out = append(out, body...)
	}
	var types []byte
	types = uleb(types, uint32(len(w.imports)+len(w.funcs)))
	for _, im := range w.imports {
		types = wsig(types, im.params, im.results)
	}
	for _, f := range w.funcs {
		types = wsig(types, f.params, f.results)
	}
	section(1, types)
	if len(w.imports) > 0 {
		var imps []byte
		imps = uleb(imps, uint32(len(w.imports)))
		for i, im := range w.imports {
			imps = wname(imps, im.module)
			imps = wname(imps, im.name)
			imps = append(imps, 0x00)
			imps = uleb(imps, uint32(i))
		}
		section(2, imps)
	}
	var fns []byte
	fns = uleb(fns, uint32(len(w.funcs)))
	for i := range w.funcs {
		fns = uleb(fns, uint32(len(w.imports)+i))
	}
	section(3, fns)
	if w.memPages > 0 {
		section(5, uleb([]byte{1, 0x00}, w.memPages))
	}
	var exps []byte
	n := len(w.funcs)
	if w.memPages > 0 {
		n++
	}
	exps = uleb(exps, uint32(n))
	for i, f := range w.funcs {
		exps = wname(exps, f.name)
		exps = append(exps, 0x00)
		exps = uleb(exps, uint32(len(w.imports)+i))
	}
	if w.memPages > 0 {
		exps = wname(exps, "memory")
		exps = append(exps, 0x02, 0x00)
	}
	section(7, exps)
	var code []byte
	code = uleb(code, uint32(len(w.funcs)))
	for _, f := range w.funcs {
		body := append([]byte{0x00}, f.body...) // no locals
		body = append(body, 0x0b)
		code = uleb(code, uint32(len(body)))
		code = append(code, body...)
	}
	section(10, code)
	return out
}

// cModule is a small module like a C guest's: no imports, a memory, a few exports.
func cModule(version byte) []byte {
	return wmod{memPages: 1, funcs: []wfunc{
		{name: "flowd_abi_version", results: []api.ValueType{i32}, body: bodyConst(1)},
		{name: "version", results: []api.ValueType{i32}, body: bodyConst(version)},
		{name: "add", params: []api.ValueType{i32, i32}, results: []api.ValueType{i32}, body: bodyAdd},
		{name: "trap", body: bodyTrap},
		{name: "loop", body: bodyLoop},
		{name: "grow_or_die", params: []api.ValueType{i32}, results: []api.ValueType{i32}, body: bodyGrowOrDie},
		{name: "grow", params: []api.ValueType{i32}, results: []api.ValueType{i32}, body: bodyGrow},
	}}.bytes()
}

// logSink collects log records.
type logSink struct {
	mu      sync.Mutex
	records []slog.Record
}

func (s *logSink) Enabled(context.Context, slog.Level) bool { return true }
func (s *logSink) Handle(_ context.Context, r slog.Record) error {
	s.mu.Lock()
	s.records = append(s.records, r.Clone())
	s.mu.Unlock()
	return nil
}
func (s *logSink) WithAttrs([]slog.Attr) slog.Handler { return s }
func (s *logSink) WithGroup(string) slog.Handler      { return s }

// lines returns the attrs of the records with message msg.
func (s *logSink) lines(msg string) []map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]string
	for _, r := range s.records {
		if r.Message != msg {
			continue
		}
		m := map[string]string{}
		r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
		out = append(out, m)
	}
	return out
}

// call borrows an instance of m, calls name with stack and releases it.
func call(ctx context.Context, m *Module, name string, stack ...uint64) ([]uint64, error) {
	if len(stack) == 0 {
		stack = make([]uint64, 1)
	}
	err := m.Do(ctx, func(inst *Instance) error { return inst.Call(ctx, inst.Function(name), stack) })
	return stack, err
}
