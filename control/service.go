package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/fields"
	"github.com/flowd-io/flowd/internal/subjects"
	"github.com/flowd-io/flowd/pipeline"
	"github.com/flowd-io/flowd/plugins"
)

// ServiceName is the name of the command service: `nats req '$SRV.PING.flowd' ”` finds
// every node's instance.
const ServiceName = "flowd"

// ServiceVersion is the command service's version in discovery. The subjects carry the API
// version (v1) separately; this one changes with the schemas.
const ServiceVersion = "1.0.0"

// SubjectPrefix is the root of every command subject:
// SubjectPrefix + "." + <cluster> + "." + <noun> + "." + <verb>.
const SubjectPrefix = "flowd.ctl.v1"

// Error codes of command replies, in the Nats-Service-Error-Code header. They follow HTTP's
// meanings so that they read at a glance.
const (
	CodeBadRequest = 400 // the request is not valid JSON, names an unknown field, or a value is out of range
	CodeDisabled   = 403 // the command is disabled by ServiceConfig.Disabled
	CodeNotFound   = 404 // the topic, group or message does not exist
	CodeConflict   = 409 // the topic exists already
	CodeTooLarge   = 413 // the reply would not fit the connection's max payload
	CodeInternal   = 500 // the broker failed
)

// ServiceConfig configures the command service. The zero value works with a broker: every
// default is taken from it.
type ServiceConfig struct {
	// Cluster is the cluster name in every subject and reply, and in the service metadata.
	// It must be a single NATS subject token (internal/subjects.Token: no ".", "*", ">" or
	// white space, no leading "$"). Default: the
	// broker's cluster (broker.Config.Cluster, itself "local" by default).
	Cluster string

	// Node names this node in every reply and in the service metadata. Default: the
	// broker's name (broker.Config.BrokerName, "broker-a" by default).
	Node string

	// Disabled lists commands that are refused: "noun.verb" (e.g. "topic.delete") or
	// "noun.*" (e.g. "group.*"). A disabled command stays registered, so discovery still
	// lists it (with the metadata "disabled": "true"), and answers every request with error
	// 403, which tells an operator why rather than leaving a request without responders.
	// Unknown commands or nouns are a StartService error, so a typo does not leave a command
	// enabled. Default: none.
	Disabled []string

	// RateInterval is how often the topics' max offsets are sampled for the per-topic
	// message rates in the service's STATS. Default 10 s.
	RateInterval time.Duration

	// RequestTimeout bounds the broker work of one command, such as telling a group's live
	// members about an offset reset. Default 5 s.
	RequestTimeout time.Duration

	// Logger receives the service's logs. Default slog.Default().
	Logger *slog.Logger

	// Plugins is the registry the plugin commands (plugin.deploy, plugin.list,
	// plugin.activate, plugin.remove) work on. Default nil: those commands are not served.
	Plugins *plugins.Registry

	// PluginEvents, when set, is told of every deploy, activation and removal the plugin
	// commands make (the daemon publishes them with Publisher.Plugin). It must not block.
	// Default nil.
	PluginEvents func(PluginEvent)

	// Pipelines is what the pipeline commands (pipeline.list, pipeline.pause,
	// pipeline.resume, pipeline.seek) work on: the daemon's pipeline.Manager. Default nil:
	// those commands are not served.
	Pipelines pipeline.Controller

	// PipelineDefinitions is what pipeline.create and pipeline.delete work on: the
	// definitions the daemon shares through JetStream KV. Default nil: those two commands
	// are not served (the other pipeline commands are, with Pipelines).
	PipelineDefinitions PipelineDefinitions

	// Membership is what cluster.status reports of the node's membership in a cluster of
	// brokers (the daemon's cluster member). Default nil: the node serves alone, and
	// cluster.status answers with its broker alone and "clustered": false.
	Membership ClusterInfo

	// NATS is the embedded server whose NATS cluster cluster.status reports
	// (NATS.ClusterState). Default nil: the reply has no NATS state.
	NATS *NATS
}

func (c ServiceConfig) withDefaults(b *broker.Broker) ServiceConfig {
	st := b.Status()
	if c.Cluster == "" {
		c.Cluster = st.Cluster
	}
	if c.Node == "" {
		c.Node = st.BrokerName
	}
	if c.RateInterval <= 0 {
		c.RateInterval = 10 * time.Second
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Service is the running command service of one node. Create it with StartService; Stop
// ends it.
type Service struct {
	cfg    ServiceConfig
	nc     *nats.Conn
	b      *broker.Broker
	log    *slog.Logger
	svc    micro.Service
	rates  *rateSampler
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// statsEndpoint is the name of the endpoint whose STATS data carries the group lags and
	// topic rates: broker-status, or the first endpoint when that one is disabled.
	statsEndpoint string

	stopOnce sync.Once
	stopErr  error
}

// command is one endpoint: a noun, a verb and the handler that serves it.
type command struct {
	noun, verb string
	handle     func(s *Service, ctx context.Context, data []byte) (any, error)
}

func (c command) name() string { return c.noun + "." + c.verb }

// commands lists every command, in the order they are registered.
func commands() []command {
	return []command{
		{"topic", "create", (*Service).topicCreate},
		{"topic", "update", (*Service).topicUpdate},
		{"topic", "delete", (*Service).topicDelete},
		{"topic", "list", (*Service).topicList},
		{"topic", "describe", (*Service).topicDescribe},
		{"group", "list", (*Service).groupList},
		{"group", "describe", (*Service).groupDescribe},
		{"group", "reset_offset", (*Service).groupResetOffset},
		{"message", "get", (*Service).messageGet},
		{"message", "query", (*Service).messageQuery},
		{"message", "browse", (*Service).messageBrowse},
		{"message", "search", (*Service).messageSearch},
		{"message", "send", (*Service).messageSend},
		{"broker", "status", (*Service).brokerStatus},
		{"cluster", "status", (*Service).clusterStatus},
		{"plugin", "deploy", (*Service).pluginDeploy},
		{"plugin", "list", (*Service).pluginList},
		{"plugin", "activate", (*Service).pluginActivate},
		{"plugin", "remove", (*Service).pluginRemove},
		{"pipeline", "list", (*Service).pipelineList},
		{"pipeline", "pause", (*Service).pipelinePause},
		{"pipeline", "resume", (*Service).pipelineResume},
		{"pipeline", "seek", (*Service).pipelineSeek},
		{"pipeline", "create", (*Service).pipelineCreate},
		{"pipeline", "delete", (*Service).pipelineDelete},
	}
}

// served is the commands a service with cfg registers: the plugin commands only with a
// registry, the pipeline commands only with a pipeline controller.
func served(cfg ServiceConfig) []command {
	var out []command
	for _, c := range commands() {
		if c.noun == "plugin" && cfg.Plugins == nil {
			continue
		}
		if c.noun == "pipeline" && cfg.Pipelines == nil {
			continue
		}
		if c.noun == "pipeline" && (c.verb == "create" || c.verb == "delete") && cfg.PipelineDefinitions == nil {
			continue
		}
		out = append(out, c)
	}
	return out
}

// Commands returns the name ("noun.verb") of every command the service can serve, in the
// order they are registered; the plugin commands are served only when
// ServiceConfig.Plugins is set, the pipeline commands only when ServiceConfig.Pipelines is (pipeline.create and
// pipeline.delete when ServiceConfig.PipelineDefinitions is too). Their subjects are SubjectPrefix.<cluster>.<noun>.<verb>.
func Commands() []string {
	var out []string
	for _, c := range commands() {
		out = append(out, c.name())
	}
	return out
}

// disabledSet checks the Disabled entries against the commands and returns the disabled
// command names.
func disabledSet(entries []string, cmds []command) (map[string]bool, error) {
	out := map[string]bool{}
	for _, e := range entries {
		noun, verb, ok := strings.Cut(e, ".")
		matched := false
		for _, c := range cmds {
			if ok && c.noun == noun && (verb == "*" || verb == c.verb) {
				out[c.name()] = true
				matched = true
			}
		}
		if !matched {
			return nil, fmt.Errorf("disabled command %q: no such command (want noun.verb or noun.*)", e)
		}
	}
	return out, nil
}

// StartService registers the micro service "flowd" on nc, with one endpoint per command at
// flowd.ctl.v1.<cluster>.<noun>.<verb>, and starts sampling topic rates. Requests are served
// on nc's subscription goroutines until Stop (or until nc closes). ctx is the parent of every
// command's context: cancelling it fails the commands still working and stops the rate
// sampler, but only Stop unregisters the service.
func StartService(ctx context.Context, nc *nats.Conn, b *broker.Broker, cfg ServiceConfig) (*Service, error) {
	if nc == nil || b == nil {
		return nil, errors.New("start control service: a NATS connection and a broker are required")
	}
	cfg = cfg.withDefaults(b)
	if err := subjects.Token(cfg.Cluster); err != nil {
		return nil, fmt.Errorf("start control service: cluster: %w", err)
	}
	cmds := served(cfg)
	disabled, err := disabledSet(cfg.Disabled, cmds)
	if err != nil {
		return nil, fmt.Errorf("start control service: %w", err)
	}
	s := &Service{cfg: cfg, nc: nc, b: b, log: cfg.Logger.With("component", "control")}
	s.ctx, s.cancel = context.WithCancel(ctx)
	s.rates = newRateSampler(b)
	s.statsEndpoint = endpointName(cmds[0])
	for _, c := range cmds {
		if c.name() == "broker.status" && !disabled[c.name()] {
			s.statsEndpoint = endpointName(c)
		}
	}
	s.svc, err = micro.AddService(nc, micro.Config{
		Name:        ServiceName,
		Version:     ServiceVersion,
		Description: "flowd control plane: topics, groups, offsets, messages, status, cluster, plugins, pipelines",
		Metadata:    map[string]string{"cluster": cfg.Cluster, "node": cfg.Node},
		StatsHandler: func(ep *micro.Endpoint) any {
			if ep.Name != s.statsEndpoint {
				return nil
			}
			return s.statsData()
		},
		ErrorHandler: func(_ micro.Service, err *micro.NATSError) {
			s.log.Warn("control service error", "subject", err.Subject, "err", err.Description)
		},
	})
	if err != nil {
		s.cancel()
		return nil, fmt.Errorf("start control service: %w", err)
	}
	for _, c := range cmds {
		meta := map[string]string{"read_only": strconv.FormatBool(IsReadOnly(c.verb))}
		h := s.handler(c)
		if disabled[c.name()] {
			meta["disabled"] = "true"
			h = s.disabledHandler(c)
		}
		subject := strings.Join([]string{SubjectPrefix, cfg.Cluster, c.noun, c.verb}, ".")
		if err := s.svc.AddEndpoint(endpointName(c), h, micro.WithEndpointSubject(subject), micro.WithEndpointMetadata(meta)); err != nil {
			s.svc.Stop()
			s.cancel()
			return nil, fmt.Errorf("start control service: endpoint %s: %w", c.name(), err)
		}
	}
	if err := s.addNodeEndpoints(cmds, disabled); err != nil {
		s.svc.Stop()
		s.cancel()
		return nil, fmt.Errorf("start control service: %w", err)
	}
	// The subscriptions are sent to the server asynchronously; flushing makes them active
	// before StartService returns, so a request sent right after it finds its responder.
	fctx, fcancel := context.WithTimeout(ctx, cfg.RequestTimeout)
	err = nc.FlushWithContext(fctx)
	fcancel()
	if err != nil {
		s.svc.Stop()
		s.cancel()
		return nil, fmt.Errorf("start control service: flush subscriptions: %w", err)
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.rates.run(s.ctx, cfg.RateInterval)
	}()
	s.log.Info("control service started", "cluster", cfg.Cluster, "node", cfg.Node, "subjects", SubjectPrefix+"."+cfg.Cluster+".>", "disabled", len(disabled))
	return s, nil
}

// endpointName is the name discovery shows for a command: "noun-verb" (endpoint names may
// not contain dots).
func endpointName(c command) string { return c.noun + "-" + c.verb }

// Subject returns the subject of a command ("topic.create") in this service's cluster.
func (s *Service) Subject(command string) string {
	return SubjectPrefix + "." + s.cfg.Cluster + "." + command
}

// Stop unregisters the service (draining its subscriptions, so requests already received
// are answered) and stops the rate sampler. When it returns the server no longer routes
// requests to this node. It does not close the NATS connection.
func (s *Service) Stop() error {
	s.stopOnce.Do(func() {
		if err := s.svc.Stop(); err != nil {
			s.stopErr = fmt.Errorf("stop control service: %w", err)
		}
		// Stop drains the subscriptions in the background; a flush has the server forget
		// them before Stop returns, so no new request reaches this node after it.
		if err := s.nc.FlushTimeout(s.cfg.RequestTimeout); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && s.stopErr == nil {
			s.stopErr = fmt.Errorf("stop control service: flush: %w", err)
		}
		s.cancel()
		s.wg.Wait()
	})
	return s.stopErr
}

// Origin names the node that answered; every reply starts with it.
type Origin struct {
	Node    string `json:"node"`
	Cluster string `json:"cluster"`
}

func (s *Service) origin() Origin { return Origin{Node: s.cfg.Node, Cluster: s.cfg.Cluster} }

// decode reads a request into v: one JSON object (an empty body counts as {}), no unknown
// fields, every value of the field's type. Errors are 400s naming the field.
func decode(data []byte, v any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		data = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return badRequest("the request must be one JSON object, and nothing after it")
	}
	return nil
}

// jsonError is the 400 of a request that did not decode: a field error for a value of the
// wrong type or an unknown field (named by fields.FromJSON, as a manifest's are), else what
// is wrong with the whole request.
func jsonError(err error) error {
	if fe := fields.FromJSON(nil, err); fe != nil {
		return fieldReply(fe, "")
	}
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		return badRequest("the request must be a JSON object, not %s", typeErr.Value)
	case errors.As(err, &syntaxErr):
		return badRequest("the request is not valid JSON: %s (at byte %d)", syntaxErr, syntaxErr.Offset)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("the request is not valid JSON: it ends early")
	}
	return badRequest("the request is not valid: %s", err)
}

// StatsData is the data of the service's STATS, carried by the broker-status endpoint (or,
// when that is disabled, the first endpoint): every group's lag and every topic's rate.
type StatsData struct {
	Origin
	// Groups is keyed by group name.
	Groups map[string]GroupStats `json:"groups"`
	// Topics is keyed by topic name.
	Topics map[string]TopicStats `json:"topics"`
}

// GroupStats is one group's line in StatsData.
type GroupStats struct {
	// Lag is the messages the group has still to consume, over all its topics and queues.
	Lag     int64 `json:"lag"`
	Members int   `json:"members"`
}

// TopicStats is one topic's line in StatsData.
type TopicStats struct {
	// Messages is the sum of the queues' max offsets: the messages ever stored.
	Messages int64 `json:"messages"`
	// Rate is the messages stored per second over the last sampling interval
	// (ServiceConfig.RateInterval); absent until a topic has been sampled twice.
	Rate *float64 `json:"rate,omitempty"`
}

func (s *Service) statsData() StatsData {
	out := StatsData{Origin: s.origin(), Groups: map[string]GroupStats{}, Topics: map[string]TopicStats{}}
	for _, g := range s.b.Groups() {
		gs := GroupStats{Members: g.Members}
		if info, err := s.b.DescribeGroup(g.Name); err == nil {
			gs.Lag = info.Lag
		}
		out.Groups[g.Name] = gs
	}
	rates := s.rates.snapshot()
	for _, tc := range s.b.Topics() {
		ts := TopicStats{Messages: topicMessages(s.b, tc.Name)}
		if r, ok := rates[tc.Name]; ok {
			ts.Rate = &r
		}
		out.Topics[tc.Name] = ts
	}
	return out
}

// topicMessages is the sum of a topic's queues' max offsets.
func topicMessages(b *broker.Broker, topic string) int64 {
	qs, err := b.TopicQueues(topic)
	if err != nil {
		return 0
	}
	var n int64
	for _, q := range qs {
		n += q.MaxOffset
	}
	return n
}

// rateSampler computes per-topic message rates from the topics' max offsets, sampled on a
// timer: the store counts messages per queue, so two samples and the time between them give
// a rate without any work on the send path.
type rateSampler struct {
	b *broker.Broker

	mu    sync.Mutex
	last  map[string]int64   // topic → messages at the last sample
	at    time.Time          // when the last sample was taken
	rates map[string]float64 // topic → messages per second over the last interval
}

func newRateSampler(b *broker.Broker) *rateSampler {
	return &rateSampler{b: b, rates: map[string]float64{}}
}

func (r *rateSampler) run(ctx context.Context, interval time.Duration) {
	r.sample(time.Now())
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			r.sample(now)
		}
	}
}

func (r *rateSampler) sample(now time.Time) {
	cur := map[string]int64{}
	for _, tc := range r.b.Topics() {
		cur[tc.Name] = topicMessages(r.b, tc.Name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rates := map[string]float64{}
	if r.last != nil {
		secs := now.Sub(r.at).Seconds()
		for name, n := range cur {
			if prev, ok := r.last[name]; ok && secs > 0 && n >= prev {
				rates[name] = float64(n-prev) / secs
			}
		}
	}
	r.last, r.at, r.rates = cur, now, rates
}

// snapshot returns the rates of the last interval.
func (r *rateSampler) snapshot() map[string]float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]float64, len(r.rates))
	for k, v := range r.rates {
		out[k] = v
	}
	return out
}

// rate returns one topic's rate, if it has one.
func (r *rateSampler) rate(topic string) (float64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.rates[topic]
	return v, ok
}
