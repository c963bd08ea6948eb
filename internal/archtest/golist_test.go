package archtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// pkg is what the go tool reports of one package of the repository.
type pkg struct {
	ImportPath string
	Name       string
	Dir        string
	GoFiles    []string
	CgoFiles   []string
	Imports    []string // of the package's own files: test imports are separate fields
}

// repo is the repository as the go tool sees it.
type repo struct {
	root   string          // the root module's directory
	module string          // the root module's path
	pkgs   map[string]*pkg // by path relative to module (the table's names)
}

// goTool returns the go command, or skips the test when there is none.
func goTool(t *testing.T) string {
	t.Helper()
	tool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool on PATH: cannot list the packages to check ARCHITECTURE.md against")
	}
	return tool
}

// loadRepo lists the packages of the root module and of every module nested in its tree (the
// Go guest SDK is one), with their non-test imports.
func loadRepo(ctx context.Context, tool string) (*repo, error) {
	out, err := run(ctx, tool, ".", "list", "-m", "-f", "{{.Path}} {{.Dir}}")
	if err != nil {
		return nil, err
	}
	path, dir, ok := strings.Cut(strings.TrimSpace(out), " ")
	if !ok {
		return nil, fmt.Errorf("go list -m: unexpected output %q", out)
	}
	r := &repo{root: dir, module: path, pkgs: map[string]*pkg{}}
	dirs, err := moduleDirs(dir)
	if err != nil {
		return nil, err
	}
	for _, d := range dirs {
		if err := r.list(ctx, tool, d); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// moduleDirs returns root and the directory of every go.mod below it.
func moduleDirs(root string) ([]string, error) {
	dirs := []string{root}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && (strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && d.Name() == "go.mod" && filepath.Dir(p) != root {
			dirs = append(dirs, filepath.Dir(p))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("find nested modules: %w", err)
	}
	return dirs, nil
}

// list adds the packages of the module in dir.
func (r *repo) list(ctx context.Context, tool, dir string) error {
	out, err := run(ctx, tool, dir, "list", "-json=ImportPath,Name,Dir,GoFiles,CgoFiles,Imports", "./...")
	if err != nil {
		return err
	}
	dec := json.NewDecoder(strings.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("go list in %s: decode: %w", dir, err)
		}
		rel, ok := r.rel(p.ImportPath)
		if !ok {
			return fmt.Errorf("go list in %s: package %s is outside module %s", dir, p.ImportPath, r.module)
		}
		r.pkgs[rel] = &p
	}
}

// rel returns an import path relative to the root module, and whether it is inside it.
func (r *repo) rel(importPath string) (string, bool) {
	return strings.CutPrefix(importPath, r.module+"/")
}

// flowdImports returns the flowd packages p imports outside its tests, relative to the
// module.
func (r *repo) flowdImports(p *pkg) []string {
	var out []string
	for _, imp := range p.Imports {
		if rel, ok := r.rel(imp); ok {
			out = append(out, rel)
		}
	}
	return out
}

// documented tells whether the table must list the package: it has code of its own (not
// only tests) and is not one of the examples.
func documented(rel string, p *pkg) bool {
	if rel == "examples" || strings.HasPrefix(rel, "examples/") {
		return false
	}
	return len(p.GoFiles)+len(p.CgoFiles) > 0
}

// run runs the go tool in dir and returns its standard output; its standard error goes into
// the error.
func run(ctx context.Context, tool, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, tool, args...)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s (in %s): %w: %s", strings.Join(args, " "), dir, err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// readDoc returns ARCHITECTURE.md of the repository.
func (r *repo) readDoc() (string, error) {
	b, err := os.ReadFile(filepath.Join(r.root, "ARCHITECTURE.md"))
	if err != nil {
		return "", fmt.Errorf("read ARCHITECTURE.md: %w", err)
	}
	return string(b), nil
}

// lines puts each item on a line of its own, indented, for a readable failure.
func lines(items []string) string {
	var b strings.Builder
	for _, it := range items {
		b.WriteString("\n    " + it)
	}
	return b.String()
}
