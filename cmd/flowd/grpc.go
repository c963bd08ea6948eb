package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"

	"github.com/flowd-io/flowd/config"
	"github.com/flowd-io/flowd/internal/grpcserver"
)

func grpcAddr(c config.Config) addrSetting {
	return addrSetting{what: "gRPC", key: "listen.grpc", addr: c.Listen.GRPC, optional: true}
}

// listenGRPC binds listen.grpc before the broker opens its store, as the HTTP listener is,
// so that a taken address fails the start naming the setting. It returns nil when the
// endpoint is off.
func listenGRPC(ctx context.Context, c config.Config, cl *closers) (net.Listener, error) {
	if c.Listen.GRPC == "off" {
		return nil, nil
	}
	ln, err := listen(ctx, grpcAddr(c))
	if err != nil {
		return nil, err
	}
	cl.push("gRPC listener", closeListener(ln))
	return ln, nil
}

// serveGRPC starts the RocketMQ 5 endpoint on ln over the started broker: it stops before
// the broker, so that no receive is served by a closed store.
func (d *built) serveGRPC(c config.Config, ln net.Listener, cl *closers, log *slog.Logger) error {
	if ln == nil {
		return nil
	}
	cfg := grpcserver.Config{Broker: d.b, Advertise: c.GRPC.Advertise, Logger: log}
	if c.GRPC.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(c.GRPC.TLSCert, c.GRPC.TLSKey)
		if err != nil {
			return fmt.Errorf("serve: grpc.tls_cert / grpc.tls_key: %w", err)
		}
		cfg.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	srv, err := grpcserver.New(cfg)
	if err != nil {
		return fmt.Errorf("serve: gRPC endpoint: %w", err)
	}
	srv.Serve(ln)
	d.grpc = srv
	cl.push("gRPC server", srv.Shutdown)
	log.Info("RocketMQ 5 gRPC endpoint serving", "addr", ln.Addr().String(), "tls", cfg.TLS != nil)
	return nil
}

// grpcAddr is the gRPC endpoint's bound address for the serving line, "off" without one.
func (d *built) grpcAddr() string {
	if d.grpc == nil {
		return "off"
	}
	return d.grpc.Addr()
}
