package archtest

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// ARCHITECTURE.md's dependency table is the map a new maintainer reads first: each of its
// lines must list exactly the flowd packages its package imports (test files aside), and
// every package with code must have a line, so that the table cannot drift from the code.
func TestDependencyTableMatchesGoList(t *testing.T) {
	r, err := loadRepo(t.Context(), goTool(t))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := r.readDoc()
	if err != nil {
		t.Fatal(err)
	}
	table, err := parseTable(doc)
	if err != nil {
		t.Fatal(err)
	}
	if diffs := compareTable(r, table); len(diffs) > 0 {
		t.Errorf("ARCHITECTURE.md's dependency table does not match go list; fix the table "+
			"(or the imports):%s", lines(diffs))
	}
}

// compareTable returns one readable line per disagreement between the table and the
// packages, each with the line the table should have.
func compareTable(r *repo, table map[string]entry) []string {
	var diffs []string
	set := map[string]bool{}
	for name := range table {
		set[name] = true
	}
	for name, p := range r.pkgs {
		if documented(name, p) {
			set[name] = true
		}
	}
	names := slices.Sorted(maps.Keys(set))
	for _, name := range names {
		e, listed := table[name]
		p, exists := r.pkgs[name]
		switch {
		case !exists:
			diffs = append(diffs, fmt.Sprintf("line %d: %s is in the table, but the go tool knows no such package: remove the line or fix the name", e.line, name))
			continue
		case !listed:
			diffs = append(diffs, fmt.Sprintf("%s has no line; add:  %s", name, wantLine(name, r.flowdImports(p))))
			continue
		}
		got := r.flowdImports(p)
		missing := without(got, e.imports)
		extra := without(e.imports, got)
		if len(missing) == 0 && len(extra) == 0 {
			continue
		}
		var why []string
		if len(missing) > 0 {
			why = append(why, "imports "+strings.Join(missing, ", ")+" too")
		}
		if len(extra) > 0 {
			why = append(why, "does not import "+strings.Join(extra, ", "))
		}
		diffs = append(diffs, fmt.Sprintf("line %d: %s %s; the line should read:  %s", e.line, name, strings.Join(why, " and "), wantLine(name, got)))
	}
	return diffs
}

// without returns the items of a that b lacks, sorted.
func without(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	slices.Sort(out)
	return out
}

// wantLine is a table line that lists imports.
func wantLine(name string, imports []string) string {
	if len(imports) == 0 {
		return name + " " + arrow + " nothing of flowd"
	}
	imports = slices.Sorted(slices.Values(imports))
	return name + " " + arrow + " " + strings.Join(imports, ", ")
}

// The Packages section describes every package with code, and only those: a package the
// tree gains or loses shows there as in the table.
func TestPackageListMatchesGoList(t *testing.T) {
	r, err := loadRepo(t.Context(), goTool(t))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := r.readDoc()
	if err != nil {
		t.Fatal(err)
	}
	listed, err := packageList(doc)
	if err != nil {
		t.Fatal(err)
	}
	var diffs []string
	for _, name := range slices.Sorted(maps.Keys(r.pkgs)) {
		if _, ok := listed[name]; !ok && documented(name, r.pkgs[name]) {
			diffs = append(diffs, name+"/ is not described")
		}
	}
	for _, name := range slices.Sorted(maps.Keys(listed)) {
		if p, ok := r.pkgs[name]; !ok || !documented(name, p) {
			diffs = append(diffs, fmt.Sprintf("line %d: %s/ is described, but it is not a package with code of its own", listed[name], name))
		}
	}
	if len(diffs) > 0 {
		t.Errorf("ARCHITECTURE.md's Packages section does not match go list:%s", lines(diffs))
	}
}

// packageList returns the packages the "## Packages" block describes (each an unindented
// "<path>/" at the start of a line) and their lines.
func packageList(doc string) (map[string]int, error) {
	out := map[string]int{}
	section, inBlock := false, false
	for i, text := range strings.Split(doc, "\n") {
		switch {
		case strings.HasPrefix(text, "## "):
			if section {
				return nil, fmt.Errorf("ARCHITECTURE.md: the Packages section has no closed ``` block")
			}
			section = text == "## Packages"
		case !section:
		case strings.HasPrefix(text, "```"):
			if inBlock {
				return out, nil
			}
			inBlock = true
		case inBlock && text != "" && text[0] != ' ':
			name, _, _ := strings.Cut(text, " ")
			path, ok := strings.CutSuffix(name, "/")
			if !ok || !pkgPath.MatchString(path) {
				return nil, fmt.Errorf("ARCHITECTURE.md:%d: %q does not start with a package directory (\"broker/store/\")", i+1, text)
			}
			out[path] = i + 1
		}
	}
	return nil, fmt.Errorf("ARCHITECTURE.md has no \"## Packages\" section with a ``` block")
}
