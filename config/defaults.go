package config

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// DefaultsYAML is the complete default configuration as a YAML document with a comment on
// each setting (its meaning, environment variable and flag). It is built from Default and the
// struct tags, and Decode reads it back into Default().
func DefaultsYAML() ([]byte, error) {
	c := Default()
	node, err := structNode(reflect.ValueOf(c))
	if err != nil {
		return nil, err
	}
	doc := &yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{node},
		HeadComment: "flowd configuration: every setting with its default.\n" +
			"Precedence: flag > FLOWD_* environment variable > this file > default.\n" +
			"Durations are Go durations (500ms, 72h); sizes are bytes or 64MiB-style."}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("config defaults: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("config defaults: %w", err)
	}
	return buf.Bytes(), nil
}

func structNode(v reflect.Value) (*yaml.Node, error) {
	m := &yaml.Node{Kind: yaml.MappingNode}
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		key := &yaml.Node{Kind: yaml.ScalarNode, Value: strings.Split(f.Tag.Get("yaml"), ",")[0]}
		comment := f.Tag.Get("doc")
		var extra []string
		if e := f.Tag.Get("env"); e != "" {
			extra = append(extra, "env "+e)
		}
		if fl := f.Tag.Get("flag"); fl != "" {
			extra = append(extra, "flag --"+fl)
		}
		if f.Tag.Get("reload") == "true" {
			extra = append(extra, "reloaded on SIGHUP")
		}
		if len(extra) > 0 {
			comment += " (" + strings.Join(extra, ", ") + ")"
		}
		key.HeadComment = comment
		var val *yaml.Node
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Duration]() {
			n, err := structNode(v.Field(i))
			if err != nil {
				return nil, err
			}
			val = n
		} else {
			val = &yaml.Node{}
			if err := val.Encode(v.Field(i).Interface()); err != nil {
				return nil, fmt.Errorf("config defaults: %s: %w", key.Value, err)
			}
			if val.Kind == yaml.SequenceNode {
				val.Style = yaml.FlowStyle
			}
		}
		m.Content = append(m.Content, key, val)
	}
	return m, nil
}
