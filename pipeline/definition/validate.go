package definition

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/flowd-io/flowd/fields"
	"github.com/flowd-io/flowd/internal/subjects"
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)

// maxQueues is the most queues a topic may have on a flowd broker (broker.MaxQueues; the
// pipeline package is a client and does not import the broker).
const maxQueues = 1024

// FieldError names the field at fault in a Definition (its Kind is ErrInvalidDefinition) or
// in a request such as a pipeline seek (its Kind is the sentinel the request's package
// gives it, pipeline.ErrInvalidArgument), so that a caller can tell its user which one to
// fix with errors.As instead of reading the message apart. It is the field error of the
// daemon's config and of plugin manifests too.
type FieldError = fields.Error

func invalid(field, format string, args ...any) error {
	return fields.Errorf(ErrInvalidDefinition, field, format, args...)
}

// FieldErrors returns the field errors err holds (those Validate joined), looking through
// the errors that wrap them.
func FieldErrors(err error) []*FieldError { return fields.Errors(err) }

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
		if err := subjects.Literal(s.Subject); err != nil {
			p.add("sink.subject", "%v", err)
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
