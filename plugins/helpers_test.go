package plugins

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/runtime"
)

// guests builds each Go guest once per test binary run: a Go wasip1 build takes seconds.
type guestBuild struct {
	once sync.Once
	wasm []byte
	err  error
}

var guests struct {
	mu     sync.Mutex
	dir    string
	shared bool // dir is the parent process's (see isolated): use its builds, keep it
	builds map[string]*guestBuild
}

// buildDirEnv, in a child test process (see isolated), is its parent's build directory.
const buildDirEnv = "FLOWD_PLUGINS_BUILD_DIR"

func TestMain(m *testing.M) {
	code := m.Run()
	if guests.dir != "" && !guests.shared {
		_ = os.RemoveAll(guests.dir)
	}
	os.Exit(code)
}

func buildDir(t testing.TB) string {
	t.Helper()
	guests.mu.Lock()
	defer guests.mu.Unlock()
	if guests.dir == "" {
		guests.builds = map[string]*guestBuild{}
		if d := os.Getenv(buildDirEnv); d != "" {
			guests.dir, guests.shared = d, true
			return d
		}
		d, err := os.MkdirTemp("", "flowd-plugins-test-")
		require.NoError(t, err)
		guests.dir = d
	}
	return guests.dir
}

// goGuest builds the Go package at pkg (relative to this directory) as a wasip1 reactor,
// the way each example's README says.
func goGuest(t testing.TB, pkg string) []byte {
	t.Helper()
	dir := buildDir(t)
	guests.mu.Lock()
	b := guests.builds[pkg]
	if b == nil {
		b = &guestBuild{}
		guests.builds[pkg] = b
	}
	guests.mu.Unlock()
	b.once.Do(func() {
		out := filepath.Join(dir, strings.NewReplacer("/", "_", ".", "_").Replace(pkg)+".wasm")
		if guests.shared {
			if b.wasm, b.err = os.ReadFile(out); b.err == nil {
				return
			}
		}
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, pkg)
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if o, err := cmd.CombinedOutput(); err != nil {
			b.err = &buildError{pkg: pkg, err: err, out: string(o)}
			return
		}
		b.wasm, b.err = os.ReadFile(out)
	})
	require.NoError(t, b.err)
	return b.wasm
}

type buildError struct {
	pkg string
	err error
	out string
}

func (e *buildError) Error() string { return "build " + e.pkg + ": " + e.err.Error() + "\n" + e.out }

const (
	jsonFilterPkg = "../examples/wasm/go-jsonfilter"
	redactPkg     = "../examples/wasm/go-redact"
	averagelyPkg  = "../examples/wasm/go-averagely"
	stickyPkg     = "../examples/wasm/go-sticky"
	badGuestPkg   = "./testdata/badguest"
)

// newRuntime returns a runtime sharing one compilation cache across the test run, so each
// Go guest compiles once.
func newRuntime(t testing.TB) *runtime.Runtime {
	t.Helper()
	return newRuntimeWith(t, runtime.Options{})
}

// newRuntimeWith is newRuntime with opts (their CacheDir is replaced).
func newRuntimeWith(t testing.TB, opts runtime.Options) *runtime.Runtime {
	t.Helper()
	cache := filepath.Join(buildDir(t), "cache")
	require.NoError(t, os.MkdirAll(cache, 0o755))
	opts.CacheDir = cache
	rt, err := runtime.New(context.Background(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	return rt
}

func sum(wasm []byte) string {
	s := sha256.Sum256(wasm)
	return hex.EncodeToString(s[:])
}

// manifest returns a valid manifest for wasm.
func manifest(name string, kind Kind, wasm []byte, params map[string]string) *Manifest {
	return &Manifest{
		Name: name, Kind: kind, Version: "1.0.0", ABI: ABIVersion,
		Limits:     Limits{MemoryPages: 512, MaxInstances: 2},
		Parameters: params,
		SHA256:     sum(wasm),
	}
}

// load loads m into a fresh slot.
func load(t testing.TB, rt *runtime.Runtime, m *Manifest, wasm []byte) *runtime.Slot {
	t.Helper()
	require.NoError(t, m.Validate())
	mod, err := rt.Load(context.Background(), m.Spec(wasm))
	require.NoError(t, err)
	s := &runtime.Slot{}
	require.NoError(t, s.Swap(context.Background(), mod))
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// A tiny WebAssembly assembler for modules a compiler would not produce.

type wfunc struct {
	name            string // export name
	params, results []byte // value types: 0x7f i32, 0x7e i64
	body            []byte // instructions, without the final end
}

type wimport struct {
	module, name    string
	params, results []byte
}

func leb(v uint32) []byte {
	var b []byte
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

func wvec(items ...[]byte) []byte {
	b := leb(uint32(len(items)))
	for _, it := range items {
		b = append(b, it...)
	}
	return b
}

func wname(s string) []byte { return append(leb(uint32(len(s))), s...) }

func wsection(id byte, content []byte) []byte {
	return append(append([]byte{id}, leb(uint32(len(content)))...), content...)
}

// wasmModule assembles a module with one memory of one page exported as "memory".
func wasmModule(imports []wimport, funcs []wfunc) []byte {
	var types, imps, fidx, exps, codes [][]byte
	for _, im := range imports {
		types = append(types, append(append([]byte{0x60}, wvec(bytesOf(im.params)...)...), wvec(bytesOf(im.results)...)...))
		imps = append(imps, append(append(wname(im.module), wname(im.name)...), append([]byte{0x00}, leb(uint32(len(types)-1))...)...))
	}
	for i, f := range funcs {
		types = append(types, append(append([]byte{0x60}, wvec(bytesOf(f.params)...)...), wvec(bytesOf(f.results)...)...))
		fidx = append(fidx, leb(uint32(len(types)-1)))
		exps = append(exps, append(wname(f.name), append([]byte{0x00}, leb(uint32(len(imports)+i))...)...))
		body := append(append([]byte{0x00}, f.body...), 0x0b)
		codes = append(codes, append(leb(uint32(len(body))), body...))
	}
	exps = append(exps, append(wname("memory"), 0x02, 0x00))
	b := []byte{0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00}
	b = append(b, wsection(1, wvec(types...))...)
	if len(imps) > 0 {
		b = append(b, wsection(2, wvec(imps...))...)
	}
	b = append(b, wsection(3, wvec(fidx...))...)
	b = append(b, wsection(5, wvec([]byte{0x00, 0x01}))...)
	b = append(b, wsection(7, wvec(exps...))...)
	b = append(b, wsection(10, wvec(codes...))...)
	return b
}

func bytesOf(b []byte) [][]byte {
	out := make([][]byte, len(b))
	for i := range b {
		out[i] = b[i : i+1]
	}
	return out
}

const (
	vI32 = 0x7f
	vI64 = 0x7e
)

// i32Const is "i32.const v" for small non-negative v (< 64).
func i32Const(v byte) []byte { return []byte{0x41, v} }

// tinyFilter is a valid filter by hand: flowd_alloc returns 1024, flowd_filter returns a
// pointer to byte 0, which holds 0 (keep nothing) unless the body stores into it.
func tinyFilter() []wfunc {
	return []wfunc{
		{name: ExportABIVersion, results: []byte{vI32}, body: i32Const(1)},
		{name: ExportAlloc, params: []byte{vI32}, results: []byte{vI32}, body: []byte{0x41, 0x80, 0x08}},
		{name: ExportFilter, params: []byte{vI32, vI32, vI32}, results: []byte{vI32}, body: i32Const(0)},
	}
}

const (
	testTimeout  = 30 * time.Second
	pollInterval = 5 * time.Millisecond
)
