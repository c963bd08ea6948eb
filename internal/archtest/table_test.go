package archtest

import (
	"bufio"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// tableMarker starts the paragraph that introduces the dependency table; the table is the
// first fenced block after it.
const tableMarker = "Dependencies point one way"

// arrow separates a package from the packages it imports.
const arrow = "─►"

// pkgPath is a package path relative to the module root, as the table writes it.
var pkgPath = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]*(/[a-z0-9_.-]+)*$`)

// entry is one package's line of the table (with its continuation lines).
type entry struct {
	line    int // 1-based line in the document
	imports []string
}

// parseTable reads the dependency table out of the document doc. Each table line is
//
//	<package> ─► <package>, <package>, …   (a note)
//
// naming every flowd package <package> imports outside its tests, in full, or "nothing" /
// "nothing of flowd". A line that starts with white space and has no arrow continues the
// line above. Text in parentheses is a note, not a package.
func parseTable(doc string) (map[string]entry, error) {
	lines, start, err := tableLines(doc)
	if err != nil {
		return nil, err
	}
	table := map[string]entry{}
	var cur string     // package of the line being continued
	var texts []string // its imports text, line by line
	var curLine, curNo int
	flush := func() error {
		if cur == "" {
			return nil
		}
		imports, err := parseImports(strings.Join(texts, " "))
		if err != nil {
			return fmt.Errorf("ARCHITECTURE.md:%d: %s: %w", curLine, cur, err)
		}
		if prev, dup := table[cur]; dup {
			return fmt.Errorf("ARCHITECTURE.md:%d: %s is on line %d already: one line per package", curLine, cur, prev.line)
		}
		table[cur] = entry{line: curLine, imports: imports}
		return nil
	}
	for i, text := range lines {
		curNo = start + i
		if strings.TrimSpace(text) == "" {
			continue
		}
		left, right, hasArrow := strings.Cut(text, arrow)
		if !hasArrow {
			if cur == "" || !strings.HasPrefix(text, " ") {
				return nil, fmt.Errorf("ARCHITECTURE.md:%d: %q is neither \"<package> %s <imports>\" nor an indented continuation of the line above", curNo, text, arrow)
			}
			texts = append(texts, text)
			continue
		}
		if strings.Contains(right, arrow) {
			return nil, fmt.Errorf("ARCHITECTURE.md:%d: more than one %s: give each package a line of its own", curNo, arrow)
		}
		if err := flush(); err != nil {
			return nil, err
		}
		name, err := stripNotes(left)
		if err != nil {
			return nil, fmt.Errorf("ARCHITECTURE.md:%d: %w", curNo, err)
		}
		name = strings.TrimSpace(name)
		if !pkgPath.MatchString(name) {
			return nil, fmt.Errorf("ARCHITECTURE.md:%d: %q is not one package path: give each package a line of its own", curNo, name)
		}
		cur, curLine, texts = name, curNo, []string{right}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if len(table) == 0 {
		return nil, fmt.Errorf("ARCHITECTURE.md:%d: the dependency table is empty", start)
	}
	return table, nil
}

// tableLines returns the lines inside the first fenced block after tableMarker, and the
// document line number of the first of them.
func tableLines(doc string) ([]string, int, error) {
	sc := bufio.NewScanner(strings.NewReader(doc))
	sc.Buffer(nil, 1<<20)
	var lines []string
	n, start := 0, 0
	seenMarker, inBlock := false, false
	for sc.Scan() {
		n++
		text := sc.Text()
		switch {
		case !seenMarker:
			seenMarker = strings.HasPrefix(text, tableMarker)
		case !inBlock && strings.HasPrefix(text, "```"):
			inBlock, start = true, n+1
		case inBlock && strings.HasPrefix(text, "```"):
			return lines, start, nil
		case inBlock:
			lines = append(lines, text)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, 0, fmt.Errorf("read ARCHITECTURE.md: %w", err)
	}
	if !seenMarker {
		return nil, 0, fmt.Errorf("ARCHITECTURE.md has no paragraph starting %q before the dependency table", tableMarker)
	}
	return nil, 0, fmt.Errorf("ARCHITECTURE.md: no closed ``` block after %q", tableMarker)
}

// parseImports reads the part of a line after the arrow.
func parseImports(text string) ([]string, error) {
	text, err := stripNotes(text)
	if err != nil {
		return nil, err
	}
	text = strings.TrimSpace(text)
	if text == "nothing" || text == "nothing of flowd" {
		return nil, nil
	}
	var out []string
	seen := map[string]bool{}
	for _, f := range strings.Split(text, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue // the comma that ends a line before its continuation
		}
		if !pkgPath.MatchString(f) {
			return nil, fmt.Errorf("%q is not a package path (write packages in full, separated by commas, notes in parentheses)", f)
		}
		if seen[f] {
			return nil, fmt.Errorf("%s is listed twice", f)
		}
		seen[f] = true
		out = append(out, f)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no imports: write \"nothing of flowd\" for a package that imports none")
	}
	return out, nil
}

// stripNotes removes the parenthesized notes of s. A parenthesis glued to a word is
// shorthand ("broker/filter(/sql92)"), which the table does not take: it would hide a
// package.
func stripNotes(s string) (string, error) {
	var b strings.Builder
	depth := 0
	for i, r := range s {
		switch {
		case r == '(':
			if depth == 0 && i > 0 && s[i-1] != ' ' {
				return "", fmt.Errorf("%q is shorthand: write each package in full (a note in parentheses follows a space)", wordAt(s, i))
			}
			depth++
		case r == ')':
			if depth == 0 {
				return "", fmt.Errorf("%q: unbalanced )", s)
			}
			depth--
		case depth == 0:
			b.WriteRune(r)
		}
	}
	if depth != 0 {
		return "", fmt.Errorf("%q: unbalanced (", s)
	}
	return b.String(), nil
}

// wordAt returns the white-space-delimited word of s around byte i.
func wordAt(s string, i int) string {
	start := strings.LastIndexAny(s[:i], " \t") + 1
	end := strings.IndexAny(s[i:], " \t,")
	if end < 0 {
		return s[start:]
	}
	return s[start : i+end]
}

// The table's grammar: what it takes, and the clear errors for what it does not.
func TestParseTable(t *testing.T) {
	wrap := func(body string) string {
		return "# x\n\n" + tableMarker + ":\n\n```\n" + body + "```\n"
	}
	t.Run("lines, continuations and notes", func(t *testing.T) {
		table, err := parseTable(wrap("a   ─► b, c,   (a note, with commas)\n" +
			"       d                 (more)\n" +
			"b (x) ─► nothing of flowd\n" +
			"c   ─► nothing\n" +
			"d   ─► b (a note\n" +
			"       over two lines)\n"))
		if err != nil {
			t.Fatal(err)
		}
		want := map[string][]string{"a": {"b", "c", "d"}, "b": nil, "c": nil, "d": {"b"}}
		if len(table) != len(want) {
			t.Fatalf("got %d packages %v, want %v", len(table), table, want)
		}
		for name, imports := range want {
			if got := table[name].imports; !slices.Equal(got, imports) {
				t.Errorf("%s: got imports %q, want %q", name, got, imports)
			}
		}
		if table["b"].line != 8 {
			t.Errorf("b: got line %d, want 8", table["b"].line)
		}
	})
	for _, tc := range []struct{ name, body, want string }{
		{"shorthand", "a ─► broker/filter(/sql92)\n", `"broker/filter(/sql92)" is shorthand`},
		{"chain", "a ─► b ─► c\n", "more than one ─►"},
		{"two packages", "a, b ─► c\n", `"a, b" is not one package path`},
		{"duplicate", "a ─► b\na ─► c\n", "a is on line 6 already"},
		{"listed twice", "a ─► b, b\n", "b is listed twice"},
		{"empty", "a ─►\n", `write "nothing of flowd"`},
		{"stray line", "a ─► b\nc\n", `"c" is neither`},
		{"unbalanced", "a ─► b (note\n", "unbalanced ("},
		{"not a path", "a ─► B!\n", `"B!" is not a package path`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseTable(wrap(tc.body))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got error %v, want one containing %q", err, tc.want)
			}
		})
	}
	if _, err := parseTable("# no table\n"); err == nil || !strings.Contains(err.Error(), tableMarker) {
		t.Errorf("a page without the table: got error %v, want one naming %q", err, tableMarker)
	}
}
