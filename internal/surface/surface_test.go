package surface_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// listed is the part of `go list -json` the check reads.
type listed struct {
	ImportPath string
	Name       string
	Export     string
	GoFiles    []string
	Module     *struct{ Path string }
}

// goList runs `go list -json` with args in the module's root and decodes its stream.
func goList(t *testing.T, args ...string) []listed {
	t.Helper()
	root := moduleRoot(t)
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v\n%s", args, err, stderr.String())
	}
	var pkgs []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		t.Fatal("not inside a module")
	}
	return filepath.Dir(gomod)
}

// publicPackages are the module's importable packages outside internal/: every library
// package, so that a new one is checked without being listed here.
func publicPackages(t *testing.T) (module string, paths []string) {
	t.Helper()
	for _, p := range goList(t, "./...") {
		if p.Module != nil {
			module = p.Module.Path
		}
		if p.Name == "main" || len(p.GoFiles) == 0 || isInternal(p.ImportPath) {
			continue
		}
		paths = append(paths, p.ImportPath)
	}
	if len(paths) == 0 {
		t.Fatal("go list found no public package")
	}
	return module, paths
}

func isInternal(path string) bool {
	return strings.Contains("/"+path+"/", "/internal/")
}

// decided is the public surface RATIONALE.md ("Public surface") writes down: the packages a
// user may import, relative to the module. Everything else is under internal/ (or is a
// command, a test or an example).
var decided = []string{
	"broker",
	"broker/filter",
	"broker/store",
	"broker/store/vfs",
	"client",
	"cluster",
	"config",
	"consumer",
	"consumer/allocate",
	"consumer/pop",
	"control",
	"fields",
	"metrics",
	"pipeline",
	"pipeline/definition",
	"plugins",
	"plugins/wasmfilter",
	"producer",
	"protocol",
	"runtime",
}

// A package that is importable but not decided public is implementation a user could come
// to depend on: it belongs under internal/, or in RATIONALE.md and this list.
func TestPublicPackagesAreTheDecidedOnes(t *testing.T) {
	module, pkgs := load(t)
	var got []string
	for _, p := range pkgs {
		if !exportsAnything(p) {
			continue // a package's documentation alone (e2e's): nothing to depend on
		}
		got = append(got, strings.TrimPrefix(p.Path(), module+"/"))
	}
	slices.Sort(got)
	if !slices.Equal(got, decided) {
		t.Errorf("public packages\n  %s\nwant (RATIONALE.md, Public surface)\n  %s", strings.Join(got, "\n  "), strings.Join(decided, "\n  "))
	}
}

func exportsAnything(p *types.Package) bool {
	for _, name := range p.Scope().Names() {
		if token.IsExported(name) {
			return true
		}
	}
	return false
}

// load imports the public packages from their compiled export data.
func load(t *testing.T) (module string, pkgs []*types.Package) {
	t.Helper()
	module, public := publicPackages(t)
	exports := map[string]string{}
	for _, p := range goList(t, append([]string{"-export", "-deps"}, public...)...) {
		exports[p.ImportPath] = p.Export
	}
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %q", path)
		}
		return os.Open(f)
	})
	for _, path := range public {
		pkg, err := imp.Import(path)
		if err != nil {
			t.Fatalf("import %s: %v", path, err)
		}
		pkgs = append(pkgs, pkg)
	}
	return module, pkgs
}

// TestPublicAPIMentionsNoInternalType walks every exported name of the public packages:
// functions' parameters and results, variables', constants' and aliases' types, exported
// fields and embedded types of structs, and the exported methods of each type's method set
// (promoted ones included). A type declared in an internal package of this module reachable
// that way is a failure: users can call into it but not name it, and the package behind it
// stops being free to change.
func TestPublicAPIMentionsNoInternalType(t *testing.T) {
	module, pkgs := load(t)
	var found []string
	for _, pkg := range pkgs {
		c := checker{module: module, seen: map[types.Type]bool{}}
		c.pkg(pkg)
		found = append(found, c.found...)
	}
	if len(found) > 0 {
		t.Errorf("exported identifiers mention internal types:\n  %s", strings.Join(found, "\n  "))
	}
}

// TestCheckerFindsInternalTypes keeps the walk honest: on a package written to expose an
// internal type in every way the walk covers, it must report each of them.
func TestCheckerFindsInternalTypes(t *testing.T) {
	internal := types.NewPackage("example.com/m/internal/core", "core")
	secret := types.NewNamed(types.NewTypeName(token.NoPos, internal, "Secret", nil), types.NewStruct(nil, nil), nil)
	pub := types.NewPackage("example.com/m/pub", "pub")
	scope := pub.Scope()
	param := types.NewVar(token.NoPos, pub, "s", types.NewPointer(secret))
	scope.Insert(types.NewFunc(token.NoPos, pub, "Take", types.NewSignatureType(nil, nil, nil, types.NewTuple(param), nil, false)))
	scope.Insert(types.NewTypeName(token.NoPos, pub, "Alias", secret))
	scope.Insert(types.NewVar(token.NoPos, pub, "V", types.NewSlice(secret)))
	field := types.NewField(token.NoPos, pub, "F", types.NewMap(types.Typ[types.String], secret), false)
	hidden := types.NewField(token.NoPos, pub, "f", secret, false) // unexported: not surface
	holder := types.NewNamed(types.NewTypeName(token.NoPos, pub, "Holder", nil), types.NewStruct([]*types.Var{field, hidden}, nil), nil)
	scope.Insert(holder.Obj())
	res := types.NewVar(token.NoPos, pub, "", secret)
	holder.AddMethod(types.NewFunc(token.NoPos, pub, "Get", types.NewSignatureType(types.NewVar(token.NoPos, pub, "h", holder), nil, nil, nil, types.NewTuple(res), false)))
	holder.AddMethod(types.NewFunc(token.NoPos, pub, "get", types.NewSignatureType(types.NewVar(token.NoPos, pub, "h", holder), nil, nil, nil, types.NewTuple(res), false)))

	// An unexported embedded field hides the field, not the methods it promotes.
	box := types.NewNamed(types.NewTypeName(token.NoPos, internal, "Box", nil), types.NewStruct(nil, nil), nil)
	box.AddMethod(types.NewFunc(token.NoPos, internal, "Peek", types.NewSignatureType(types.NewVar(token.NoPos, internal, "b", box), nil, nil, nil, types.NewTuple(res), false)))
	box.AddMethod(types.NewFunc(token.NoPos, internal, "peek", types.NewSignatureType(types.NewVar(token.NoPos, internal, "b", box), nil, nil, nil, types.NewTuple(res), false)))
	embedded := types.NewField(token.NoPos, pub, "box", box, true)
	wrapper := types.NewNamed(types.NewTypeName(token.NoPos, pub, "Wrapper", nil), types.NewStruct([]*types.Var{embedded}, nil), nil)
	scope.Insert(wrapper.Obj())

	c := checker{module: "example.com/m", seen: map[types.Type]bool{}}
	c.pkg(pub)
	slices.Sort(c.found)
	want := []string{
		"example.com/m/pub.Alias: example.com/m/internal/core.Secret",
		"example.com/m/pub.Holder.F: example.com/m/internal/core.Secret",
		"example.com/m/pub.Holder.Get: example.com/m/internal/core.Secret",
		"example.com/m/pub.Take: example.com/m/internal/core.Secret",
		"example.com/m/pub.V: example.com/m/internal/core.Secret",
		"example.com/m/pub.Wrapper.Peek: example.com/m/internal/core.Secret",
	}
	if !slices.Equal(c.found, want) {
		t.Errorf("found\n  %s\nwant\n  %s", strings.Join(c.found, "\n  "), strings.Join(want, "\n  "))
	}
}

// checker walks the exported surface of packages, collecting the internal types it meets.
type checker struct {
	module string
	seen   map[types.Type]bool // named types already walked for the current name
	found  []string
}

func (c *checker) pkg(p *types.Package) {
	scope := p.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		where := p.Path() + "." + name
		tn, ok := obj.(*types.TypeName)
		if !ok {
			c.walk(where, obj.Type()) // funcs, vars, consts
			continue
		}
		if tn.IsAlias() {
			c.walk(where, obj.Type())
			continue
		}
		named, ok := types.Unalias(tn.Type()).(*types.Named)
		if !ok {
			continue
		}
		c.fields(where, named.Underlying())
		// The pointer's method set holds the value's too, and promoted methods.
		ms := types.NewMethodSet(types.NewPointer(named))
		for i := range ms.Len() {
			if m := ms.At(i).Obj(); m.Exported() {
				c.walk(where+"."+m.Name(), m.Type())
			}
		}
	}
}

// fields walks what a type's underlying structure shows: exported struct fields (embedded
// ones included) and an interface's exported methods.
func (c *checker) fields(where string, u types.Type) {
	switch u := u.(type) {
	case *types.Struct:
		for i := range u.NumFields() {
			if f := u.Field(i); f.Exported() {
				c.walk(where+"."+f.Name(), f.Type())
			}
		}
	case *types.Interface:
		for i := range u.NumMethods() {
			if m := u.Method(i); m.Exported() {
				c.walk(where+"."+m.Name(), m.Type())
			}
		}
	default:
		c.walk(where, u)
	}
}

func (c *checker) walk(where string, t types.Type) {
	switch t := t.(type) {
	case *types.Alias:
		c.walk(where, types.Unalias(t))
	case *types.Named:
		obj := t.Obj()
		if obj.Pkg() != nil && strings.HasPrefix(obj.Pkg().Path(), c.module+"/") && isInternal(obj.Pkg().Path()) {
			c.found = append(c.found, where+": "+obj.Pkg().Path()+"."+obj.Name())
		}
		for i := range t.TypeArgs().Len() {
			c.walk(where, t.TypeArgs().At(i))
		}
		// A public named type is checked as a name of its own package; a foreign one is
		// not this module's business.
	case *types.Pointer:
		c.walk(where, t.Elem())
	case *types.Slice:
		c.walk(where, t.Elem())
	case *types.Array:
		c.walk(where, t.Elem())
	case *types.Chan:
		c.walk(where, t.Elem())
	case *types.Map:
		c.walk(where, t.Key())
		c.walk(where, t.Elem())
	case *types.Signature:
		for _, tup := range []*types.Tuple{t.Params(), t.Results()} {
			for i := range tup.Len() {
				c.walk(where, tup.At(i).Type())
			}
		}
	case *types.Struct, *types.Interface:
		if c.seen[t] {
			return
		}
		c.seen[t] = true
		c.fields(where, t)
	case *types.TypeParam:
		c.walk(where, t.Constraint())
	}
}
