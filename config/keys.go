package config

import (
	"encoding"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The document is checked for unknown keys by walking it against the yaml tags of the type
// it is decoded into, rather than with yaml's KnownFields: that way every unknown key is
// found with its full key path, and the keys around it are at hand to suggest the one
// meant.

// unknownKeys returns a problem for every key of the document root that no field of t
// (Config) has, at any depth.
func unknownKeys(root *yaml.Node, t reflect.Type) []Problem {
	var out []Problem
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		walkType(root.Content[0], t, "", t, "", &out)
	}
	return out
}

// walkType checks node n against type t at key path path. scope is the type of the
// outermost struct the path is in that a misplaced key is looked for in (Config, or a
// pipeline's Definition), scopePath its key path.
func walkType(n *yaml.Node, t reflect.Type, path string, scope reflect.Type, scopePath string, out *[]Problem) {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t.Kind() == reflect.Struct && decodesItself(t):
	case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		fields := structKeys(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Tag == "!!merge" {
				walkType(v, t, path, scope, scopePath, out)
				continue
			}
			key := joinKey(path, k.Value)
			ft, ok := fields[k.Value]
			if !ok {
				*out = append(*out, Problem{Line: k.Line, Key: key, Msg: "unknown key" + suggest(k.Value, t, scope, scopePath, path)})
				continue
			}
			walkType(v, ft, key, scope, scopePath, out)
		}
	case (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) && n.Kind == yaml.SequenceNode:
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			// A list of structs (pipelines) is a scope of its own: a key misplaced in a
			// pipeline is looked for within the pipeline, not across the configuration.
			walkType(c, t.Elem(), p, t.Elem(), p, out)
		}
	case t.Kind() == reflect.Map && n.Kind == yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			walkType(n.Content[i+1], t.Elem(), joinKey(path, n.Content[i].Value), scope, scopePath, out)
		}
	}
}

var (
	yamlUnmarshaler = reflect.TypeFor[yaml.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// decodesItself reports whether yaml decodes t with t's own method (time.Time, sizes)
// rather than field by field.
func decodesItself(t reflect.Type) bool {
	p := reflect.PointerTo(t)
	return p.Implements(yamlUnmarshaler) || p.Implements(textUnmarshaler)
}

// structKeys maps the YAML keys of t's fields to their types, as yaml.v3 names them.
func structKeys(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if strings.Contains(","+opts+",", ",inline,") && f.Type.Kind() == reflect.Struct {
			for k, v := range structKeys(f.Type) {
				out[k] = v
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f.Type
	}
	return out
}

// suggest returns `; did you mean "x"?` for an unknown key of struct t at path: the keys of
// t close to it (a typo), then the keys of the same name elsewhere in scope (a setting put
// in the wrong section), given in full; "" when there is none.
func suggest(key string, t reflect.Type, scope reflect.Type, scopePath, path string) string {
	var cands []string
	limit := max(1, len(key)/3)
	best := limit + 1
	for k := range structKeys(t) {
		switch d := editDistance(normalKey(key), normalKey(k)); {
		case d < best:
			best, cands = d, []string{k}
		case d == best:
			cands = append(cands, k)
		}
	}
	slices.Sort(cands)
	for _, p := range scopeKeys(scope, scopePath) {
		leaf := p[strings.LastIndex(p, ".")+1:]
		if normalKey(leaf) == normalKey(key) && parentKey(p) != path {
			cands = append(cands, p)
		}
	}
	if len(cands) == 0 {
		return ""
	}
	quoted := make([]string, 0, 3)
	for _, c := range cands[:min(len(cands), 3)] {
		quoted = append(quoted, strconv.Quote(c))
	}
	return "; did you mean " + strings.Join(quoted, " or ") + "?"
}

// scopeKeys lists the key paths of every field of struct t and of the structs within it
// (not into lists), prefixed by path, in field order.
func scopeKeys(t reflect.Type, path string) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || decodesItself(t) {
		return nil
	}
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		p := joinKey(path, name)
		out = append(out, p)
		out = append(out, scopeKeys(f.Type, p)...)
	}
	return out
}

// normalKey folds the differences a typed key most often has from the real one: case, and
// '-' for '_'.
func normalKey(k string) string { return strings.ReplaceAll(strings.ToLower(k), "-", "_") }

// editDistance is the optimal string alignment distance of a and b: insertions, deletions,
// substitutions and transpositions of adjacent bytes each count 1.
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
