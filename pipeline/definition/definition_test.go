package definition_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/flowd-io/flowd/pipeline/definition"
)

func validDef() definition.Definition {
	return definition.Definition{Name: "p", Topics: []string{"t"}, Sink: definition.SinkDefinition{Type: definition.SinkStdout}}
}

// Every validation error wraps ErrInvalidDefinition and names the field in error.
func TestDefinitionValidateNamesTheField(t *testing.T) {
	require.NoError(t, validDef().Validate())
	cases := map[string]func(d *definition.Definition){
		"name":      func(d *definition.Definition) { d.Name = "a b" },
		"topics":    func(d *definition.Definition) { d.Topics = nil },
		"topics[1]": func(d *definition.Definition) { d.Topics = []string{"ok", "no/pe"} },
		"group":     func(d *definition.Definition) { d.Group = "g g" },
		"source_name_servers[1]": func(d *definition.Definition) {
			d.SourceNameServers = []string{"127.0.0.1:9876", "127.0.0.1"}
		},
		"sink.name_servers[0]": func(d *definition.Definition) {
			d.Sink = definition.SinkDefinition{Type: definition.SinkTopic, Topic: "out", NameServers: []string{"host:99999"}}
		},
		"selector.type":       func(d *definition.Definition) { d.Selector.Type = "REGEX" },
		"selector.expression": func(d *definition.Definition) { d.Selector.Type = definition.SelectorSQL92 },
		"transforms[0]":       func(d *definition.Definition) { d.Transforms = []string{" "} },
		"start_from":          func(d *definition.Definition) { d.StartFrom = "middle" },
		"start_timestamp":     func(d *definition.Definition) { d.StartFrom = definition.StartTimestamp },
		"parallelism":         func(d *definition.Definition) { d.Parallelism = -1 },
		"max_attempts":        func(d *definition.Definition) { d.MaxAttempts = -2 },
		"retry_backoff":       func(d *definition.Definition) { d.RetryBackoff = -1 },
		"max_backoff":         func(d *definition.Definition) { d.RetryBackoff, d.MaxBackoff = 10, 5 },
		"retry_delay_level":   func(d *definition.Definition) { d.RetryDelayLevel = -1 },
		"max_reconsume_times": func(d *definition.Definition) { d.MaxReconsumeTimes = -1 },
		"pull_batch_size":     func(d *definition.Definition) { d.PullBatchSize = 5000 },
		"sink.type":           func(d *definition.Definition) { d.Sink.Type = "kafka" },
		"sink.topic":          func(d *definition.Definition) { d.Sink = definition.SinkDefinition{Type: definition.SinkTopic} },
		"sink.subject":        func(d *definition.Definition) { d.Sink = definition.SinkDefinition{Type: definition.SinkNATS} },
		"sink.jetstream": func(d *definition.Definition) {
			d.Sink = definition.SinkDefinition{Type: definition.SinkNATS, Subject: "s", JetStream: "maybe"}
		},
		"sink.url": func(d *definition.Definition) {
			d.Sink = definition.SinkDefinition{Type: definition.SinkWebhook, URL: "ftp://x"}
		},
		"sink.path":    func(d *definition.Definition) { d.Sink = definition.SinkDefinition{Type: definition.SinkFile} },
		"sink.timeout": func(d *definition.Definition) { d.Sink.Timeout = -1 },
	}
	for field, mod := range cases {
		t.Run(field, func(t *testing.T) {
			d := validDef()
			mod(&d)
			err := d.Validate()
			require.Error(t, err)
			assert.True(t, errors.Is(err, definition.ErrInvalidDefinition))
			assert.Contains(t, err.Error(), ": "+field+": ")
		})
	}
}

// Definitions round-trip through JSON and YAML with snake_case keys and readable durations.
func TestDefinitionJSONAndYAML(t *testing.T) {
	const y = `
name: orders-to-nats
topics: [orders]
source_name_servers: ["10.0.0.1:9876", "ns.example:9876"]
group: g1
selector: {type: SQL92, expression: "amount > 10"}
allocator: STICKY-AVG
transforms: [redact]
start_from: timestamp
start_timestamp: 2026-01-02T03:04:05Z
parallelism: 4
max_attempts: 3
retry_backoff: 250ms
max_backoff: 2s
retry_delay_level: 2
pull_batch_size: 16
sink: {type: nats, subject: orders.out, jetstream: auto, timeout: 3s}
`
	var d definition.Definition
	require.NoError(t, yaml.Unmarshal([]byte(y), &d))
	require.NoError(t, d.Validate())
	assert.Equal(t, definition.Duration(250*time.Millisecond), d.RetryBackoff)
	assert.Equal(t, definition.Duration(3*time.Second), d.Sink.Timeout)
	assert.Equal(t, "amount > 10", d.Selector.Expression)
	assert.Equal(t, 4, d.Parallelism)
	assert.Equal(t, []string{"10.0.0.1:9876", "ns.example:9876"}, d.SourceNameServers)

	b, err := json.Marshal(d)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"retry_backoff":"250ms"`)
	assert.Contains(t, string(b), `"start_from":"timestamp"`)
	var back definition.Definition
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, d, back)
}

// Validate names every field in error, not only the first.
func TestDefinitionValidateNamesEveryField(t *testing.T) {
	d := validDef()
	d.Name = "a b"
	d.Parallelism = -1
	d.Sink = definition.SinkDefinition{Type: definition.SinkTopic, Timeout: -1}
	err := d.Validate()
	require.ErrorIs(t, err, definition.ErrInvalidDefinition)
	var fields []string
	for _, fe := range definition.FieldErrors(fmt.Errorf("start: %w", err)) {
		fields = append(fields, fe.Field)
	}
	assert.Equal(t, []string{"name", "parallelism", "sink.timeout", "sink.topic"}, fields)
	for _, f := range fields {
		assert.Contains(t, err.Error(), ": "+f+": ")
	}
}

func TestDefinitionValidateCreateQueues(t *testing.T) {
	d := validDef()
	d.Sink = definition.SinkDefinition{Type: definition.SinkTopic, Topic: "out", CreateQueues: 4}
	require.NoError(t, d.Validate())
	for _, n := range []int{-1, 1025} {
		d.Sink.CreateQueues = n
		assert.ErrorContains(t, d.Validate(), ": sink.create_queues: ")
	}
	d.Sink = definition.SinkDefinition{Type: definition.SinkStdout, CreateQueues: 1}
	assert.ErrorContains(t, d.Validate(), "sink.create_queues: only for sink type topic")
}

// docs/pipelines.md documents every field of a definition and every sink type with a section
// of its own, so that the definition's fields are not known from this package's source only.
func TestDefinitionFieldsAndSinksAreDocumented(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "pipelines.md"))
	require.NoError(t, err)
	doc := string(raw)
	for _, typ := range []string{definition.SinkTopic, definition.SinkNATS, definition.SinkWebhook, definition.SinkFile, definition.SinkStdout} {
		assert.Regexp(t, "(?m)^### `"+typ+"`", doc, "a section for sink type %s", typ)
	}
	for _, v := range []any{definition.Definition{}, definition.Selector{}, definition.SinkDefinition{}} {
		rt := reflect.TypeOf(v)
		for i := range rt.NumField() {
			key, _, _ := strings.Cut(rt.Field(i).Tag.Get("yaml"), ",")
			assert.Contains(t, doc, "`"+key+"`", "%s.%s (%s) is documented", rt.Name(), rt.Field(i).Name, key)
		}
	}
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	assert.Contains(t, string(readme), "(docs/pipelines.md)", "the README links it")
}

// A NATS sink publishes to one literal subject: what NATS would refuse or read as a pattern
// fails validation, saying why.
func TestDefinitionSinkSubjectIsALiteralNATSSubject(t *testing.T) {
	d := validDef()
	for subject, msg := range map[string]string{
		"orders.*":  `"orders.*" is not a valid NATS subject: token 2 is the wildcard '*' (messages are published to literal subjects)`,
		"orders..x": `"orders..x" is not a valid NATS subject: token 2 is empty`,
		"":          `"" is not a valid NATS subject: empty`,
	} {
		d.Sink = definition.SinkDefinition{Type: definition.SinkNATS, Subject: subject}
		fes := definition.FieldErrors(d.Validate())
		require.Len(t, fes, 1, subject)
		assert.Equal(t, "sink.subject", fes[0].Field)
		assert.Equal(t, msg, fes[0].Detail())
	}
	d.Sink = definition.SinkDefinition{Type: definition.SinkNATS, Subject: "$KV.orders.eu"}
	assert.NoError(t, d.Validate())
}
