package pipeline

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/producer"
)

// Record is one message on its way to a sink: a source message as the transforms left it.
// Sinks that write JSON write it as shown by its tags.
type Record struct {
	// Topic, QueueID and QueueOffset say where the source message was read.
	Topic       string `json:"topic"`
	QueueID     int32  `json:"queue_id"`
	QueueOffset int64  `json:"queue_offset"`
	// MsgID is the source message's id; a transform's second and later outputs get
	// "-<index>" appended, so that every record has an id of its own (a NATS JetStream sink
	// deduplicates on it).
	MsgID      string            `json:"msg_id"`
	Tags       string            `json:"tags,omitempty"`
	Keys       []string          `json:"keys,omitempty"`
	Properties map[string]string `json:"properties,omitempty"`
	// Body is the body; in JSON it is a string when it is valid UTF-8, else BodyBase64 holds
	// it.
	Body []byte `json:"-"`
}

type recordJSON struct {
	Topic       string            `json:"topic"`
	QueueID     int32             `json:"queue_id"`
	QueueOffset int64             `json:"queue_offset"`
	MsgID       string            `json:"msg_id"`
	Tags        string            `json:"tags,omitempty"`
	Keys        []string          `json:"keys,omitempty"`
	Properties  map[string]string `json:"properties,omitempty"`
	Body        *string           `json:"body,omitempty"`
	BodyBase64  string            `json:"body_base64,omitempty"`
}

// MarshalJSON writes the body as text when it is UTF-8, as base64 otherwise.
func (r Record) MarshalJSON() ([]byte, error) {
	j := recordJSON{Topic: r.Topic, QueueID: r.QueueID, QueueOffset: r.QueueOffset, MsgID: r.MsgID, Tags: r.Tags, Keys: r.Keys, Properties: r.Properties}
	if utf8.Valid(r.Body) {
		s := string(r.Body)
		j.Body = &s
	} else {
		j.BodyBase64 = base64.StdEncoding.EncodeToString(r.Body)
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *Record) UnmarshalJSON(b []byte) error {
	var j recordJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*r = Record{Topic: j.Topic, QueueID: j.QueueID, QueueOffset: j.QueueOffset, MsgID: j.MsgID, Tags: j.Tags, Keys: j.Keys, Properties: j.Properties}
	switch {
	case j.Body != nil:
		r.Body = []byte(*j.Body)
	case j.BodyBase64 != "":
		body, err := base64.StdEncoding.DecodeString(j.BodyBase64)
		if err != nil {
			return fmt.Errorf("record body: %w", err)
		}
		r.Body = body
	}
	return nil
}

// Sink delivers records. Deliver returns nil only once the destination has acknowledged the
// record (stored, acked, answered 2xx, written): the pipeline commits offsets on that
// promise. It is called from several workers at once.
type Sink interface {
	Deliver(ctx context.Context, r *Record) error
	Close(ctx context.Context) error
}

// topicSink republishes to a topic through flowd's producer.
type topicSink struct {
	p     *producer.Producer
	topic string
}

func (s *topicSink) Deliver(ctx context.Context, r *Record) error {
	props := make(map[string]string, len(r.Properties))
	for k, v := range r.Properties {
		if !systemProperty(k) {
			props[k] = v
		}
	}
	_, err := s.p.Send(ctx, &producer.Message{Topic: s.topic, Tags: r.Tags, Keys: r.Keys, Properties: props, Body: r.Body})
	if err != nil {
		return fmt.Errorf("send to topic %s: %w", s.topic, err)
	}
	return nil
}

func (s *topicSink) Close(ctx context.Context) error { return s.p.Close(ctx) }

// systemProperty tells the properties the broker or the producer set on every message, which
// a republished copy gets afresh rather than inherits.
func systemProperty(k string) bool {
	switch k {
	case "TAGS", "KEYS", "UNIQ_KEY", "WAIT", "DELAY", "CLUSTER", "MIN_OFFSET", "MAX_OFFSET",
		"REAL_TOPIC", "REAL_QID", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "RECONSUME_TIME", "MAX_RECONSUME_TIMES",
		"TRAN_MSG", "PGROUP", "CONSUME_START_TIME":
		return true
	}
	return false
}

// natsSink publishes to a subject, through JetStream (waiting for the stream's ack) or core
// NATS (flushing, so that the server has the message before it counts as delivered).
type natsSink struct {
	nc      *nats.Conn
	js      jetstream.JetStream // nil for core NATS
	subject string
}

func newNATSSink(ctx context.Context, nc *nats.Conn, def SinkDefinition) (*natsSink, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: sink.type nats needs the Manager's NATS connection", ErrUnavailable)
	}
	s := &natsSink{nc: nc, subject: def.Subject}
	useJS := def.JetStream == "always"
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("nats sink %s: jetstream: %w", def.Subject, err)
	}
	if def.JetStream == "auto" {
		_, err := js.StreamNameBySubject(ctx, def.Subject)
		switch {
		case err == nil:
			useJS = true
		case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		default:
			return nil, fmt.Errorf("nats sink %s: find stream: %w", def.Subject, err)
		}
	}
	if useJS {
		s.js = js
	}
	return s, nil
}

func (s *natsSink) Deliver(ctx context.Context, r *Record) error {
	m := nats.NewMsg(s.subject)
	m.Data = r.Body
	for k, v := range r.Properties {
		m.Header.Set(k, v)
	}
	m.Header.Set("Flowd-Topic", r.Topic)
	if r.Tags != "" {
		m.Header.Set("Flowd-Tags", r.Tags)
	}
	if len(r.Keys) > 0 {
		m.Header.Set("Flowd-Keys", strings.Join(r.Keys, " "))
	}
	if s.js != nil {
		if r.MsgID != "" {
			m.Header.Set(jetstream.MsgIDHeader, r.MsgID)
		}
		if _, err := s.js.PublishMsg(ctx, m); err != nil {
			return fmt.Errorf("jetstream publish to %s: %w", s.subject, err)
		}
		return nil
	}
	if err := s.nc.PublishMsg(m); err != nil {
		return fmt.Errorf("publish to %s: %w", s.subject, err)
	}
	if err := s.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("flush %s: %w", s.subject, err)
	}
	return nil
}

func (s *natsSink) Close(context.Context) error { return nil }

// webhookSink POSTs each record as JSON; a 2xx answer acknowledges it.
type webhookSink struct {
	client  *http.Client
	url     string
	headers map[string]string
}

// StatusError is a webhook's answer other than 2xx.
type StatusError struct {
	URL    string
	Status int
}

func (e *StatusError) Error() string {
	return "webhook " + e.URL + " answered " + strconv.Itoa(e.Status)
}

func (s *webhookSink) Deliver(ctx context.Context, r *Record) error {
	body, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode record %s: %w", r.MsgID, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("webhook request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range s.headers {
		req.Header.Set(k, v)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("webhook post: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return &StatusError{URL: s.url, Status: resp.StatusCode}
	}
	return nil
}

func (s *webhookSink) Close(context.Context) error { return nil }

// writerSink writes JSON lines; a line is delivered once written (and, for a file,
// synced).
type writerSink struct {
	mu     sync.Mutex
	w      io.Writer
	file   *os.File // set when the sink owns a file
	closed bool
}

func (s *writerSink) Deliver(_ context.Context, r *Record) error {
	line, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode record %s: %w", r.MsgID, err)
	}
	line = append(line, '\n')
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("write record %s: %w", r.MsgID, os.ErrClosed)
	}
	if _, err := s.w.Write(line); err != nil {
		return fmt.Errorf("write record %s: %w", r.MsgID, err)
	}
	if s.file != nil {
		if err := s.file.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", s.file.Name(), err)
		}
	}
	return nil
}

func (s *writerSink) Close(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.file != nil {
		if err := s.file.Close(); err != nil {
			return fmt.Errorf("close %s: %w", s.file.Name(), err)
		}
	}
	return nil
}

// newSink opens the sink def describes.
func (m *Manager) newSink(ctx context.Context, name string, def SinkDefinition) (Sink, error) {
	timeout := time.Duration(def.Timeout)
	switch def.Type {
	case SinkTopic:
		ns := def.NameServers
		if len(ns) == 0 {
			ns = m.opts.NameServers
		}
		if err := ensureTopic(ctx, ns, def, m.log); err != nil {
			return nil, fmt.Errorf("topic sink %s: %w", def.Topic, err)
		}
		opts := append([]producer.Option{producer.WithClientOptions(client.WithNameServers(ns...), client.WithLogger(m.log)), producer.WithSendTimeout(timeout)}, m.opts.ProducerOptions...)
		p, err := producer.New("pipeline-"+name, opts...)
		if err != nil {
			return nil, fmt.Errorf("topic sink %s: %w", def.Topic, err)
		}
		if err := p.Start(ctx); err != nil {
			return nil, fmt.Errorf("topic sink %s: start producer: %w", def.Topic, err)
		}
		return &topicSink{p: p, topic: def.Topic}, nil
	case SinkNATS:
		return newNATSSink(ctx, m.opts.NATS, def)
	case SinkWebhook:
		hc := m.opts.HTTPClient
		if hc == nil {
			hc = &http.Client{Timeout: timeout}
		}
		return &webhookSink{client: hc, url: def.URL, headers: def.Headers}, nil
	case SinkFile:
		f, err := os.OpenFile(def.Path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("file sink: %w", err)
		}
		return &writerSink{w: f, file: f}, nil
	case SinkStdout:
		w := m.opts.Stdout
		if w == nil {
			w = os.Stdout
		}
		return &writerSink{w: w}, nil
	}
	return nil, invalid("sink.type", "%q", def.Type)
}
