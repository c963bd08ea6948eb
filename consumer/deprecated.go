package consumer

import (
	"log/slog"
	"time"

	"github.com/flowd-io/flowd/client"
)

// The client settings a consumer once took directly. Each is now a client.Option, written once
// in package client and given through WithClientOptions; these forward to it so that
// programs written against the earlier options keep building. They add up with
// WithClientOptions, and like it they cannot be combined with WithClient.

// Deprecated: use WithClientOptions(client.WithNameServers(addrs...)).
func WithNameServers(addrs ...string) Option {
	return WithClientOptions(client.WithNameServers(addrs...))
}

// Deprecated: use WithClientOptions(client.WithInstanceName(name)).
func WithInstanceName(name string) Option { return WithClientOptions(client.WithInstanceName(name)) }

// Deprecated: use WithClientOptions(client.WithClientIP(ip)).
func WithClientIP(ip string) Option { return WithClientOptions(client.WithClientIP(ip)) }

// Deprecated: use WithClientOptions(client.WithLogger(l)).
func WithLogger(l *slog.Logger) Option { return WithClientOptions(client.WithLogger(l)) }

// Deprecated: use WithClientOptions(client.WithJSONHeaders()).
func WithJSONHeaders() Option { return WithClientOptions(client.WithJSONHeaders()) }

// Deprecated: use WithClientOptions(client.WithHeartbeatInterval(d)).
func WithHeartbeatInterval(d time.Duration) Option {
	return WithClientOptions(client.WithHeartbeatInterval(d))
}

// Deprecated: use WithClientOptions(client.WithRouteRefreshInterval(d)).
func WithRouteRefreshInterval(d time.Duration) Option {
	return WithClientOptions(client.WithRouteRefreshInterval(d))
}

// Deprecated: use WithClientOptions(client.WithRequestTimeout(d)).
func WithRequestTimeout(d time.Duration) Option {
	return WithClientOptions(client.WithRequestTimeout(d))
}

// Deprecated: use WithClientOptions(client.WithDialTimeout(d)).
func WithPullTimeout(d time.Duration) Option { return WithClientOptions(client.WithDialTimeout(d)) }
