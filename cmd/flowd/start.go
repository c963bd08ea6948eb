package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/cluster"
	"github.com/flowd-io/flowd/config"
	"github.com/flowd-io/flowd/internal/grpcserver"
	"github.com/flowd-io/flowd/metrics"
	"github.com/flowd-io/flowd/pipeline"
)

// Start and stop order. start builds the daemon's parts in dependency order and pushes
// each onto one stack of closers as soon as it exists; serve stops them in reverse, within
// one context bounded by shutdownTimeout, and a start that fails stops what it had built.
//
//	built (n-th)                              stopped (n-th)
//	1 plugins: Wasm runtime, plugin registry  9 plugins (Wasm filters run until the broker is down)
//	2 HTTP and gRPC listeners (a taken        8 gRPC and HTTP listeners (if their servers did
//	  address fails the start before the        not close them)
//	  broker opens)
//	3 broker: store opened, listeners bound   6 broker: connections closed, its last events
//	4 control plane: NATS, event publisher    7 control plane: publisher flushed, NATS closed;
//	  (before the broker serves: no event       it stops after the broker (stopAfter), so that
//	  of the start is missed)                   the broker's last events are published
//	  the broker serves, and the gRPC           the gRPC server stops just before the broker
//	  endpoint (listen.grpc) over it
//	5 control service: broker.started, then   5 control service: broker.stopping, commands end
//	  commands (pipeline ones included)
//	6 pipelines: the configured ones start    4 pipelines drain (within pipelineDrainTimeout):
//	                                            delivered and committed while the broker serves
//	7 metrics watch                           3 metrics watch
//	8 HTTP server (/metrics, /healthz, the    2 HTTP server (the console's event
//	  console at / and /api/v1/)                streams ended just before)
//	9 plugin directory watch                  1 plugin directory watch
//
// With NATS off, 4 and 5 are left out. In a cluster (nats.cluster.listen or nats.urls), the
// plugin registry of 1 runs on the cluster's plugin store (its local copy loaded at 1), which
// follows the cluster from just after 4, before the broker serves, once caught up (bounded),
// and stops following it before the broker stops; the broker joins the cluster's registry
// once it serves, between 4 and 5, and leaves it first when stopping, so that the other
// nodes drop its routes at once.

// shutdownTimeout bounds the whole stop: the pipelines' drain, then the broker, NATS and
// the plugins in what is left.
const shutdownTimeout = pipelineDrainTimeout + 30*time.Second

// built is what start built that the main loop and reloads use.
type built struct {
	b      *broker.Broker
	ph     *pluginHost
	cp     *controlPlane // nil: NATS is off
	pl     *pipelineHost
	w      *dirWatcher
	httpLn net.Listener       // nil: http.listen is off
	grpc   *grpcserver.Server // nil: listen.grpc is off
	rs     *replicaSet        // nil: replication is off
}

// restartCheck is the readiness check of a daemon that must run again: not ready from the
// moment the restart is asked for, so that nothing is routed to addresses about to close.
func restartCheck(restart <-chan struct{}) metrics.Check {
	return metrics.Check{Name: "restart", Fn: func(context.Context) error {
		select {
		case <-restart:
			return fmt.Errorf("restarting to cut a diverged log: %w", metrics.ErrNotReady)
		default:
			return nil
		}
	}}
}

// restartRequested is signalled when the daemon must stop and run again (a replica whose
// log diverged); nil, which never is, without a replica set.
func (d *built) restartRequested() <-chan struct{} {
	if d == nil || d.rs == nil {
		return nil
	}
	return d.rs.restart
}

// start builds the daemon in the order above, pushing every part onto cl. On an error the
// caller closes cl, which stops what was built.
func start(ctx context.Context, c config.Config, cl *closers, log *slog.Logger) (*built, error) {
	if c.Plugins.Dir != "" {
		if err := os.MkdirAll(c.Plugins.Dir, 0o755); err != nil {
			return nil, fmt.Errorf("serve: plugins.dir: %w", err)
		}
	}
	// The store's lock is taken by broker.New; checking it first keeps a second daemon from
	// touching the plugin store and says plainly what is wrong.
	if err := checkDataDirFree(c.DataDir); err != nil {
		return nil, err
	}
	cfg := brokerConfig(c, log)
	// Metrics: the broker counts traffic through the observer, the Wasm runtime times plugin
	// calls and the store its flushes through their hooks; everything else is read at
	// scrape time.
	m := metrics.New(metrics.Options{})
	cfg.Observer = m
	cfg.Store.OnFlush = m.StoreFlush
	d := &built{}
	var err error
	var cs *cluster.PluginOptions // in a cluster, the registry runs on the cluster's plugin store
	if clustered(c) {
		cs = &cluster.PluginOptions{Node: cfg.BrokerName, Replicas: routedReplicas(c)}
	}
	if d.ph, err = openPlugins(ctx, cfg.DataDir, cs, m.PluginCall, log); err != nil {
		return nil, err
	}
	cl.push("plugins", d.ph.close)
	cfg.Filters = d.ph.filters
	var ps *peers
	if clustered(c) {
		ps = &peers{plugins: d.ph.cs}
		cfg.Peers = ps
	}
	if err := checkHTTPAuth(c); err != nil {
		return nil, err
	}
	if c.HTTP.Listen != "off" {
		if d.httpLn, err = listen(ctx, httpAddr(c)); err != nil {
			return nil, err
		}
		cl.push("HTTP listener", closeListener(d.httpLn))
	}
	grpcLn, err := listenGRPC(ctx, c, cl)
	if err != nil {
		return nil, err
	}
	if c.Replication.Enabled() {
		if d.rs, err = openReplicaSet(ctx, c, cfg.Store, log); err != nil {
			return nil, err
		}
		cfg.Replication = d.rs
		if ps != nil {
			ps.rs = d.rs
		}
	}
	if d.b, err = broker.New(cfg); err != nil {
		if d.rs != nil {
			d.rs.ln.Close()
		}
		return nil, brokerListenError(ctx, c, dataDirError(c.DataDir, err))
	}
	cl.push("broker", d.b.Shutdown)
	if d.rs != nil {
		// Before the broker stops: the lease lapses (an in-sync replica takes over) and the
		// stream ends while the store is open.
		cl.push("replica set", d.rs.close)
	}
	if c.NATS.Enabled {
		if d.cp, err = startControlPlane(ctx, c, cfg, d.b, d.ph, log); err != nil {
			return nil, natsListenError(ctx, c, err)
		}
		cl.stopAfter("broker", "control plane", func(ctx context.Context) error {
			d.ph.setSink(nil) // plugin events stop going to the publisher before it closes
			return d.cp.close(ctx)
		})
	}
	if d.cp != nil {
		// Before the broker serves: a subscription naming a plugin of the cluster finds it.
		if err := d.ph.joinPlugins(ctx, d.cp.n.Conn(), cl); err != nil {
			return nil, err
		}
	}
	if err := d.b.Start(); err != nil {
		return nil, err
	}
	if err := d.serveGRPC(c, grpcLn, ps, cl, m, log); err != nil {
		return nil, err
	}
	if err := d.startMembership(ctx, c, ps, cl, m, log); err != nil {
		return nil, err
	}
	if err := d.startPipelines(ctx, c, cl, log); err != nil {
		return nil, err
	}
	stopWatch, checks := watchMetrics(m, d.b, d.ph, d.pl, d.cp)
	checks = append(checks, d.ph.checks(ps.joined)...)
	if d.rs != nil {
		checks = append(checks, restartCheck(d.restartRequested()), d.rs.readyCheck())
	}
	cl.push("metrics watch", noErr(stopWatch))
	if d.httpLn != nil {
		con, err := newConsole(c, d.cp, log)
		if err != nil {
			return nil, err
		}
		cl.push("HTTP server", noCtx(serveHTTP(ctx, d.httpLn, httpHandler(metrics.NewHandler(m.Registry(), log, checks...), con))))
		cl.push("console event streams", noErr(con.Close)) // ended first, so the server's stop does not wait for them
	}
	d.w = &dirWatcher{ph: d.ph}
	d.w.set(ctx, c.Plugins.Dir, c.Plugins.Poll)
	cl.push("plugin directory watch", noErr(d.w.stop))
	return d, nil
}

// startPipelines creates the pipelines' Manager, starts the command service over it (NATS
// on), then the configured pipelines: steps 5 and 6. A pipeline that does not start is
// logged (and reported as pipeline.failed); the daemon serves on.
func (d *built) startPipelines(ctx context.Context, c config.Config, cl *closers, log *slog.Logger) error {
	var events func(pipeline.Event)
	var nc *nats.Conn
	if d.cp != nil {
		events, nc = d.cp.pub.Pipeline, d.cp.n.Conn()
	}
	var err error
	if d.pl, err = newPipelineHost(ctx, d.b, d.ph.reg, nc, events, log); err != nil {
		return err
	}
	if d.cp != nil {
		d.cp.cfg.Pipelines = d.pl.m
		defs, err := d.openSharedPipelines(ctx, c, cl, log)
		if err != nil {
			return err
		}
		d.cp.cfg.PipelineDefinitions = defs
		if err := d.cp.started(ctx, d.b); err != nil {
			return err
		}
		cl.push("control service", noCtx(d.cp.stopping))
	}
	// From here pipelines run: those of the configuration, and those the commands start.
	cl.push("pipelines", d.pl.close)
	if err := d.pl.apply(c.Pipelines); err != nil {
		log.Error("serve: pipelines not started", "err", err)
	}
	return nil
}

// setDisabled applies nats.disabled_commands; with NATS off there is nothing to apply.
func (d *built) setDisabled(ctx context.Context, disabled []string) error {
	if d.cp == nil {
		return nil
	}
	return d.cp.setDisabled(ctx, d.b, disabled)
}

// natsURL is the embedded NATS server's client URL for the log, or "off".
func (d *built) natsURL() string {
	if d.cp == nil {
		return "off"
	}
	return d.cp.url()
}

// closeListener closes ln unless the HTTP server closed it already.
func closeListener(ln net.Listener) func(context.Context) error {
	return func(context.Context) error {
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			return err
		}
		return nil
	}
}

// startMembership starts the node's part of the cluster: its replica set's lease, or its
// entry in the cluster's registry.
func (d *built) startMembership(ctx context.Context, c config.Config, ps *peers, cl *closers, m *metrics.Metrics, log *slog.Logger) error {
	switch {
	case d.rs != nil:
		if err := d.rs.start(ctx, d.b, d.cp.n.Conn(), routedReplicas(c), d.grpcAdvertise(), d.cp.pub.Cluster); err != nil {
			return err
		}
		m.WatchReplicaSet(d.rs.stats)
		if ps != nil {
			// A replica set's members share one broker name, which the cluster's registry
			// holds once: its master's (docs/cluster.md, "Several replica sets in one
			// cluster"). Every member watches the registry for the other brokers' routes.
			return d.joinCluster(ctx, c, ps, cl, d.rs, log)
		}
	case ps != nil:
		return d.joinCluster(ctx, c, ps, cl, nil, log)
	}
	return nil
}
