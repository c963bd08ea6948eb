package control

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/flowd-io/flowd/fields"
	"github.com/flowd-io/flowd/internal/subjects"
)

// Gathering. In a cluster (ServiceConfig.Membership set) every node also serves the
// gathered commands on a subject of its own,
// flowd.ctl.v1.<cluster>.node.<node>.<noun>.<verb>, answered from that node alone. The node
// that receives a gathered command on the shared subject asks every other live broker of
// its registry copy there, in parallel and within a bound, and merges their answers with
// its own: one request answers for the cluster, and says which nodes did not answer.

// DefaultGatherTimeout bounds the wait for the other nodes' answers when a request gives no
// timeout: long enough for a loaded node, short enough that a stalled one does not hold
// the reply.
const DefaultGatherTimeout = 2 * time.Second

// maxGatherTimeout is the longest timeout a request may ask for.
const maxGatherTimeout = time.Minute

// gatheredCommand reports whether a command is answered for the cluster.
func gatheredCommand(name string) bool {
	switch name {
	case "topic.list", "group.list", "group.describe", "broker.status", "cluster.status":
		return true
	}
	return false
}

// Scope is what a gathered command's request may add (its fields are the request's own,
// "local" and "timeout"): an answer from the receiving node alone, or a bound on the wait
// for the others.
type Scope struct {
	// Local asks for the receiving node's answer alone, in the shape of a single node's.
	Local bool `json:"local,omitempty"`
	// Timeout bounds the wait for the other nodes ("500ms", "5s"; at most a minute).
	// Default DefaultGatherTimeout.
	Timeout *fields.Duration `json:"timeout,omitempty"`
}

// Coverage says which nodes a gathered reply covers. Its fields are absent from the reply
// of a node that is not clustered and from a local one, so that those keep a single node's
// shape.
type Coverage struct {
	// Answered lists the nodes whose answers are merged, the receiving node's included, by
	// name.
	Answered []string `json:"answered,omitempty"`
	// Missing lists the live nodes of the registry that did not answer within the bound, or
	// answered with an error, by name; absent when every node answered.
	Missing []string `json:"missing,omitempty"`
	// MissingReasons says, for each missing node, why ("no answer within 2s").
	MissingReasons map[string]string `json:"missing_reasons,omitempty"`
}

// nodeRequestKey marks the context of a request received on a node's own subject.
type nodeRequestKey struct{}

// isNodeRequest reports whether ctx is a request on a node's own subject, which that node
// answers alone (it never gathers again).
func isNodeRequest(ctx context.Context) bool { return ctx.Value(nodeRequestKey{}) != nil }

// NodeSubject returns the subject on which node answers command ("topic.list") alone, in
// cluster: SubjectPrefix.<cluster>.node.<node>.<noun>.<verb>. Only gathered commands have one.
func NodeSubject(cluster, node, command string) string {
	return strings.Join([]string{SubjectPrefix, cluster, "node", subjects.Escape(node), command}, ".")
}

// addNodeEndpoints registers, on a clustered node, each gathered command of cmds at the
// node's own subject: a disabled command is disabled there too.
func (s *Service) addNodeEndpoints(cmds []command, disabled map[string]bool) error {
	if s.cfg.Membership == nil {
		return nil
	}
	for _, c := range cmds {
		if !gatheredCommand(c.name()) {
			continue
		}
		meta := map[string]string{"read_only": strconv.FormatBool(IsReadOnly(c.verb)), "node_only": "true"}
		h := s.nodeHandler(c)
		if disabled[c.name()] {
			meta["disabled"] = "true"
			h = s.disabledHandler(c)
		}
		subject := NodeSubject(s.cfg.Cluster, s.cfg.Node, c.name())
		if err := s.svc.AddEndpoint("node-"+endpointName(c), h, micro.WithEndpointSubject(subject), micro.WithEndpointMetadata(meta)); err != nil {
			return fmt.Errorf("endpoint %s of node %s: %w", c.name(), s.cfg.Node, err)
		}
	}
	return nil
}

// nodeHandler serves c on the node's own subject: answered by this node alone.
func (s *Service) nodeHandler(c command) micro.Handler {
	local := c
	local.handle = func(s *Service, ctx context.Context, data []byte) (any, error) {
		return c.handle(s, context.WithValue(ctx, nodeRequestKey{}, true), data)
	}
	return s.handler(local)
}

// gathers reports whether a request of scope sc is answered for the cluster, and within
// which bound; a timeout out of range is a 400 on every node, clustered or not.
func (s *Service) gathers(ctx context.Context, sc Scope) (bool, time.Duration, error) {
	bound := DefaultGatherTimeout
	if sc.Timeout != nil {
		bound = time.Duration(*sc.Timeout)
		if bound <= 0 || bound > maxGatherTimeout {
			return false, 0, badField("timeout", "must be more than 0 and at most %v, not %v", maxGatherTimeout, bound)
		}
	}
	if sc.Local || s.cfg.Membership == nil || isNodeRequest(ctx) {
		return false, 0, nil
	}
	return true, bound, nil
}

// answer is one node's answer to a gathered command: its reply, or that it knows nothing
// of what was asked (a 404).
type answer[T any] struct {
	node, broker string
	reply        T
	notFound     bool
}

// gatherFrom asks every other live broker of the registry for command on its node's own
// subject, with the request's data, in parallel, and waits at most bound for them. It
// returns the answers by broker name and the coverage (this node among the answered).
func gatherFrom[T any](s *Service, command string, data []byte, bound time.Duration) ([]answer[T], Coverage) {
	self := s.b.Status().BrokerName
	var peers []ClusterBroker
	for _, b := range s.cfg.Membership.ClusterMembership().Brokers {
		if b.Name != self {
			peers = append(peers, b)
		}
	}
	slices.SortFunc(peers, func(x, y ClusterBroker) int { return cmp.Compare(x.Name, y.Name) })
	ctx, cancel := context.WithTimeout(s.ctx, bound)
	defer cancel()
	answers := make([]answer[T], len(peers))
	reasons := make([]string, len(peers))
	var wg sync.WaitGroup
	for i, p := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i], reasons[i] = ask[T](ctx, s, p, command, data, bound)
		}()
	}
	wg.Wait()
	cov := Coverage{Answered: []string{s.cfg.Node}}
	var out []answer[T]
	for i, a := range answers {
		if reasons[i] == "" {
			cov.Answered = append(cov.Answered, a.node)
			out = append(out, a)
			continue
		}
		if cov.MissingReasons == nil {
			cov.MissingReasons = map[string]string{}
		}
		cov.Missing = append(cov.Missing, a.node)
		cov.MissingReasons[a.node] = reasons[i]
		s.log.Warn("control: a node did not answer a gathered command", "command", command, "node", a.node, "reason", reasons[i])
	}
	slices.Sort(cov.Answered)
	slices.Sort(cov.Missing)
	return out, cov
}

// ask sends command to one node and returns its answer, or why it has none.
func ask[T any](ctx context.Context, s *Service, to ClusterBroker, command string, data []byte, bound time.Duration) (answer[T], string) {
	a := answer[T]{node: cmp.Or(to.Node, to.Name), broker: to.Name}
	msg, err := s.nc.RequestWithContext(ctx, NodeSubject(s.cfg.Cluster, a.node, command), data)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return a, "no responders: its control service is not running"
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
		return a, fmt.Sprintf("no answer within %v", bound)
	case err != nil:
		return a, err.Error()
	}
	if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
		if code == strconv.Itoa(CodeNotFound) {
			a.notFound = true
			return a, ""
		}
		return a, code + " " + msg.Header.Get(micro.ErrorHeader)
	}
	if err := json.Unmarshal(msg.Data, &a.reply); err != nil {
		return a, fmt.Sprintf("unreadable answer: %v", err)
	}
	return a, ""
}

// missingNote is what an error of a gathered command adds about the nodes that did not
// answer: they might have known better.
func missingNote(cov Coverage) string {
	if len(cov.Missing) == 0 {
		return ""
	}
	return " (nodes that did not answer: " + strings.Join(cov.Missing, ", ") + ")"
}
