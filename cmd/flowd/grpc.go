package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"

	"github.com/flowd-io/flowd/config"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flowd-io/flowd/internal/grpcserver"
	"github.com/flowd-io/flowd/metrics"
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
// the broker, so that no receive is served by a closed store. In a cluster (ps set) its
// routes name the other brokers' queues too.
func (d *built) serveGRPC(c config.Config, ln net.Listener, ps *peers, cl *closers, m *metrics.Metrics, log *slog.Logger) error {
	if ln == nil {
		return nil
	}
	cfg := grpcserver.Config{Broker: d.b, Advertise: c.GRPC.Advertise, Logger: log}
	if ps != nil {
		cfg.Peers = ps // not a nil *peers in the interface
	}
	if d.rs != nil {
		cfg.ReplicaSet = d.rs
	}
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
	if err := m.Registry().Register(grpcCollector{srv}); err != nil {
		return fmt.Errorf("serve: gRPC metrics: %w", err)
	}
	srv.Serve(ln)
	d.grpc = srv
	cl.push("gRPC server", srv.Shutdown)
	log.Info("RocketMQ 5 gRPC endpoint serving", "addr", ln.Addr().String(), "tls", cfg.TLS != nil)
	return nil
}

// grpcAdvertise is the gRPC address the cluster's registry publishes for this node, empty
// when the endpoint is off.
func (d *built) grpcAdvertise() string {
	if d.grpc == nil {
		return ""
	}
	return d.grpc.Advertise()
}

// grpcAddr is the gRPC endpoint's bound address for the serving line, "off" without one.
func (d *built) grpcAddr() string {
	if d.grpc == nil {
		return "off"
	}
	return d.grpc.Addr()
}

var (
	grpcClientsDesc = prometheus.NewDesc("flowd_grpc_clients",
		"RocketMQ 5 clients on the gRPC endpoint: open Telemetry sessions and clients heard from by heartbeat within 45 s.", nil, nil)
	grpcRequestsDesc = prometheus.NewDesc("flowd_grpc_requests_total",
		"Calls of the gRPC endpoint by RPC and the protocol status code they were answered with (STREAM: a Telemetry session, TRANSPORT_ERROR: no answer).", []string{"rpc", "code"}, nil)
)

// grpcCollector reads the gRPC endpoint's counts at scrape time.
type grpcCollector struct{ s *grpcserver.Server }

func (g grpcCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- grpcClientsDesc
	ch <- grpcRequestsDesc
}

func (g grpcCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(grpcClientsDesc, prometheus.GaugeValue, float64(g.s.Clients()))
	for _, c := range g.s.RPCCounts() {
		ch <- prometheus.MustNewConstMetric(grpcRequestsDesc, prometheus.CounterValue, float64(c.Calls), c.RPC, c.Code)
	}
}
