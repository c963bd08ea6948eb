// Package definition is what describes a flowd pipeline as plain data, and its validation:
// the Definition a config file, a KV entry or a control request holds, the Selector and
// SinkDefinition within it, and the FieldError naming a field at fault. Package pipeline
// runs definitions; this package is apart from it so that what only reads or checks
// definitions (the daemon's config, `flowd config validate`) does not import the consumer,
// the Wasm runtime and NATS that running them takes. It imports nothing of flowd but the
// NATS name rules and the field error and duration of fields.
package definition

import (
	"errors"
	"time"

	"github.com/flowd-io/flowd/fields"
)

// ErrInvalidDefinition is wrapped by every validation error; the message names the field.
var ErrInvalidDefinition = errors.New("pipeline: invalid definition")

// Selector types a Definition may name. They are the broker's expression types.
const (
	SelectorTag   = "TAG"
	SelectorSQL92 = "SQL92"
	SelectorWasm  = "WASM"
)

// Start positions: where a pipeline whose group has no committed offset for a queue begins.
const (
	StartFirst     = "first"
	StartLast      = "last"
	StartTimestamp = "timestamp"
)

// Sink types.
const (
	SinkTopic   = "topic"
	SinkNATS    = "nats"
	SinkWebhook = "webhook"
	SinkFile    = "file"
	SinkStdout  = "stdout"
)

// Defaults of the optional fields.
const (
	DefaultParallelism  = 1
	DefaultMaxAttempts  = 5
	DefaultRetryBackoff = 100 * time.Millisecond
	DefaultMaxBackoff   = 5 * time.Second
	DefaultSinkTimeout  = 10 * time.Second
)

// Duration is a time.Duration written as a Go duration string ("250ms", "5s") in JSON and
// YAML, so that config files stay readable; JSON takes a whole number of nanoseconds too.
// It is the duration of plugin manifests as well.
type Duration = fields.Duration

// Definition is everything that describes a pipeline: what it reads, what it does to each
// message and where it writes. It is plain data (a config file or a KV entry holds it);
// the resources it names (Wasm plugins, a NATS connection) are resolved by the Manager of
// package pipeline.
type Definition struct {
	// Name identifies the pipeline in its Manager. Required: letters, digits, '-', '_', '.'.
	Name string `json:"name" yaml:"name"`
	// Topics are the source topics. Required, at least one.
	Topics []string `json:"topics" yaml:"topics"`
	// SourceNameServers are the name servers (host:port) of the flowd or RocketMQ cluster
	// hosting Topics, where the group's offsets and queue locks live too. Default: the
	// Manager's own (this flowd). Daemons that run the same definition against one source
	// share its queues in the group, so a pipeline can be spread over several flowds.
	SourceNameServers []string `json:"source_name_servers,omitempty" yaml:"source_name_servers,omitempty"`
	// Group is the consumer group the pipeline reads as; every Manager running the same
	// definition shares the topics' queues in it. Default "pipeline-<name>".
	Group string `json:"group,omitempty" yaml:"group,omitempty"`
	// Selector chooses the messages the broker hands out. Default: every message (TAG "*").
	Selector Selector `json:"selector,omitzero" yaml:"selector,omitempty"`
	// Allocator names the queue allocation strategy: a built-in (AVG, AVG_BY_CIRCLE,
	// CONSISTENT_HASH, STICKY-…) or a name the Manager's Allocators function resolves (a
	// Wasm allocator plugin). Default AVG.
	Allocator string `json:"allocator,omitempty" yaml:"allocator,omitempty"`
	// Transforms name Wasm transform plugins, applied in order; each turns a message into
	// zero or more messages. Resolved by the Manager's Transforms function. Default none.
	Transforms []string `json:"transforms,omitempty" yaml:"transforms,omitempty"`
	// StartFrom is where reading begins for a queue the group has no offset for: "first",
	// "last" or "timestamp" (with StartTimestamp). Default "last". Committed offsets win.
	StartFrom string `json:"start_from,omitempty" yaml:"start_from,omitempty"`
	// StartTimestamp is the time StartFrom "timestamp" starts at. Required with it.
	StartTimestamp time.Time `json:"start_timestamp,omitzero" yaml:"start_timestamp,omitempty"`
	// Parallelism is the number of workers processing polled batches. A queue is always
	// processed by the same worker, so order within a queue is kept. Default 1.
	Parallelism int `json:"parallelism,omitempty" yaml:"parallelism,omitempty"`
	// MaxAttempts is how often the sink is tried with one message before the message is
	// sent back to the group's retry topic (%RETRY%<group>). Default 5.
	MaxAttempts int `json:"max_attempts,omitempty" yaml:"max_attempts,omitempty"`
	// RetryBackoff is the wait after the first failed attempt; it doubles after each further
	// one, up to MaxBackoff. Defaults 100ms and 5s.
	RetryBackoff Duration `json:"retry_backoff,omitempty" yaml:"retry_backoff,omitempty"`
	MaxBackoff   Duration `json:"max_backoff,omitempty" yaml:"max_backoff,omitempty"`
	// RetryDelayLevel is the delay level of a message sent back (1 is the broker's shortest
	// delay); 0 lets the broker choose from the number of earlier attempts. Default 0.
	RetryDelayLevel int `json:"retry_delay_level,omitempty" yaml:"retry_delay_level,omitempty"`
	// MaxReconsumeTimes is how often a message may be sent back before the broker moves it
	// to the group's dead-letter topic (%DLQ%<group>). Default: the broker's setting.
	MaxReconsumeTimes int `json:"max_reconsume_times,omitempty" yaml:"max_reconsume_times,omitempty"`
	// PullBatchSize caps the messages of one polled batch, and so the uncommitted window of
	// a queue. Default: the consumer's (32).
	PullBatchSize int `json:"pull_batch_size,omitempty" yaml:"pull_batch_size,omitempty"`
	// Sink is where the messages go. Required.
	Sink SinkDefinition `json:"sink" yaml:"sink"`
}

// Selector is a broker-side filter: a tag expression, a SQL92 expression on properties, or
// the name (or name@version) of a deployed Wasm filter plugin.
type Selector struct {
	// Type is TAG, SQL92 or WASM. Default TAG.
	Type string `json:"type,omitempty" yaml:"type,omitempty"`
	// Expression is the expression of Type. Default "*" for TAG; required otherwise.
	Expression string `json:"expression,omitempty" yaml:"expression,omitempty"`
}

// SinkDefinition says where a pipeline writes. Type picks the fields that apply.
type SinkDefinition struct {
	// Type is topic, nats, webhook, file or stdout. Required.
	Type string `json:"type" yaml:"type"`

	// Topic (type topic) is the destination topic. Required for topic.
	Topic string `json:"topic,omitempty" yaml:"topic,omitempty"`
	// NameServers (type topic) are a remote RocketMQ cluster's name servers; default the
	// Manager's own (this flowd).
	NameServers []string `json:"name_servers,omitempty" yaml:"name_servers,omitempty"`
	// CreateQueues (type topic), when positive, has a Topic that does not exist created at
	// start with that many queues on every broker of the sink's cluster. Default 0: a Topic
	// that does not exist fails the start (ErrNoSinkTopic), so that a mistyped topic is not
	// silently created. An existing topic is left as it is.
	CreateQueues int `json:"create_queues,omitempty" yaml:"create_queues,omitempty"`

	// Subject (type nats) is the NATS subject. Required for nats.
	Subject string `json:"subject,omitempty" yaml:"subject,omitempty"`
	// JetStream (type nats): "auto" publishes through JetStream, waiting for its ack, when
	// a stream holds Subject (asked once at start); "always" and "never" force the choice.
	// Default "auto". JetStream publishes carry the record's MsgID as Nats-Msg-Id, so the
	// stream drops the copies a restart delivers again within its duplicate window (a
	// replay after a seek within that window is dropped too).
	JetStream string `json:"jetstream,omitempty" yaml:"jetstream,omitempty"`

	// URL (type webhook) is the http or https endpoint each message is POSTed to as JSON;
	// a 2xx answer acknowledges it. Required for webhook.
	URL string `json:"url,omitempty" yaml:"url,omitempty"`
	// Headers (type webhook) are added to every request. Default none.
	Headers map[string]string `json:"headers,omitempty" yaml:"headers,omitempty"`

	// Path (type file) is the file JSON lines are appended to. Required for file.
	Path string `json:"path,omitempty" yaml:"path,omitempty"`

	// Timeout bounds one delivery attempt. Default 10s.
	Timeout Duration `json:"timeout,omitempty" yaml:"timeout,omitempty"`
}

// WithDefaults returns d with every unset optional field at its default.
func (d Definition) WithDefaults() Definition {
	if d.Group == "" {
		d.Group = "pipeline-" + d.Name
	}
	if d.Selector.Type == "" {
		d.Selector.Type = SelectorTag
	}
	if d.Selector.Type == SelectorTag && d.Selector.Expression == "" {
		d.Selector.Expression = "*"
	}
	if d.Allocator == "" {
		d.Allocator = "AVG"
	}
	if d.StartFrom == "" {
		d.StartFrom = StartLast
	}
	if d.Parallelism == 0 {
		d.Parallelism = DefaultParallelism
	}
	if d.MaxAttempts == 0 {
		d.MaxAttempts = DefaultMaxAttempts
	}
	if d.RetryBackoff == 0 {
		d.RetryBackoff = Duration(DefaultRetryBackoff)
	}
	if d.MaxBackoff == 0 {
		d.MaxBackoff = Duration(DefaultMaxBackoff)
	}
	if d.Sink.Timeout == 0 {
		d.Sink.Timeout = Duration(DefaultSinkTimeout)
	}
	if d.Sink.Type == SinkNATS && d.Sink.JetStream == "" {
		d.Sink.JetStream = "auto"
	}
	return d
}
