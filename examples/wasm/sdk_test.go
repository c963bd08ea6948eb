// Package wasm_test checks the C and Rust example plugins as flowd runs them: the committed
// modules are loaded through package runtime and their exports are called as the plugin ABI
// (plugins/ABI.md) says, with the input encoded here, independently of the guests' SDKs. Where
// the compilers are installed, the modules are rebuilt and must match the committed ones byte
// for byte, so the committed binaries are what their sources and build commands produce.
package wasm_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/flowd-io/flowd/runtime"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// Error codes of plugins/ABI.md.
const (
	errInput  = -2
	errNomem  = -3
	errParams = -4
)

var (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

// record is one message as the filter and transform kinds receive it.
type record struct {
	queueID     int32
	queueOffset int64
	storeTimeMs int64
	topic       string
	tags        string
	keys        string
	props       string // RocketMQ encoding, see props()
	body        string
}

// props encodes properties as RocketMQ does: key 0x01 value 0x02, repeated.
func props(kv ...string) string {
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		b.WriteString(kv[i])
		b.WriteByte(1)
		b.WriteString(kv[i+1])
		b.WriteByte(2)
	}
	return b.String()
}

// appendRecord appends r in the ABI's record encoding.
func appendRecord(b []byte, r record) []byte {
	le := binary.LittleEndian
	rlen := 4 + 8 + 8 + 2 + len(r.topic) + 2 + len(r.tags) + 2 + len(r.keys) + 4 + len(r.props) + 4 + len(r.body)
	b = le.AppendUint32(b, uint32(rlen))
	b = le.AppendUint32(b, uint32(r.queueID))
	b = le.AppendUint64(b, uint64(r.queueOffset))
	b = le.AppendUint64(b, uint64(r.storeTimeMs))
	b = le.AppendUint16(b, uint16(len(r.topic)))
	b = append(b, r.topic...)
	b = le.AppendUint16(b, uint16(len(r.tags)))
	b = append(b, r.tags...)
	b = le.AppendUint16(b, uint16(len(r.keys)))
	b = append(b, r.keys...)
	b = le.AppendUint32(b, uint32(len(r.props)))
	b = append(b, r.props...)
	b = le.AppendUint32(b, uint32(len(r.body)))
	b = append(b, r.body...)
	return b
}

func encodeRecords(rs []record) []byte {
	var b []byte
	for _, r := range rs {
		b = appendRecord(b, r)
	}
	return b
}

// encodeParams encodes flowd_init's input: u32 count, then (u16 key, u32 value) pairs,
// sorted by key.
func encodeParams(kv ...string) []byte {
	le := binary.LittleEndian
	type pair struct{ k, v string }
	var ps []pair
	for i := 0; i+1 < len(kv); i += 2 {
		ps = append(ps, pair{kv[i], kv[i+1]})
	}
	// Sorted by key, as the host sends them.
	for i := 1; i < len(ps); i++ {
		for j := i; j > 0 && ps[j].k < ps[j-1].k; j-- {
			ps[j], ps[j-1] = ps[j-1], ps[j]
		}
	}
	b := le.AppendUint32(nil, uint32(len(ps)))
	for _, p := range ps {
		b = le.AppendUint16(b, uint16(len(p.k)))
		b = append(b, p.k...)
		b = le.AppendUint32(b, uint32(len(p.v)))
		b = append(b, p.v...)
	}
	return b
}

// filterSpec is the runtime spec of a filter module, as the plugins host loads one.
func filterSpec(name string, wasm []byte) runtime.Spec {
	return runtime.Spec{
		Name: name,
		Wasm: wasm,
		ABI:  runtime.ABI{Export: "flowd_abi_version", Version: 1},
		Exports: []runtime.Export{
			{Name: "flowd_alloc", Params: []api.ValueType{i32}, Results: []api.ValueType{i32}},
			{Name: "flowd_init", Params: []api.ValueType{i32, i32}, Results: []api.ValueType{i32}},
			{Name: "flowd_filter", Params: []api.ValueType{i32, i32, i32}, Results: []api.ValueType{i32}},
		},
		MaxInstances: 1,
	}
}

func readWasm(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// loadModule loads spec in a runtime of its own, closed at the end of the test.
func loadModule(t testing.TB, spec runtime.Spec) *runtime.Module {
	t.Helper()
	ctx := context.Background()
	rt, err := runtime.New(ctx, runtime.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	m, err := rt.Load(ctx, spec)
	require.NoError(t, err)
	return m
}

// borrow borrows an instance of m, released at the end of the test.
func borrow(t testing.TB, m *runtime.Module) *guest {
	t.Helper()
	inst, err := m.Borrow(context.Background())
	require.NoError(t, err)
	t.Cleanup(inst.Release)
	return &guest{inst: inst, stack: make([]uint64, 3)}
}

// guest calls the ABI's exports on one instance, as the host does.
type guest struct {
	inst  *runtime.Instance
	stack []uint64
	// buf and bufCap are the input buffer from flowd_alloc, reused while input fits.
	buf, bufCap uint32
}

func (g *guest) call(name string, args ...uint64) (uint64, error) {
	copy(g.stack, args)
	err := g.inst.Call(context.Background(), g.inst.Function(name), g.stack)
	return g.stack[0], err
}

// input copies b into the guest's input buffer, asking flowd_alloc for a larger one when b
// does not fit.
func (g *guest) input(b []byte) (uint32, error) {
	if g.buf == 0 || uint32(len(b)) > g.bufCap {
		p, err := g.call("flowd_alloc", uint64(len(b)))
		if err != nil {
			return 0, err
		}
		if uint32(p) == 0 {
			return 0, errors.New("flowd_alloc: out of memory")
		}
		g.buf, g.bufCap = uint32(p), uint32(len(b))
	}
	if !g.inst.Memory().Write(g.buf, b) {
		return 0, errors.New("input buffer outside guest memory")
	}
	return g.buf, nil
}

// init calls flowd_init with params and returns its code.
func (g *guest) init(params []byte) (int32, error) {
	p, err := g.input(params)
	if err != nil {
		return 0, err
	}
	r, err := g.call("flowd_init", uint64(p), uint64(len(params)))
	return int32(r), err
}

// filterRaw calls flowd_filter on raw input claiming n records. It returns the bitmap, or
// the guest's negative code.
func (g *guest) filterRaw(in []byte, n int32) ([]byte, int32, error) {
	p, err := g.input(in)
	if err != nil {
		return nil, 0, err
	}
	r, err := g.call("flowd_filter", uint64(p), uint64(len(in)), uint64(uint32(n)))
	if err != nil {
		return nil, 0, err
	}
	code := int32(r)
	if code < 0 {
		return nil, code, nil
	}
	size := (uint32(n) + 7) / 8
	bm, ok := g.inst.Memory().Read(uint32(code), size)
	if !ok {
		return nil, 0, errors.New("bitmap outside guest memory")
	}
	return bytes.Clone(bm), 0, nil
}

// filter runs rs through the filter and returns which were kept, checking the bitmap's
// unused bits are clear as the ABI requires.
func (g *guest) filter(t testing.TB, rs []record) []bool {
	t.Helper()
	bm, code, err := g.filterRaw(encodeRecords(rs), int32(len(rs)))
	require.NoError(t, err)
	require.Zero(t, code, "filter returned an error code")
	return bitsOf(t, bm, len(rs))
}

func bitsOf(t testing.TB, bm []byte, n int) []bool {
	t.Helper()
	kept := make([]bool, n)
	for i := range n {
		kept[i] = bm[i/8]&(1<<(i%8)) != 0
	}
	if n%8 != 0 {
		require.Zero(t, bm[n/8]>>(n%8), "bits past n must be clear")
	}
	return kept
}

// rebuild runs a module's build command in its source directory with the output in a
// temporary directory, and requires the result to equal the committed module.
func rebuild(t *testing.T, dir, tool string, args []string, committed string) {
	t.Helper()
	if _, err := exec.LookPath(tool); err != nil {
		t.Skipf("%s is not installed, so the committed %s is not rebuilt and compared (install it: see %s/README.md)", tool, committed, dir)
	}
	if tool == rustc {
		// Debian's rustc without libstd-rust-dev-wasm32 has no wasm32 standard library.
		out, err := exec.Command(rustc, "--print", "target-libdir", "--target", "wasm32-unknown-unknown").Output()
		if _, serr := os.Stat(strings.TrimSpace(string(out))); err != nil || serr != nil {
			t.Skipf("%s has no wasm32-unknown-unknown target (install libstd-rust-dev-wasm32), so the committed %s is not rebuilt and compared", rustc, committed)
		}
	}
	// The same source gives the same bytes only with the same compiler.
	v, err := exec.Command(tool, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", tool, err)
	}
	version := strings.SplitN(string(v), "\n", 2)[0]
	if want := builtWith[committed]; !strings.Contains(version, want) {
		t.Skipf("%s was built with %s; %s is %q, whose output may differ: not compared", committed, want, tool, version)
	}
	out := filepath.Join(t.TempDir(), committed)
	full := make([]string, 0, len(args)+2)
	for _, a := range args {
		if a == committed {
			a = out
		}
		full = append(full, a)
	}
	cmd := exec.Command(tool, full...)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", committed, err, b)
	}
	got := readWasm(t, out)
	want := readWasm(t, filepath.Join(dir, committed))
	if !bytes.Equal(got, want) {
		at := 0
		for at < min(len(got), len(want)) && got[at] == want[at] {
			at++
		}
		t.Fatalf("%s/%s differs from what its build command produces (%d bytes, committed %d, first difference at byte %d): rebuild it with the command in %s/README.md and commit it",
			dir, committed, len(got), len(want), at, dir)
	}
	abs, err := filepath.Abs(dir) // where this checkout is, whatever the machine
	require.NoError(t, err)
	for _, s := range []string{abs, out, "/home/", "/root/", "/tmp/", "/usr/", "/build/"} {
		require.NotContains(t, string(got), s, "the module embeds a path of the machine that built it")
	}
}

// builtWith names the compiler each committed module was built with (in its README too).
var builtWith = map[string]string{
	"propfilter.wasm": "clang version 14.0.6",
	"tagfilter.wasm":  "rustc 1.63.0",
}

// requireReadmeHas requires a README to show the exact build command the test runs.
func requireReadmeHas(t *testing.T, dir string, tool string, args []string) {
	t.Helper()
	readme := string(readWasm(t, filepath.Join(dir, "README.md")))
	command := tool + " " + strings.Join(args, " ")
	require.Contains(t, readme, command, "%s/README.md must show the build command", dir)
}

// ---- C: c-propfilter ----

const cDir = "c-propfilter"

// cBuild is the build command of c-propfilter/README.md, run in c-propfilter/.
var cBuild = []string{"--target=wasm32", "-nostdlib", "-O2", "-mbulk-memory", "-I", "../../../plugins/sdk/c",
	"-Wl,--no-entry", "-Wl,--strip-all", "-o", "propfilter.wasm", "propfilter.c"}

func cPropfilter(t testing.TB) runtime.Spec {
	return filterSpec("c-propfilter", readWasm(t, filepath.Join(cDir, "propfilter.wasm")))
}

// cGuest loads c-propfilter and configures it with params.
func cGuest(t testing.TB, params ...string) *guest {
	t.Helper()
	g := borrow(t, loadModule(t, cPropfilter(t)))
	code, err := g.init(encodeParams(params...))
	require.NoError(t, err)
	require.Zero(t, code, "flowd_init")
	return g
}

func TestCPropfilterKeepsMatchingProperty(t *testing.T) {
	g := cGuest(t, "property", "color", "value", "red")
	rs := []record{
		{props: props("color", "red")},  // keep
		{props: props("color", "blue")}, // other value
		{props: props("size", "red")},   // other property
		{},                              // no properties
		{props: props("a", "1", "color", "red", "b", "2")},        // keep: not first
		{props: props("color", "re")},                             // a prefix of the value
		{props: props("color", "redder")},                         // the value is a prefix
		{props: props("xcolor", "red", "colorx", "red")},          // names that contain the name
		{props: props("color", "")},                               // empty value
		{props: "color\x01red"},                                   // keep: last pair without 0x02
		{topic: "t", tags: "red", keys: "color red", body: "red"}, // only elsewhere
		{props: props("COLOR", "red")},                            // names are case-sensitive
	}
	want := []bool{true, false, false, false, true, false, false, false, false, true, false, false}
	require.Equal(t, want, g.filter(t, rs))

	// The same instance serves later batches, smaller and larger (the bitmap and the input
	// buffer are reused and grown).
	require.Equal(t, []bool{false, true}, g.filter(t, []record{{}, {props: props("color", "red")}}))
	big := make([]record, 1000)
	for i := range big {
		if i%3 == 0 {
			big[i].props = props("color", "red", "pad", strings.Repeat("x", 200))
		}
	}
	kept := g.filter(t, big)
	for i, k := range kept {
		require.Equal(t, i%3 == 0, k, "message %d", i)
	}
}

func TestCPropfilterEmptyValueMatchesEmptyProperty(t *testing.T) {
	g := cGuest(t, "property", "flag", "value", "")
	require.Equal(t, []bool{true, false, false},
		g.filter(t, []record{{props: props("flag", "")}, {props: props("flag", "x")}, {}}))
}

func TestCPropfilterParameters(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params []byte
		code   int32
	}{
		{"no parameters", encodeParams(), errParams},
		{"no value", encodeParams("property", "color"), errParams},
		{"no property", encodeParams("value", "red"), errParams},
		{"empty property name", encodeParams("property", "", "value", "red"), errParams},
		{"truncated", encodeParams("property", "color", "value", "red")[:10], errInput},
		{"count past the input", []byte{5, 0, 0, 0}, errInput},
		{"bytes left over", append(encodeParams("property", "color", "value", "red"), 0), errInput},
		{"shorter than the count", []byte{1, 0}, errInput},
		{"extra parameters are ignored", encodeParams("property", "color", "value", "red", "zz", "1"), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := borrow(t, loadModule(t, cPropfilter(t)))
			code, err := g.init(tc.params)
			require.NoError(t, err)
			require.Equal(t, tc.code, code)
		})
	}
}

func TestCPropfilterWithoutInitRefusesToFilter(t *testing.T) {
	g := borrow(t, loadModule(t, cPropfilter(t)))
	_, code, err := g.filterRaw(encodeRecords([]record{{}}), 1)
	require.NoError(t, err)
	require.Equal(t, int32(errParams), code)
}

// malformedBatches are inputs that do not decode as n records. A guest must answer each
// with FLOWD_ERR_INPUT, not read past its input or trap.
func malformedBatches() []struct {
	name string
	in   []byte
	n    int32
} {
	one := encodeRecords([]record{{topic: "t", props: props("color", "red")}})
	le := binary.LittleEndian
	withLen := func(b []byte, at int, v uint32) []byte {
		b = bytes.Clone(b)
		le.PutUint32(b[at:], v)
		return b
	}
	topicLenAt := 4 + 20
	propsLenAt := topicLenAt + 2 + 1 + 2 + 2
	return []struct {
		name string
		in   []byte
		n    int32
	}{
		{"record_len past the input", withLen(one, 0, uint32(len(one))), 1},
		{"record_len huge", withLen(one, 0, 0xffffffff), 1},
		{"record_len shorter than the fixed fields", append(le.AppendUint32(nil, 19), make([]byte, 19)...), 1},
		{"topic_len past the record", func() []byte {
			b := bytes.Clone(one)
			le.PutUint16(b[topicLenAt:], 0xffff)
			return b
		}(), 1},
		{"props_len past the record", withLen(one, propsLenAt, 1<<20), 1},
		{"props_len negative as i32", withLen(one, propsLenAt, 0x80000000), 1},
		{"record cut short", one[:len(one)-1], 1},
		{"fewer records than n", one, 2},
		{"bytes left after n records", append(bytes.Clone(one), 0), 1},
		{"length prefix cut short", append(bytes.Clone(one), 1, 0), 2},
		{"n negative", one, -1},
	}
}

func TestCPropfilterMalformedInputIsAnErrorCode(t *testing.T) {
	g := cGuest(t, "property", "color", "value", "red")
	for _, tc := range malformedBatches() {
		t.Run(tc.name, func(t *testing.T) {
			_, code, err := g.filterRaw(tc.in, tc.n)
			require.NoError(t, err, "the guest trapped")
			require.Equal(t, int32(errInput), code)
		})
	}
	// The instance is still sound.
	require.Equal(t, []bool{true}, g.filter(t, []record{{props: props("color", "red")}}))
}

func TestCPropfilterRecordLenSkipsAppendedFields(t *testing.T) {
	// Bytes after body within record_len are fields of a later ABI version: skipped.
	g := cGuest(t, "property", "color", "value", "red")
	le := binary.LittleEndian
	var in []byte
	for _, r := range []record{{props: props("color", "red")}, {props: props("color", "blue")}, {props: props("color", "red")}} {
		rec := appendRecord(nil, r)
		rec = append(rec, "future"...)
		le.PutUint32(rec, le.Uint32(rec)+6)
		in = append(in, rec...)
	}
	bm, code, err := g.filterRaw(in, 3)
	require.NoError(t, err)
	require.Zero(t, code)
	require.Equal(t, []bool{true, false, true}, bitsOf(t, bm, 3))
}

func TestCPropfilterOutOfMemoryIsZeroFromAlloc(t *testing.T) {
	spec := cPropfilter(t)
	spec.MemoryLimitPages = 8
	g := borrow(t, loadModule(t, spec))
	p, err := g.call("flowd_alloc", 0)
	require.NoError(t, err)
	require.NotZero(t, uint32(p), "flowd_alloc(0) is not out of memory")
	p, err = g.call("flowd_alloc", 1<<20)
	require.NoError(t, err, "flowd_alloc past the memory limit must return 0, not trap")
	require.Zero(t, uint32(p))
	p, err = g.call("flowd_alloc", 1<<30)
	require.NoError(t, err)
	require.Zero(t, uint32(p))
	p, err = g.call("flowd_alloc", uint64(uint32(0xffffffff))) // -1
	require.NoError(t, err)
	require.Zero(t, uint32(p))
	code, err := g.init(encodeParams("property", "color", "value", "red"))
	require.NoError(t, err)
	require.Zero(t, code)
	require.Equal(t, []bool{true}, g.filter(t, []record{{props: props("color", "red")}}))
}

func TestModulesImportNothingAndExportTheFilterABI(t *testing.T) {
	ctx := context.Background()
	for _, spec := range []runtime.Spec{cPropfilter(t), rustTagfilter(t)} {
		t.Run(spec.Name, func(t *testing.T) {
			wr := wazero.NewRuntime(ctx)
			defer wr.Close(ctx)
			cm, err := wr.CompileModule(ctx, spec.Wasm)
			require.NoError(t, err)
			require.Empty(t, cm.ImportedFunctions(), "a plugin that needs no WASI imports nothing")
			require.Empty(t, cm.ImportedMemories())
			var names []string
			for name := range cm.ExportedFunctions() {
				names = append(names, name)
			}
			slices.Sort(names)
			require.Equal(t, []string{"flowd_abi_version", "flowd_alloc", "flowd_filter", "flowd_init"}, names)
			require.Contains(t, cm.ExportedMemories(), "memory")

			// The host refuses a module that speaks another ABI version.
			rt, err := runtime.New(ctx, runtime.Options{})
			require.NoError(t, err)
			defer rt.Close(ctx)
			spec.ABI.Version = 2
			_, err = rt.Load(ctx, spec)
			require.ErrorIs(t, err, runtime.ErrABIVersion)
		})
	}
}

func TestCPropfilterRebuildsIdentically(t *testing.T) {
	requireReadmeHas(t, cDir, "clang", cBuild)
	rebuild(t, cDir, "clang", cBuild, "propfilter.wasm")
}

// ---- Rust: rust-filter ----

const (
	rustDir = "rust-filter"
	// rustc is Debian's rustc: a rustup one earlier on PATH has no wasm32 target.
	rustc = "/usr/bin/rustc"
)

// rustBuild is the build command of rust-filter/README.md, run in rust-filter/.
var rustBuild = []string{"--target", "wasm32-unknown-unknown", "--crate-type", "cdylib", "-O", "-C", "panic=abort",
	"-C", "strip=symbols", "-C", "lto", "-C", "codegen-units=1", "-o", "tagfilter.wasm", "lib.rs"}

func rustTagfilter(t testing.TB) runtime.Spec {
	return filterSpec("rust-filter", readWasm(t, filepath.Join(rustDir, "tagfilter.wasm")))
}

func rustGuest(t testing.TB, tags string) *guest {
	t.Helper()
	g := borrow(t, loadModule(t, rustTagfilter(t)))
	code, err := g.init(encodeParams("tags", tags))
	require.NoError(t, err)
	require.Zero(t, code, "flowd_init")
	return g
}

func TestRustFilterKeepsListedTags(t *testing.T) {
	g := rustGuest(t, " TagA ||TagB||  || Tag C")
	rs := []record{
		{tags: "TagA"},   // keep
		{tags: "TagB"},   // keep
		{tags: "TagC"},   // not listed
		{tags: "Tag C"},  // keep: inner spaces are part of the tag
		{tags: ""},       // no tag
		{tags: "TagAB"},  // the listed tag is a prefix
		{tags: "Tag"},    // a prefix of a listed tag
		{tags: "taga"},   // tags are case-sensitive
		{tags: " TagA"},  // the message's tag is not trimmed
		{tags: "TagA||"}, // not a list on the message side
		{props: props("TAGS", "TagA")},
		{tags: "TagB", topic: "t", keys: "k1 k2", body: "b"}, // keep
	}
	want := []bool{true, true, false, true, false, false, false, false, false, false, false, true}
	require.Equal(t, want, g.filter(t, rs))

	big := make([]record, 1000)
	for i := range big {
		big[i].tags = []string{"TagA", "TagX", "TagB"}[i%3]
		big[i].props = props("pad", strings.Repeat("x", i))
	}
	for i, k := range g.filter(t, big) {
		require.Equal(t, i%3 != 1, k, "message %d", i)
	}
}

func TestRustFilterStarKeepsEverything(t *testing.T) {
	g := rustGuest(t, "TagA || *")
	require.Equal(t, []bool{true, true, true}, g.filter(t, []record{{tags: "TagA"}, {tags: "x"}, {}}))
}

func TestRustFilterParameters(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params []byte
		code   int32
	}{
		{"no parameters", encodeParams(), errParams},
		{"empty list", encodeParams("tags", ""), errParams},
		{"only separators", encodeParams("tags", " || || "), errParams},
		{"other parameters", encodeParams("tag", "TagA"), errParams},
		{"truncated", encodeParams("tags", "TagA")[:8], errInput},
		{"bytes left over", append(encodeParams("tags", "TagA"), 0), errInput},
		{"one tag", encodeParams("tags", "TagA"), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := borrow(t, loadModule(t, rustTagfilter(t)))
			code, err := g.init(tc.params)
			require.NoError(t, err)
			require.Equal(t, tc.code, code)
		})
	}
}

func TestRustFilterWithoutInitRefusesToFilter(t *testing.T) {
	g := borrow(t, loadModule(t, rustTagfilter(t)))
	_, code, err := g.filterRaw(encodeRecords([]record{{tags: "TagA"}}), 1)
	require.NoError(t, err)
	require.Equal(t, int32(errParams), code)
}

func TestRustFilterMalformedInputIsAnErrorCode(t *testing.T) {
	g := rustGuest(t, "*")
	for _, tc := range malformedBatches() {
		t.Run(tc.name, func(t *testing.T) {
			_, code, err := g.filterRaw(tc.in, tc.n)
			require.NoError(t, err, "the guest trapped")
			require.Equal(t, int32(errInput), code)
		})
	}
	require.Equal(t, []bool{true}, g.filter(t, []record{{tags: "x"}}))
}

func TestRustFilterOutOfMemoryIsZeroFromAlloc(t *testing.T) {
	spec := rustTagfilter(t)
	spec.MemoryLimitPages = 24
	g := borrow(t, loadModule(t, spec))
	p, err := g.call("flowd_alloc", 0)
	require.NoError(t, err)
	require.NotZero(t, uint32(p), "flowd_alloc(0) is not out of memory")
	for _, size := range []uint64{4 << 20, 1 << 30, uint64(uint32(0xffffffff))} {
		p, err := g.call("flowd_alloc", size)
		require.NoError(t, err, "flowd_alloc past the memory limit must return 0, not trap")
		require.Zero(t, uint32(p), "flowd_alloc(%d)", size)
	}
	code, err := g.init(encodeParams("tags", "TagA"))
	require.NoError(t, err)
	require.Zero(t, code)
	require.Equal(t, []bool{true, false}, g.filter(t, []record{{tags: "TagA"}, {tags: "TagB"}}))
}

func TestRustFilterRebuildsIdentically(t *testing.T) {
	requireReadmeHas(t, rustDir, rustc, rustBuild)
	rebuild(t, rustDir, rustc, rustBuild, "tagfilter.wasm")
}

// ---- benchmarks: the guests through the runtime, next to the same filters in plain Go ----

// benchRecords are n messages as a broker stores them: a topic, a tag, keys and RocketMQ's
// usual properties; every other one has color=red and tag TagA.
func benchRecords(n int) []record {
	rs := make([]record, n)
	for i := range rs {
		color, tag := "blue", "TagB"
		if i%2 == 0 {
			color, tag = "red", "TagA"
		}
		rs[i] = record{queueID: 3, queueOffset: int64(i), storeTimeMs: 1700000000000, topic: "orders", tags: tag,
			keys: "order-42 customer-7",
			props: props("KEYS", "order-42 customer-7", "TAGS", tag, "UNIQ_KEY", "7F0000010001B4AAC2E5364B4B7A0000",
				"WAIT", "true", "color", color)}
	}
	return rs
}

var benchBatches = []int{1, 32, 256}

// benchGuest measures one filter call per batch through runtime.Instance.Call, including
// the copy of the batch into guest memory and the read of the bitmap, as the host does.
func benchGuest(b *testing.B, spec runtime.Spec, params []byte) {
	for _, n := range benchBatches {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			in := encodeRecords(benchRecords(n))
			g := borrow(b, loadModule(b, spec))
			code, err := g.init(params)
			require.NoError(b, err)
			require.Zero(b, code)
			ptr, err := g.input(in)
			require.NoError(b, err)
			ctx := context.Background()
			fn := g.inst.Function("flowd_filter")
			mem := g.inst.Memory()
			stack := make([]uint64, 3)
			size := uint32(n+7) / 8
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			for b.Loop() {
				if !mem.Write(ptr, in) {
					b.Fatal("write out of range")
				}
				stack[0], stack[1], stack[2] = uint64(ptr), uint64(len(in)), uint64(n)
				if err := g.inst.Call(ctx, fn, stack); err != nil {
					b.Fatal(err)
				}
				bm, ok := mem.Read(uint32(stack[0]), size)
				if !ok || int32(stack[0]) < 0 || bm[0]&1 != 1 {
					b.Fatalf("filter returned %d", int32(stack[0]))
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/msg")
		})
	}
}

// benchGo measures filter, a plain Go function over the same encoded batch.
func benchGo(b *testing.B, filter func(in []byte, n int, bitmap []byte) error) {
	for _, n := range benchBatches {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			in := encodeRecords(benchRecords(n))
			bitmap := make([]byte, (n+7)/8)
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			for b.Loop() {
				if err := filter(in, n, bitmap); err != nil {
					b.Fatal(err)
				}
				if bitmap[0]&1 != 1 {
					b.Fatal("message 0 dropped")
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/msg")
		})
	}
}

var errMalformed = errors.New("malformed batch")

// goRecords decodes the batch as the guests do, calling each with tags and props.
func goRecords(in []byte, n int, each func(i int, tags, props []byte)) error {
	le := binary.LittleEndian
	for i := range n {
		if len(in) < 4 {
			return errMalformed
		}
		rlen := int(le.Uint32(in))
		if rlen > len(in)-4 || rlen < 20 {
			return errMalformed
		}
		r := in[4+20 : 4+rlen]
		in = in[4+rlen:]
		var fields [5][]byte
		for f := range fields {
			w := 2
			if f >= 3 {
				w = 4
			}
			if len(r) < w {
				return errMalformed
			}
			var l int
			if w == 2 {
				l = int(le.Uint16(r))
			} else {
				l = int(le.Uint32(r))
			}
			if l > len(r)-w {
				return errMalformed
			}
			fields[f] = r[w : w+l]
			r = r[w+l:]
		}
		each(i, fields[1], fields[3])
	}
	if len(in) != 0 {
		return errMalformed
	}
	return nil
}

// goProp is RocketMQ's property lookup in Go.
func goProp(props, key []byte) ([]byte, bool) {
	for len(props) > 0 {
		k, rest, ok := bytes.Cut(props, []byte{1})
		if !ok {
			return nil, false
		}
		v, next, _ := bytes.Cut(rest, []byte{2})
		if bytes.Equal(k, key) {
			return v, true
		}
		props = next
	}
	return nil, false
}

func goPropfilter(property, value string) func([]byte, int, []byte) error {
	p, v := []byte(property), []byte(value)
	return func(in []byte, n int, bitmap []byte) error {
		clear(bitmap)
		return goRecords(in, n, func(i int, _, props []byte) {
			if got, ok := goProp(props, p); ok && bytes.Equal(got, v) {
				bitmap[i/8] |= 1 << (i % 8)
			}
		})
	}
}

func goTagfilter(tags ...string) func([]byte, int, []byte) error {
	list := make([][]byte, len(tags))
	for i, t := range tags {
		list[i] = []byte(t)
	}
	return func(in []byte, n int, bitmap []byte) error {
		clear(bitmap)
		return goRecords(in, n, func(i int, tag, _ []byte) {
			for _, t := range list {
				if len(tag) > 0 && bytes.Equal(tag, t) {
					bitmap[i/8] |= 1 << (i % 8)
					return
				}
			}
		})
	}
}

func TestGoEquivalentsAgreeWithTheGuests(t *testing.T) {
	// The benchmarks compare like with like only if the Go filters decide as the guests do.
	rs := benchRecords(40)
	rs = append(rs, record{props: "color\x01red"}, record{tags: "TagA", props: props("color", "re")})
	in := encodeRecords(rs)
	for _, tc := range []struct {
		name  string
		guest *guest
		goF   func([]byte, int, []byte) error
	}{
		{"c-propfilter", cGuest(t, "property", "color", "value", "red"), goPropfilter("color", "red")},
		{"rust-filter", rustGuest(t, "TagA || TagC"), goTagfilter("TagA", "TagC")},
	} {
		want := make([]byte, (len(rs)+7)/8)
		require.NoError(t, tc.goF(in, len(rs), want))
		got, code, err := tc.guest.filterRaw(in, int32(len(rs)))
		require.NoError(t, err)
		require.Zero(t, code)
		require.Equal(t, want, got, tc.name)
		require.Equal(t, errMalformed, tc.goF(in[:len(in)-1], len(rs), want), tc.name)
	}
}

// BenchmarkPropfilter: c-propfilter through the runtime and the same filter in Go, per
// message at batch sizes 1, 32 and 256 (the ns/msg metric).
func BenchmarkPropfilter(b *testing.B) {
	b.Run("c", func(b *testing.B) {
		benchGuest(b, cPropfilter(b), encodeParams("property", "color", "value", "red"))
	})
	b.Run("go", func(b *testing.B) { benchGo(b, goPropfilter("color", "red")) })
}

// BenchmarkTagfilter: rust-filter through the runtime and the same filter in Go.
func BenchmarkTagfilter(b *testing.B) {
	b.Run("rust", func(b *testing.B) {
		benchGuest(b, rustTagfilter(b), encodeParams("tags", "TagA || TagC"))
	})
	b.Run("go", func(b *testing.B) { benchGo(b, goTagfilter("TagA", "TagC")) })
}

// ---- the SDKs' transform support, through guests built for the test ----

// transformC and transformRust are the same transform written with each SDK: for each
// message in, none out if its tag is "drop" or its property "drop" is "yes", two if its tag
// is "twice", else one; a message out
// has the topic as its tag and the keys, properties and body of the message in.
const transformC = `#include "flowd.h"
FLOWD_GUEST()
static flowd_out out;
FLOWD_EXPORT("flowd_transform") flowd_i64 flowd_transform(flowd_i32 ptr, flowd_i32 len, flowd_i32 n) {
  flowd_records in;
  if (flowd_records_init(&in, ptr, len, n)) return FLOWD_ERR_INPUT;
  flowd_out_reset(&out);
  flowd_record r;
  int rc;
  while ((rc = flowd_records_next(&in, &r)) == 1) {
    if ((rc = flowd_out_begin(&out))) return rc;
    flowd_str drop;
    if (flowd_str_eqz(r.tags, "drop")) continue;
    if (flowd_props_get(r.props, (flowd_str){(const flowd_u8 *)"drop", 4}, &drop) && flowd_str_eqz(drop, "yes")) continue;
    int copies = flowd_str_eqz(r.tags, "twice") ? 2 : 1;
    for (int i = 0; i < copies; i++) {
      if ((rc = flowd_out_message(&out, r.topic, r.keys, r.props, r.body))) return rc;
    }
  }
  if (rc < 0) return rc;
  return flowd_pack(out.buf.ptr, out.len);
}
`

const transformRust = `#![no_std]
#[allow(unused_attributes, dead_code)]
#[path = "SDK"]
mod flowd;

static mut OUT: flowd::Out = flowd::Out::new();

#[no_mangle]
pub extern "C" fn flowd_transform(ptr: i32, len: i32, n: i32) -> i64 {
    unsafe {
        flowd::transform(&mut OUT, ptr, len, n, |rec, out| {
            let copies = match rec.tags {
                _ if flowd::prop(rec.props, b"drop") == Some(b"yes") => 0,
                b"drop" => 0,
                b"twice" => 2,
                _ => 1,
            };
            for _ in 0..copies {
                out.message(rec.topic, rec.keys, rec.props, rec.body)?;
            }
            Ok(())
        })
    }
}
`

// outMessage is one message of a transform's output.
type outMessage struct{ tags, keys, props, body string }

// decodeTransform decodes a transform's output for n messages in, requiring it to be
// exactly the bytes given, as the host does.
func decodeTransform(t *testing.T, b []byte, n int) [][]outMessage {
	t.Helper()
	le := binary.LittleEndian
	take := func(w int) string {
		require.GreaterOrEqual(t, len(b), w, "output ends early")
		var l int
		if w == 2 {
			l = int(le.Uint16(b))
		} else {
			l = int(le.Uint32(b))
		}
		require.GreaterOrEqual(t, len(b)-w, l, "output ends early")
		s := string(b[w : w+l])
		b = b[w+l:]
		return s
	}
	res := make([][]outMessage, n)
	for i := range n {
		require.GreaterOrEqual(t, len(b), 4, "output ends early")
		count := int(le.Uint32(b))
		b = b[4:]
		res[i] = []outMessage{}
		for range count {
			m := outMessage{tags: take(2), keys: take(2), props: take(4), body: take(4)}
			res[i] = append(res[i], m)
		}
	}
	require.Empty(t, b, "bytes left over in the output")
	return res
}

func TestSDKTransform(t *testing.T) {
	for _, lang := range []string{"c", "rust"} {
		t.Run(lang, func(t *testing.T) {
			wasm := buildGuest(t, lang, transformC, transformRust)
			m := loadModule(t, runtime.Spec{
				Name: lang + "-transform", Wasm: wasm, MaxInstances: 1,
				ABI: runtime.ABI{Export: "flowd_abi_version", Version: 1},
				Exports: []runtime.Export{
					{Name: "flowd_alloc", Params: []api.ValueType{i32}, Results: []api.ValueType{i32}},
					{Name: "flowd_transform", Params: []api.ValueType{i32, i32, i32}, Results: []api.ValueType{i64}},
				},
			})
			g := borrow(t, m)
			transform := func(in []byte, n int) ([]byte, int64) {
				p, err := g.input(in)
				require.NoError(t, err)
				r, err := g.call("flowd_transform", uint64(p), uint64(len(in)), uint64(n))
				require.NoError(t, err, "the guest trapped")
				if int64(r) < 0 {
					return nil, int64(r)
				}
				out, ok := g.inst.Memory().Read(uint32(r>>32), uint32(r))
				require.True(t, ok, "output outside guest memory")
				return bytes.Clone(out), 0
			}
			// Growing batches: the input buffer is carved again past the output, so the
			// output buffer must move, keeping what it holds.
			for _, size := range []int{0, 10, 1000, 100000, 300000} {
				rs := []record{
					{topic: "s", tags: "small", body: "first"}, // written before the buffer moves
					{topic: "a", tags: "keep", keys: "k1 k2", props: props("x", "1"), body: strings.Repeat("b", size)},
					{topic: "b", tags: "drop", body: "gone"},
					{topic: "c", tags: "twice", body: strings.Repeat("c", size/2)},
					{topic: "", tags: ""},
					{topic: "p", props: props("a-long-property-name", strings.Repeat("v", 20), "drop", "yes")},
					{topic: "q", props: props("drop", "no", "x", "y")},
				}
				out, code := transform(encodeRecords(rs), len(rs))
				require.Zero(t, code)
				got := decodeTransform(t, out, len(rs))
				want := [][]outMessage{
					{{tags: "s", body: "first"}},
					{{tags: "a", keys: "k1 k2", props: props("x", "1"), body: strings.Repeat("b", size)}},
					{},
					{{tags: "c", body: strings.Repeat("c", size/2)}, {tags: "c", body: strings.Repeat("c", size/2)}},
					{{}},
					{},
					{{tags: "q", props: props("drop", "no", "x", "y")}},
				}
				require.Equal(t, want, got, "body size %d", size)
			}
			out, code := transform(nil, 0)
			require.Zero(t, code)
			require.Empty(t, out)
			for _, tc := range malformedBatches() {
				_, code := transform(tc.in, int(tc.n))
				require.Equal(t, int64(errInput), code, tc.name)
			}
		})
	}
}

// ---- the SDKs' allocator support, through guests built for the test ----

// allocateC and allocateRust are the same allocator written with each SDK. Members labelled
// role=standby get no queue. A queue goes to the first member whose room is the queue's
// broker, else to its previous owner, else to the members in turn; with no member to take
// a queue, the guest returns FLOWD_ERR_UNSUPPORTED.
const allocateC = `#include "flowd.h"
FLOWD_GUEST()
static flowd_buf out;
static int standby(const flowd_member *m) {
  flowd_str v;
  return flowd_member_label(m, (flowd_str){(const flowd_u8 *)"role", 4}, &v) && flowd_str_eqz(v, "standby");
}
static void member_at(const flowd_assign_input *in, flowd_u32 i, flowd_member *m) {
  const flowd_u8 *c = in->members;
  for (flowd_u32 j = 0; j <= i; j++) flowd_member_next(&c, m);
}
FLOWD_EXPORT("flowd_allocate") flowd_i64 flowd_allocate(flowd_i32 ptr, flowd_i32 len) {
  flowd_assign_input in;
  int rc = flowd_assign_decode(ptr, len, &in);
  if (rc) return rc;
  if (flowd_buf_reserve(&out, in.nq * 4u + 1u)) return FLOWD_ERR_NOMEM;
  flowd_u32 next = 0;
  const flowd_u8 *qc = in.queues;
  for (flowd_u32 k = 0; k < in.nq; k++) {
    flowd_queue q;
    flowd_member m;
    flowd_queue_next(&qc, &q);
    flowd_i32 owner = -1;
    const flowd_u8 *mc = in.members;
    for (flowd_u32 i = 0; i < in.nm && owner < 0; i++) {
      flowd_member_next(&mc, &m);
      if (!standby(&m) && m.room.len > 0 && flowd_str_eq(m.room, q.broker)) owner = (flowd_i32)i;
    }
    flowd_i32 prev = flowd_assign_previous(&in, k);
    if (owner < 0 && prev >= 0 && (flowd_u32)prev < in.nm) {
      member_at(&in, (flowd_u32)prev, &m);
      if (!standby(&m)) owner = prev;
    }
    for (flowd_u32 tries = 0; owner < 0 && tries < in.nm; tries++) {
      flowd_u32 i = next++ % in.nm;
      member_at(&in, i, &m);
      if (!standby(&m)) owner = (flowd_i32)i;
    }
    if (owner < 0) return FLOWD_ERR_UNSUPPORTED;
    flowd_put_u32le(out.ptr + 4u * k, (flowd_u32)owner);
  }
  return flowd_pack(out.ptr, in.nq * 4u);
}
`

const allocateRust = `#![no_std]
#[allow(unused_attributes, dead_code)]
#[path = "SDK"]
mod flowd;

use flowd::{Assignment, Error, Member};

static mut OUT: flowd::Buf = flowd::Buf::new();

fn standby(m: &Member) -> bool {
    m.label(b"role") == Some(b"standby")
}

fn assign(a: &Assignment, owners: &mut [i32]) -> Result<(), Error> {
    let nm = a.nm as usize;
    let mut next = 0usize;
    for (k, q) in a.queues().enumerate() {
        let mut owner = a.members().position(|m| !standby(&m) && !m.room.is_empty() && m.room == q.broker);
        let prev = a.previous(k);
        if owner.is_none() && prev >= 0 && (prev as usize) < nm && !standby(&a.members().nth(prev as usize).unwrap()) {
            owner = Some(prev as usize);
        }
        let mut tries = 0;
        while owner.is_none() && tries < nm {
            let i = next % nm;
            next += 1;
            tries += 1;
            if !standby(&a.members().nth(i).unwrap()) {
                owner = Some(i);
            }
        }
        owners[k] = owner.ok_or(Error::Unsupported)? as i32;
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn flowd_allocate(ptr: i32, len: i32) -> i64 {
    unsafe { flowd::allocate(&mut OUT, ptr, len, assign) }
}
`

type queue struct {
	topic, broker string
	id            int32
}

type member struct {
	id     string
	weight uint32
	room   string
	labels []string // key, value, ...
}

// encodeAssignment encodes flowd_allocate's input.
func encodeAssignment(group string, qs []queue, ms []member, previous []int32) []byte {
	le := binary.LittleEndian
	str16 := func(b []byte, s string) []byte { return append(le.AppendUint16(b, uint16(len(s))), s...) }
	b := str16(nil, group)
	b = le.AppendUint32(b, uint32(len(qs)))
	for _, q := range qs {
		b = str16(b, q.topic)
		b = str16(b, q.broker)
		b = le.AppendUint32(b, uint32(q.id))
	}
	b = le.AppendUint32(b, uint32(len(ms)))
	for _, m := range ms {
		b = str16(b, m.id)
		b = le.AppendUint32(b, m.weight)
		b = str16(b, m.room)
		b = le.AppendUint32(b, uint32(len(m.labels)/2))
		for _, l := range m.labels {
			b = str16(b, l)
		}
	}
	b = le.AppendUint32(b, uint32(len(previous)))
	for _, p := range previous {
		b = le.AppendUint32(b, uint32(p))
	}
	return b
}

// buildGuest builds a guest from C or Rust source against the SDKs into a temporary
// directory, or skips when the compiler is missing.
func buildGuest(t *testing.T, lang, cSource, rustSource string) []byte {
	t.Helper()
	dir := t.TempDir()
	sdk, err := filepath.Abs(filepath.Join("..", "..", "plugins", "sdk"))
	require.NoError(t, err)
	out := filepath.Join(dir, "guest.wasm")
	var cmd *exec.Cmd
	switch lang {
	case "c":
		if _, err := exec.LookPath("clang"); err != nil {
			t.Skip("clang is not installed: the C SDK is not tested beyond c-propfilter")
		}
		src := filepath.Join(dir, "guest.c")
		require.NoError(t, os.WriteFile(src, []byte(cSource), 0o644))
		cmd = exec.Command("clang", "--target=wasm32", "-nostdlib", "-O2", "-mbulk-memory", "-I", filepath.Join(sdk, "c"),
			"-Wl,--no-entry", "-Wl,--strip-all", "-o", out, src)
	case "rust":
		if _, err := os.Stat("/usr/lib/rustlib/wasm32-unknown-unknown"); err != nil {
			t.Skip("Debian's rustc with libstd-rust-dev-wasm32 is not installed: the Rust SDK is not tested beyond rust-filter")
		}
		src := filepath.Join(dir, "lib.rs")
		code := strings.Replace(rustSource, "SDK", filepath.Join(sdk, "rust", "src", "lib.rs"), 1)
		require.NoError(t, os.WriteFile(src, []byte(code), 0o644))
		cmd = exec.Command(rustc, "--target", "wasm32-unknown-unknown", "--crate-type", "cdylib", "-O", "-C", "panic=abort",
			"-C", "strip=symbols", "-C", "lto", "-o", out, src)
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the %s guest: %v\n%s", lang, err, b)
	}
	return readWasm(t, out)
}

func TestSDKAllocate(t *testing.T) {
	ms := []member{
		{id: "a", weight: 1, room: "r1"},
		{id: "b", weight: 1, labels: []string{"role", "standby", "zone", "z1"}},
		{id: "c", weight: 2, labels: []string{"role", "active"}},
	}
	qs := []queue{{"t", "r1", 0}, {"t", "x", 1}, {"t", "x", 2}, {"t", "x", 3}, {"u", "x", 0}}
	for _, lang := range []string{"c", "rust"} {
		t.Run(lang, func(t *testing.T) {
			m := loadModule(t, runtime.Spec{
				Name: lang + "-allocator", Wasm: buildGuest(t, lang, allocateC, allocateRust), MaxInstances: 1,
				ABI: runtime.ABI{Export: "flowd_abi_version", Version: 1},
				Exports: []runtime.Export{
					{Name: "flowd_alloc", Params: []api.ValueType{i32}, Results: []api.ValueType{i32}},
					{Name: "flowd_allocate", Params: []api.ValueType{i32, i32}, Results: []api.ValueType{i64}},
				},
			})
			g := borrow(t, m)
			allocate := func(in []byte) ([]int32, int64) {
				p, err := g.input(in)
				require.NoError(t, err)
				r, err := g.call("flowd_allocate", uint64(p), uint64(len(in)))
				require.NoError(t, err, "the guest trapped")
				if int64(r) < 0 {
					return nil, int64(r)
				}
				out, ok := g.inst.Memory().Read(uint32(r>>32), uint32(r))
				require.True(t, ok, "output outside guest memory")
				require.Zero(t, len(out)%4)
				owners := make([]int32, len(out)/4)
				for k := range owners {
					owners[k] = int32(binary.LittleEndian.Uint32(out[4*k:]))
				}
				return owners, 0
			}
			for _, tc := range []struct {
				name   string
				in     []byte
				owners []int32
				code   int64
			}{
				// q0 by room; q1 its previous owner; q2's previous owner is standby, q3 has
				// none and q4's is out of range: in turn, skipping the standby member.
				{name: "with a previous assignment", in: encodeAssignment("g", qs, ms, []int32{-1, 2, 1, -1, 5}), owners: []int32{0, 2, 0, 2, 0}},
				{name: "without", in: encodeAssignment("g", qs, ms, nil), owners: []int32{0, 0, 2, 0, 2}},
				{name: "no queues", in: encodeAssignment("g", nil, ms, nil), owners: []int32{}},
				{name: "no members", in: encodeAssignment("g", qs, nil, nil), code: -5},
				{name: "only standby members", in: encodeAssignment("g", qs, ms[1:2], nil), code: -5},
				{name: "previous of another length", in: encodeAssignment("g", qs, ms, []int32{0}), code: errInput},
				{name: "truncated", in: encodeAssignment("g", qs, ms, nil)[:30], code: errInput},
				{name: "bytes left over", in: append(encodeAssignment("g", qs, ms, nil), 0), code: errInput},
				{name: "label past the input", in: func() []byte {
					b := encodeAssignment("g", nil, ms[1:2], nil)
					return b[:len(b)-6]
				}(), code: errInput},
				{name: "empty", in: nil, code: errInput},
			} {
				owners, code := allocate(tc.in)
				require.Equal(t, tc.code, code, tc.name)
				if tc.code == 0 {
					require.Equal(t, tc.owners, owners, tc.name)
				}
			}
		})
	}
}

// TestRustSDKAsCrate builds the Rust SDK as the crate flowd (edition 2021, warnings denied)
// and a guest that uses it through --extern, as a Cargo build would, and runs the guest.
func TestRustSDKAsCrate(t *testing.T) {
	if _, err := os.Stat("/usr/lib/rustlib/wasm32-unknown-unknown"); err != nil {
		t.Skip("Debian's rustc with libstd-rust-dev-wasm32 is not installed: the Rust SDK is not built as a crate")
	}
	dir := t.TempDir()
	sdk, err := filepath.Abs(filepath.Join("..", "..", "plugins", "sdk", "rust", "src", "lib.rs"))
	require.NoError(t, err)
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command(rustc, append([]string{"--edition", "2021", "--target", "wasm32-unknown-unknown", "-O", "-C", "panic=abort"}, args...)...)
		cmd.Dir = dir
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("rustc %v: %v\n%s", args, err, b)
		}
	}
	run("--crate-type", "rlib", "--crate-name", "flowd", "-D", "warnings", "-o", "libflowd.rlib", sdk)
	guest := `#![no_std]
#[no_mangle]
pub extern "C" fn flowd_filter(ptr: i32, len: i32, n: i32) -> i32 {
    static mut BITMAP: flowd::Bitmap = flowd::Bitmap::new();
    unsafe {
        flowd::filter(&mut *core::ptr::addr_of_mut!(BITMAP), ptr, len, n, |rec| {
            Ok(flowd::prop(rec.props, b"k").is_some() || flowd::keys(rec.keys).any(|k| k == b"want"))
        })
    }
}
`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "guest.rs"), []byte(guest), 0o644))
	run("--crate-type", "cdylib", "-C", "lto", "--extern", "flowd=libflowd.rlib", "-o", "guest.wasm", "guest.rs")

	spec := filterSpec("rust-crate", readWasm(t, filepath.Join(dir, "guest.wasm")))
	spec.Exports = slices.DeleteFunc(spec.Exports, func(e runtime.Export) bool { return e.Name == "flowd_init" })
	g := borrow(t, loadModule(t, spec))
	require.Equal(t, []bool{true, false, true, false, true},
		g.filter(t, []record{
			{props: props("a", "1", "k", "")},
			{props: props("kk", "1")},
			{keys: "x want y"},
			{keys: "wanted"},
			{keys: "want"},
		}))
}
