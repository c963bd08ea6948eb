package client

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/flowd-io/flowd/internal/clientcore"
)

// Defaults of the options. The core they configure keeps them, so that every client of
// flowd's, the daemon's own included, has the same.
const (
	// DefaultHeartbeatInterval, 10 s, is how often a Client heartbeats the brokers it knows
	// (WithHeartbeatInterval).
	DefaultHeartbeatInterval = clientcore.DefaultHeartbeatInterval
	// DefaultRouteRefreshInterval, 30 s, is how often cached routes are fetched again
	// (WithRouteRefreshInterval).
	DefaultRouteRefreshInterval = clientcore.DefaultRouteRefreshInterval
	// DefaultRequestTimeout, 3 s, bounds a request whose context has no deadline
	// (WithRequestTimeout).
	DefaultRequestTimeout = clientcore.DefaultRequestTimeout
	// DefaultDialTimeout, 3 s, bounds connecting to a broker or name server
	// (WithDialTimeout).
	DefaultDialTimeout = clientcore.DefaultDialTimeout
)

// Option configures a Client: pass options to New, or to producer.WithClientOptions and
// consumer.WithClientOptions for the client a producer or consumer builds for itself.
type Option func(*settings) error

// settings is what the options set: the core's options, kept out of the public API.
type settings struct{ core clientcore.Options }

func positive(name string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%w: %s must be positive, got %v", ErrInvalidOption, name, d)
	}
	return nil
}

// WithNameServers adds name-server addresses, "host:port"; an entry may also hold several
// separated by ';' (RocketMQ's namesrvAddr form). Required.
//
// The Client asks the name servers for topic routes, starting with the one that answered
// last and moving on to the next when one fails to answer (a refusal, such as an unknown
// topic, is an answer). Brokers are dialed at the addresses the routes give.
func WithNameServers(addrs ...string) Option {
	return func(s *settings) error {
		s.core.NameServers = append(s.core.NameServers, addrs...)
		return nil
	}
}

// WithInstanceName sets the instance part of the client id, "ip@instance". The client id is
// how brokers tell clients apart: it names the members of a consumer group, orders them for
// queue allocation, and names the requester of a request-reply call.
//
// Default: the process id followed by a random suffix ("12345#9f1c2a7b"), unique per Client.
// RocketMQ defaults to the bare process id, which would make two Clients of one process the
// same member of a group; give two Clients the same instance name only if that is wanted.
func WithInstanceName(name string) Option {
	return func(s *settings) error {
		s.core.InstanceName = name
		return nil
	}
}

// WithClientIP sets the address part of the client id, which a producer also writes into the
// ids of the messages it sends. It is a label: nothing connects to it.
//
// Default: the first non-loopback IPv4 address of an interface that is up, or 127.0.0.1,
// found by listing the host's interfaces, without any network traffic.
func WithClientIP(ip string) Option {
	return func(s *settings) error {
		s.core.ClientIP = ip
		return nil
	}
}

// WithLogger sets the logger of the Client and of every producer and consumer using it; their
// records carry the client id, and the group. Default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(s *settings) error {
		s.core.Logger = l
		return nil
	}
}

// WithJSONHeaders makes the Client's requests carry JSON headers instead of the binary
// ROCKETMQ headers it sends by default, which cost a fraction of JSON to write and to read on
// both sides.
//
// The binary default is safe against any RocketMQ broker or name server: RocketMQ decodes a
// header by the serialize type its frame announces, takes JSON and ROCKETMQ alike, and answers
// each request in the request's own type; the requests brokers send to clients are read in
// either. Set this for a server in between that only reads JSON headers, such as a proxy that
// parses them.
func WithJSONHeaders() Option {
	return func(s *settings) error {
		s.core.JSONHeaders = true
		return nil
	}
}

// WithHeartbeatInterval sets how often the Client heartbeats every broker of every route it
// caches, naming each producer and consumer group registered into it. A broker drops a member
// that has not been heard from for its client expiry (flowd: 45 s by default), so a member
// that crashed without its connection closing is noticed that long after; a member whose
// connection closes is dropped at once.
//
// Default DefaultHeartbeatInterval, 10 s (RocketMQ clients: 30 s), so that a broker configured
// with a short client expiry notices a silent member within seconds.
func WithHeartbeatInterval(d time.Duration) Option {
	return func(s *settings) error { s.core.HeartbeatInterval = d; return positive("heartbeat interval", d) }
}

// WithRouteRefreshInterval sets how often the routes the Client caches are fetched again, so
// that a topic given more queues, or moved, is noticed; the consumers reading a topic whose
// queues changed rebalance. Concurrent fetches of one topic's route are made once.
//
// Default DefaultRouteRefreshInterval, 30 s (RocketMQ's pollNameServerInterval).
func WithRouteRefreshInterval(d time.Duration) Option {
	return func(s *settings) error { s.core.RouteRefreshInterval = d; return positive("route refresh interval", d) }
}

// WithRequestTimeout bounds each request whose context carries no deadline: route queries,
// heartbeats, and a consumer's offset queries and commits, locks and member lists. A
// producer's sends are bounded by its send timeout, and a consumer's long-polling pulls by its
// suspended-pull timeout, instead.
//
// Default DefaultRequestTimeout, 3 s.
func WithRequestTimeout(d time.Duration) Option {
	return func(s *settings) error { s.core.RequestTimeout = d; return positive("request timeout", d) }
}

// WithDialTimeout bounds connecting to a broker or name server. A connection that fails is
// dialed again by the next request that needs it.
//
// Default DefaultDialTimeout, 3 s; the client a consumer builds for itself defaults to
// consumer.DefaultPullTimeout instead (10 s, RocketMQ's consumerPullTimeoutMillis, which its
// lite-pull consumer uses as the connection timeout).
func WithDialTimeout(d time.Duration) Option {
	return func(s *settings) error { s.core.DialTimeout = d; return positive("dial timeout", d) }
}
