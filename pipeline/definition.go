package pipeline

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
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
// YAML, so that config files stay readable.
type Duration time.Duration

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a duration string or a number of nanoseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n int64
		if err2 := json.Unmarshal(b, &n); err2 != nil {
			return fmt.Errorf("duration %s: %w", b, err)
		}
		*d = Duration(n)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %w", s, err)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes d as a duration string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// UnmarshalYAML reads a duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		// A type error, which yaml collects with the others of the document and passes on
		// as it is: the line says where the value is.
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: duration %q: %v", n.Line, n.Value, err)}}
	}
	*d = Duration(v)
	return nil
}

// Definition is everything that describes a pipeline: what it reads, what it does to each
// message and where it writes. It is plain data (a config file or a KV entry holds it);
// the resources it names (Wasm plugins, a NATS connection) are resolved by the Manager.
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

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)

// maxQueues is the most queues a topic may have on a flowd broker (broker.MaxQueues; the
// pipeline package is a client and does not import the broker).
const maxQueues = 1024

// FieldError names the field at fault in a Definition (it wraps ErrInvalidDefinition) or in
// a request such as a seek (it wraps ErrInvalidArgument), so that a caller can tell its
// user which one to fix with errors.As instead of reading the message apart.
type FieldError struct {
	// Field is the field's key path: "sink.topic", "topics[1]", "queue", "offset".
	Field string
	// Msg says what is wrong with it; empty when Err says it.
	Msg string
	// Err is the failure behind it, if any (consumer.ErrOffsetOutOfRange, …); errors.Is
	// sees it.
	Err error
	// kind is ErrInvalidDefinition or ErrInvalidArgument.
	kind error
}

// Detail says what is wrong with the field, without the field's name.
func (e *FieldError) Detail() string {
	if e.Msg == "" && e.Err != nil {
		return e.Err.Error()
	}
	return e.Msg
}

func (e *FieldError) Error() string {
	return e.sentinel().Error() + ": " + e.Field + ": " + e.Detail()
}

func (e *FieldError) sentinel() error {
	if e.kind == nil {
		return ErrInvalidDefinition
	}
	return e.kind
}

func (e *FieldError) Unwrap() []error {
	if e.Err == nil {
		return []error{e.sentinel()}
	}
	return []error{e.sentinel(), e.Err}
}

func invalid(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// badArgument is a request field in error: it wraps ErrInvalidArgument and err.
func badArgument(field string, err error) error {
	return &FieldError{Field: field, Err: err, kind: ErrInvalidArgument}
}

// FieldErrors returns the field errors err holds (those Validate joined), looking through
// the errors that wrap them.
func FieldErrors(err error) []*FieldError {
	var out []*FieldError
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case *FieldError:
			out = append(out, e)
		case interface{ Unwrap() []error }:
			for _, x := range e.Unwrap() {
				walk(x)
			}
		case interface{ Unwrap() error }:
			walk(e.Unwrap())
		}
	}
	walk(err)
	return out
}

// withDefaults returns d with every unset optional field at its default.
func (d Definition) withDefaults() Definition {
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

// problems collects the field errors of one definition.
type problems []error

func (p *problems) add(field, format string, args ...any) {
	*p = append(*p, invalid(field, format, args...))
}

// Validate checks d and returns nil or the errors of every field in error, joined
// (errors.Join); each is a *FieldError wrapping ErrInvalidDefinition and naming its field
// (FieldErrors lists them). Unset optional fields are valid (they take their defaults).
func (d Definition) Validate() error {
	var p problems
	if !nameRE.MatchString(d.Name) {
		p.add("name", "%q must be 1-128 letters, digits, '-', '_' or '.'", d.Name)
	}
	if len(d.Topics) == 0 {
		p.add("topics", "at least one topic is required")
	}
	for i, t := range d.Topics {
		if !nameRE.MatchString(t) {
			p.add(fmt.Sprintf("topics[%d]", i), "%q is not a valid topic name", t)
		}
	}
	for i, ns := range d.SourceNameServers {
		if err := validAddr(ns); err != nil {
			p.add(fmt.Sprintf("source_name_servers[%d]", i), "%q %v", ns, err)
		}
	}
	if d.Group != "" && !nameRE.MatchString(d.Group) {
		p.add("group", "%q is not a valid group name", d.Group)
	}
	switch d.Selector.Type {
	case "", SelectorTag:
	case SelectorSQL92, SelectorWasm:
		if strings.TrimSpace(d.Selector.Expression) == "" {
			p.add("selector.expression", "required for type %s", d.Selector.Type)
		}
	default:
		p.add("selector.type", "%q is not TAG, SQL92 or WASM", d.Selector.Type)
	}
	for i, t := range d.Transforms {
		if strings.TrimSpace(t) == "" {
			p.add(fmt.Sprintf("transforms[%d]", i), "empty plugin name")
		}
	}
	switch d.StartFrom {
	case "", StartFirst, StartLast:
		if !d.StartTimestamp.IsZero() {
			p.add("start_timestamp", "only with start_from %q", StartTimestamp)
		}
	case StartTimestamp:
		if d.StartTimestamp.IsZero() {
			p.add("start_timestamp", "required with start_from %q", StartTimestamp)
		}
	default:
		p.add("start_from", "%q is not first, last or timestamp", d.StartFrom)
	}
	d.validateRetries(&p)
	d.Sink.validate(&p)
	return errors.Join(p...)
}

// validateRetries checks the bounds of the retry and batching fields.
func (d Definition) validateRetries(p *problems) {
	if d.Parallelism < 0 || d.Parallelism > 1024 {
		p.add("parallelism", "%d is outside [1, 1024]", d.Parallelism)
	}
	if d.MaxAttempts < 0 {
		p.add("max_attempts", "%d is negative", d.MaxAttempts)
	}
	if d.RetryBackoff < 0 {
		p.add("retry_backoff", "%s is negative", time.Duration(d.RetryBackoff))
	}
	if d.MaxBackoff < 0 || (d.MaxBackoff > 0 && d.MaxBackoff < d.RetryBackoff) {
		p.add("max_backoff", "%s is negative or below retry_backoff", time.Duration(d.MaxBackoff))
	}
	if d.RetryDelayLevel < 0 {
		p.add("retry_delay_level", "%d is negative", d.RetryDelayLevel)
	}
	if d.MaxReconsumeTimes < 0 {
		p.add("max_reconsume_times", "%d is negative", d.MaxReconsumeTimes)
	}
	if d.PullBatchSize < 0 || d.PullBatchSize > 1024 {
		p.add("pull_batch_size", "%d is outside [1, 1024]", d.PullBatchSize)
	}
}

func (s SinkDefinition) validate(p *problems) {
	if s.Timeout < 0 {
		p.add("sink.timeout", "%s is negative", time.Duration(s.Timeout))
	}
	if s.CreateQueues != 0 && s.Type != SinkTopic {
		p.add("sink.create_queues", "only for sink type topic")
	}
	switch s.Type {
	case SinkTopic:
		if !nameRE.MatchString(s.Topic) {
			p.add("sink.topic", "%q is not a valid topic name", s.Topic)
		}
		for i, ns := range s.NameServers {
			if err := validAddr(ns); err != nil {
				p.add(fmt.Sprintf("sink.name_servers[%d]", i), "%q %v", ns, err)
			}
		}
		if s.CreateQueues < 0 || s.CreateQueues > maxQueues {
			p.add("sink.create_queues", "%d is outside [1, %d] (0: the topic must exist)", s.CreateQueues, maxQueues)
		}
	case SinkNATS:
		if s.Subject == "" || strings.ContainsAny(s.Subject, " \t\r\n") {
			p.add("sink.subject", "%q is not a valid NATS subject", s.Subject)
		}
		switch s.JetStream {
		case "", "auto", "always", "never":
		default:
			p.add("sink.jetstream", "%q is not auto, always or never", s.JetStream)
		}
	case SinkWebhook:
		u, err := url.Parse(s.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			p.add("sink.url", "%q is not an http(s) URL", s.URL)
		}
	case SinkFile:
		if s.Path == "" {
			p.add("sink.path", "required for a file sink")
		}
	case SinkStdout:
	case "":
		p.add("sink.type", "required")
	default:
		p.add("sink.type", "%q is not topic, nats, webhook, file or stdout", s.Type)
	}
}

// validAddr checks a name server address: host:port with a port in 1-65535.
func validAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return errors.New("is not host:port")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return errors.New("has no port in 1-65535")
	}
	return nil
}
