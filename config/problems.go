package config

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/flowd-io/flowd/fields"
)

// Problem is one mistake of a configuration.
type Problem struct {
	// Line is the line of the file the problem is on; 0 when the setting is not in the
	// file (a default, or a value from the environment or a flag) or the file is not read.
	Line int
	// Key is the dotted key path of the setting ("pipelines[1].sink.topic"); empty for a
	// document that is not YAML.
	Key string
	// Msg says what is wrong.
	Msg string
}

// String writes the problem as "line 4: limits.max_parked: <what>", leaving out what is
// not known.
func (p Problem) String() string {
	var b strings.Builder
	if p.Line > 0 {
		b.WriteString("line " + strconv.Itoa(p.Line) + ": ")
	}
	if p.Key != "" {
		b.WriteString(p.Key + ": ")
	}
	b.WriteString(p.Msg)
	return b.String()
}

// InvalidError is the error of a configuration with problems: every one found, in file
// order (those the file's lines do not locate last). It wraps ErrInvalid and, for each
// problem with a key, a *fields.Error naming the setting (fields.Errors lists them).
type InvalidError struct {
	Problems []Problem
}

func (e *InvalidError) Error() string {
	if len(e.Problems) == 1 {
		return ErrInvalid.Error() + ": " + e.Problems[0].String()
	}
	var b strings.Builder
	b.WriteString(ErrInvalid.Error() + ":")
	for _, p := range e.Problems {
		b.WriteString("\n  " + p.String())
	}
	return b.String()
}

// Unwrap returns ErrInvalid and a field error for each problem with a key, in order.
func (e *InvalidError) Unwrap() []error {
	out := []error{ErrInvalid}
	for _, p := range e.Problems {
		if p.Key != "" {
			out = append(out, &fields.Error{Field: p.Key, Msg: p.Msg, Kind: ErrInvalid})
		}
	}
	return out
}

// problemsError is nil without problems, else an *InvalidError holding them sorted by line.
func problemsError(ps []Problem) error {
	if len(ps) == 0 {
		return nil
	}
	ps = slices.Clone(ps)
	slices.SortStableFunc(ps, func(a, b Problem) int {
		if (a.Line == 0) != (b.Line == 0) {
			if a.Line == 0 {
				return 1
			}
			return -1
		}
		return cmp.Compare(a.Line, b.Line)
	})
	return &InvalidError{Problems: ps}
}

// lineAt matches the "line N: " yaml puts before its messages.
var lineAt = regexp.MustCompile(`^line (\d+): `)

// syntaxProblem turns yaml's error for a document that is not YAML into a problem.
func syntaxProblem(err error) Problem {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	p := Problem{Msg: msg}
	if m := lineAt.FindStringSubmatch(msg); m != nil {
		p.Line, _ = strconv.Atoi(m[1])
		p.Msg = strings.TrimPrefix(msg, m[0])
	}
	return p
}

// typeErrorAt matches yaml's report of a value of the wrong type: its line, its YAML tag, and
// the value when the report quotes it (`many`, or "12 parsecs" from a setting's own decoder).
var typeErrorAt = regexp.MustCompile("^line (\\d+): (?:cannot unmarshal (!!\\w+) (?:`([^`]*)` )?into|\\w+ \"([^\"]*)\")")

// typeProblem finds the key of the value a yaml type error is about: yaml names the line
// and the Go type, which do not say which setting is meant when a line holds several. used
// holds the nodes named by earlier errors of the same document, so that two settings with
// the same wrong value on one line are both named.
func typeProblem(root *yaml.Node, msg string, used map[*yaml.Node]bool) Problem {
	p := Problem{Msg: msg}
	if m := lineAt.FindStringSubmatch(msg); m != nil {
		p.Line, _ = strconv.Atoi(m[1])
		p.Msg = strings.TrimPrefix(msg, m[0])
	}
	m := typeErrorAt.FindStringSubmatch(msg)
	if m == nil {
		return p
	}
	tag, value := m[2], m[3]+m[4]
	walkNodes(root, func(n *yaml.Node, path string) bool {
		if n.Line != p.Line || used[n] {
			return true
		}
		if (tag == "" || n.ShortTag() == tag) && (value == "" || (n.Kind == yaml.ScalarNode && n.Value == value)) {
			p.Key = path
			used[n] = true
			return false
		}
		return true
	})
	return p
}

// walkNodes calls fn with every value node under root and its key path, depth first in
// document order, until fn returns false.
func walkNodes(root *yaml.Node, fn func(n *yaml.Node, path string) bool) {
	var walk func(n *yaml.Node, path string) bool
	walk = func(n *yaml.Node, path string) bool {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				if !walk(c, path) {
					return false
				}
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				p := joinKey(path, n.Content[i].Value)
				if !fn(n.Content[i+1], p) || !walk(n.Content[i+1], p) {
					return false
				}
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				p := fmt.Sprintf("%s[%d]", path, i)
				if !fn(c, p) || !walk(c, p) {
					return false
				}
			}
		}
		return true
	}
	walk(root, "")
}

func joinKey(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// keyLines maps the key path of every entry of the document to its line: a mapping
// entry's key's line (a block mapping's value starts on the line after), a sequence item's
// own.
func keyLines(root *yaml.Node) map[string]int {
	lines := map[string]int{}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				p := joinKey(path, n.Content[i].Value)
				lines[p] = n.Content[i].Line
				walk(n.Content[i+1], p)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				p := fmt.Sprintf("%s[%d]", path, i)
				lines[p] = c.Line
				walk(c, p)
			}
		}
	}
	walk(root, "")
	return lines
}

// lineOf is the line of key in lines, or of its nearest ancestor there (a field missing
// from a pipeline is on the pipeline's line); 0 when none is.
func lineOf(lines map[string]int, key string) int {
	for k := key; k != ""; k = parentKey(k) {
		if l, ok := lines[k]; ok {
			return l
		}
	}
	return 0
}

// parentKey is the key path one level up: "a.b[2]" → "a.b" → "a" → "".
func parentKey(key string) string {
	i := strings.LastIndexAny(key, ".[")
	if i < 0 {
		return ""
	}
	return key[:i]
}

// under reports whether key is at or below one of the keys of bad.
func under(key string, bad []string) bool {
	for _, b := range bad {
		if key == b || strings.HasPrefix(key, b+".") || strings.HasPrefix(key, b+"[") {
			return true
		}
	}
	return false
}
