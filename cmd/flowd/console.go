package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/flowd-io/flowd/config"
	"github.com/flowd-io/flowd/internal/console"
)

// errInsecureHTTP refuses a console any host could reach without credentials, as
// control.ErrInsecureListener refuses such a NATS listener.
var errInsecureHTTP = errors.New("refusing an unauthenticated HTTP listener (the console) on a non-loopback address")

// checkHTTPAuth refuses http.listen off loopback unless nats.token or nats.users (or
// nats.users_file) give the console credentials to ask for.
func checkHTTPAuth(c config.Config) error {
	if c.HTTP.Listen == "off" || c.NATS.Token != "" || len(c.NATS.Users) > 0 || c.NATS.UsersFile != "" {
		return nil
	}
	host, _, err := net.SplitHostPort(c.HTTP.Listen)
	if err != nil {
		return fmt.Errorf("serve: http.listen %q: %w", c.HTTP.Listen, err)
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("serve: http.listen %q: %w: set nats.token or nats.users, whose roles the console applies", c.HTTP.Listen, errInsecureHTTP)
}

// newConsole builds the console over the control plane (nil: NATS is off, and the API
// answers 503), with the NATS credentials and roles.
func newConsole(c config.Config, cp *controlPlane, log *slog.Logger) (*console.Server, error) {
	cfg := console.Config{Service: cp.service, Cluster: c.Cluster, Version: version, Logger: log}
	if cp != nil {
		cfg.Events = cp.n.Conn()
		nc, err := natsConfig(c, log)
		if err != nil {
			return nil, err
		}
		cfg.Token = nc.Token
		for _, u := range nc.Users {
			cfg.Users = append(cfg.Users, console.User{Name: u.Name, Password: u.Password, Role: u.Role})
		}
	}
	s, err := console.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	return s, nil
}

// httpHandler serves the metrics endpoints and, at every other path, the console.
func httpHandler(metricsHandler http.Handler, con http.Handler) http.Handler {
	mux := http.NewServeMux()
	for _, p := range []string{"/metrics", "/healthz", "/readyz"} {
		mux.Handle(p, metricsHandler)
	}
	mux.Handle("/", con)
	return mux
}
