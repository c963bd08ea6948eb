package archtest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Every Go name and file ARCHITECTURE.md mentions in backticks must exist: a renamed
// function or a moved file leaves the page pointing at nothing otherwise.
func TestNamesInArchitectureExist(t *testing.T) {
	r, err := loadRepo(t.Context(), goTool(t))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := r.readDoc()
	if err != nil {
		t.Fatal(err)
	}
	ix, err := indexNames(r)
	if err != nil {
		t.Fatal(err)
	}
	files, err := goFileNames(r.root)
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, ref := range backticked(doc) {
		if why := ix.check(r, files, ref.text); why != "" {
			missing = append(missing, fmt.Sprintf("line %d: `%s`: %s", ref.line, ref.text, why))
		}
	}
	if len(missing) > 0 {
		t.Errorf("ARCHITECTURE.md names what the code does not have:%s", lines(missing))
	}
}

// names is what the packages declare, from their non-test files.
type names struct {
	byName map[string][]string                   // Go package name → relative paths
	top    map[string]map[string]bool            // relative path → top-level names
	member map[string]map[string]map[string]bool // relative path → type → fields and methods
}

func indexNames(r *repo) (*names, error) {
	ix := &names{byName: map[string][]string{}, top: map[string]map[string]bool{}, member: map[string]map[string]map[string]bool{}}
	fset := token.NewFileSet()
	for rel, p := range r.pkgs {
		if p.Name != "main" {
			ix.byName[p.Name] = append(ix.byName[p.Name], rel)
		}
		ix.top[rel], ix.member[rel] = map[string]bool{}, map[string]map[string]bool{}
		for _, f := range slices.Concat(p.GoFiles, p.CgoFiles) {
			file, err := parser.ParseFile(fset, filepath.Join(p.Dir, f), nil, parser.SkipObjectResolution)
			if err != nil {
				return nil, fmt.Errorf("parse %s: %w", filepath.Join(rel, f), err)
			}
			ix.add(rel, file)
		}
	}
	return ix, nil
}

func (ix *names) add(rel string, file *ast.File) {
	addMember := func(typ, name string) {
		if ix.member[rel][typ] == nil {
			ix.member[rel][typ] = map[string]bool{}
		}
		ix.member[rel][typ][name] = true
	}
	for _, d := range file.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil || len(d.Recv.List) == 0 {
				ix.top[rel][d.Name.Name] = true
				continue
			}
			addMember(receiverType(d.Recv.List[0].Type), d.Name.Name)
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.ValueSpec:
					for _, n := range s.Names {
						ix.top[rel][n.Name] = true
					}
				case *ast.TypeSpec:
					ix.top[rel][s.Name.Name] = true
					for _, m := range fieldNames(s.Type) {
						addMember(s.Name.Name, m)
					}
				}
			}
		}
	}
}

// receiverType is the type name of a method's receiver: T of T, *T, T[K] or *T[K].
func receiverType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// fieldNames returns a struct's field names (an embedded field by its type's name) or an
// interface's method names.
func fieldNames(e ast.Expr) []string {
	var list *ast.FieldList
	switch x := e.(type) {
	case *ast.StructType:
		list = x.Fields
	case *ast.InterfaceType:
		list = x.Methods
	default:
		return nil
	}
	var out []string
	for _, f := range list.List {
		for _, n := range f.Names {
			out = append(out, n.Name)
		}
		if len(f.Names) == 0 {
			if name := receiverType(f.Type); name != "" {
				out = append(out, name)
			} else if sel, ok := f.Type.(*ast.SelectorExpr); ok {
				out = append(out, sel.Sel.Name)
			}
		}
	}
	return out
}

// has tells whether package rel declares name at top level or as a member of a type.
func (ix *names) has(rel, name string) bool {
	if ix.top[rel][name] {
		return true
	}
	for _, members := range ix.member[rel] {
		if members[name] {
			return true
		}
	}
	return false
}

var (
	// qualified is pkg.Name or pkg.Type.Member, pkg a Go package name or a relative path.
	// A name without a capital is not taken for Go: pipeline.seek and broker.events_dropped
	// are a command and an event of the control plane.
	qualified = regexp.MustCompile(`^([a-z][a-z0-9]*(?:/[a-z0-9]+)*)\.([A-Za-z][a-z0-9]*[A-Z][A-Za-z0-9]*|[A-Z][A-Za-z0-9]*)(?:\.([A-Za-z][A-Za-z0-9]*))?$`)
	// typeMember is Type.Member, with the type in any package.
	typeMember = regexp.MustCompile(`^([A-Z]\w*)\.([A-Za-z_]\w*)$`)
	// exported is an exported Go name standing alone (mixed case: WIRE_NAMES and TBW102 are
	// the protocol's, not Go's).
	exported = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*$`)
	// dataFile is a file name the page mentions that is not Go.
	dataFile = regexp.MustCompile(`\.(json|md|ya?ml|wasm|toml|txt)$`)
)

// check returns why ref names nothing, or "" when it does (or is not a Go name at all).
func (ix *names) check(r *repo, goFiles map[string]bool, ref string) string {
	ref = strings.TrimPrefix(strings.TrimSuffix(ref, "()"), "*")
	switch {
	case strings.HasSuffix(ref, ".go"):
		if strings.Contains(ref, "/") {
			if _, err := os.Stat(filepath.Join(r.root, ref)); err != nil {
				return "no such file"
			}
		} else if !goFiles[ref] {
			return "no Go file of that name in the tree"
		}
		return ""
	case dataFile.MatchString(ref):
		return ""
	case strings.Contains(ref, "/") && pkgPath.MatchString(ref):
		if _, ok := r.pkgs[ref]; !ok {
			if _, err := os.Stat(filepath.Join(r.root, ref)); err != nil {
				return "neither a package nor a path of the repository"
			}
		}
		return ""
	}
	if m := qualified.FindStringSubmatch(ref); m != nil {
		pkgs := ix.byName[m[1]]
		if strings.Contains(m[1], "/") {
			if _, ok := r.pkgs[m[1]]; !ok {
				return "" // a directory or a file, not a package
			}
			pkgs = []string{m[1]}
		}
		if len(pkgs) == 0 {
			return "" // not a package: a file name, a setting
		}
		for _, rel := range pkgs {
			if m[3] == "" && ix.has(rel, m[2]) || m[3] != "" && ix.member[rel][m[2]][m[3]] {
				return ""
			}
		}
		return "package " + strings.Join(pkgs, " or ") + " declares no such name"
	}
	if m := typeMember.FindStringSubmatch(ref); m != nil {
		for rel := range ix.member {
			if ix.member[rel][m[1]][m[2]] {
				return ""
			}
		}
		return "no flowd type " + m[1] + " has a field or method " + m[2]
	}
	if exported.MatchString(ref) {
		for rel := range ix.top {
			if ix.has(rel, ref) {
				return ""
			}
		}
		return "no flowd package declares it"
	}
	return ""
}

// goFileNames returns the base names of the repository's Go files.
func goFileNames(root string) (map[string]bool, error) {
	out := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".go") {
			out[d.Name()] = true
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list Go files: %w", err)
	}
	return out, nil
}

type ref struct {
	line int
	text string
}

var backtick = regexp.MustCompile("`([^`]+)`")

// backticked returns the backticked spans of doc outside fenced blocks.
func backticked(doc string) []ref {
	var out []ref
	fenced := false
	for i, text := range strings.Split(doc, "\n") {
		if strings.HasPrefix(text, "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range backtick.FindAllStringSubmatch(text, -1) {
			out = append(out, ref{line: i + 1, text: m[1]})
		}
	}
	return out
}
