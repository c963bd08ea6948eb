// Command flowd runs the flowd daemon: a RocketMQ-compatible broker with its built-in name
// service.
//
// Usage:
//
//	flowd [serve] [flags]   run the broker (the default)
//	flowd bench [flags]     measure throughput and delivery delay
//	flowd version           print the version
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/control"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "flowd:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(ctx, args, stderr)
	case "bench":
		return bench(ctx, args, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "flowd", version)
		return nil
	case "help":
		usage(stdout)
		return nil
	}
	usage(stderr)
	return fmt.Errorf("unknown command %q", cmd)
}

func usage(w io.Writer) {
	fmt.Fprint(w, `flowd — a programmable message stream daemon that speaks RocketMQ's protocol.

Usage:
  flowd [serve] [flags]   run the broker, its name service and the NATS control plane (the default)
  flowd bench [flags]     measure produce, consume and delivery delay against a broker
  flowd version           print the version
  flowd help              show this help

Run "flowd serve -h" for the serve flags.
`)
}

func serve(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg broker.Config
	fs.StringVar(&cfg.DataDir, "data-dir", "./flowd-data", "directory for the commit log, consume queues and broker state")
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:10911", "broker address")
	fs.StringVar(&cfg.NamesrvListen, "namesrv-listen", "127.0.0.1:9876", `name service address ("off" to disable)`)
	fs.StringVar(&cfg.Cluster, "cluster", "local", "cluster name announced in routes")
	fs.StringVar(&cfg.BrokerName, "broker-name", "broker-a", "broker name announced in routes")
	fs.StringVar(&cfg.AdvertisedAddr, "advertise", "", "address put into routes (default: the listen address)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	pluginDir := fs.String("plugin-dir", "", "directory watched for Wasm plugins to deploy and activate: <name>.wasm with its manifest <name>.json (default: none)")
	pluginPoll := fs.Duration("plugin-poll", time.Second, "how often --plugin-dir is scanned for new or changed plugins")
	natsFlags := addNATSFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("serve: --log-level %q: %w", *logLevel, err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	cfg.Logger = log

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	if *pluginDir != "" {
		if err := os.MkdirAll(*pluginDir, 0o755); err != nil {
			return fmt.Errorf("serve: --plugin-dir: %w", err)
		}
	}
	// The plugin registry outlives the broker: pulls through Wasm filters run until the
	// broker has shut down.
	ph, err := openPlugins(ctx, cfg.DataDir, log)
	if err != nil {
		return err
	}
	cfg.Filters = ph.filters
	closePlugins := func() error {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return ph.close(cctx)
	}
	b, err := broker.New(cfg)
	if err != nil {
		return errors.Join(err, closePlugins())
	}
	// NATS comes up before the broker serves, so that no event of the start is missed.
	var cp *controlPlane
	if natsFlags.enabled {
		cp, err = startControlPlane(ctx, natsFlags, cfg, b, ph, log)
		if err != nil {
			return errors.Join(err, b.Shutdown(context.Background()), closePlugins())
		}
	}
	if err := b.Start(); err != nil {
		return errors.Join(err, b.Shutdown(context.Background()), cp.close(context.Background()), closePlugins())
	}
	if err := cp.started(ctx, b); err != nil {
		return errors.Join(err, b.Shutdown(context.Background()), cp.close(context.Background()), closePlugins())
	}
	var watch sync.WaitGroup
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	if *pluginDir != "" {
		watch.Go(func() { ph.watchDir(wctx, *pluginDir, *pluginPoll) })
	}
	log.Info("flowd serving", "version", version, "broker", b.Addr(), "namesrv", b.NamesrvAddr(), "nats", cp.url(), "data", cfg.DataDir, "plugin_dir", *pluginDir)
	<-ctx.Done()
	log.Info("flowd stopping")
	stopWatch()
	watch.Wait()
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The "stopping" event goes out first, the broker's last events (members leaving as
	// connections close) follow while it shuts down, then the publisher and NATS drain.
	serr := cp.stopping()
	berr := b.Shutdown(sctx)
	ph.setSink(nil)
	return errors.Join(serr, berr, cp.close(sctx), ph.close(sctx))
}

// natsFlags are serve's NATS options.
type natsFlags struct {
	enabled bool
	nats    control.NATSConfig
	urls    string
	users   string
	events  control.EventsConfig
	disable string
}

func addNATSFlags(fs *flag.FlagSet) *natsFlags {
	f := &natsFlags{}
	fs.BoolVar(&f.enabled, "nats", true, "run the NATS control plane (events and commands)")
	fs.StringVar(&f.nats.Listen, "nats-listen", "127.0.0.1:4222", `embedded NATS server's client address ("off": no listener)`)
	fs.StringVar(&f.urls, "nats-url", "", "comma-separated URLs of an existing NATS cluster to use instead of the embedded server")
	fs.StringVar(&f.nats.CredsFile, "nats-creds", "", "NATS credentials file for --nats-url")
	fs.StringVar(&f.nats.NKeySeedFile, "nats-nkey", "", "file with an nkey seed for --nats-url")
	fs.StringVar(&f.nats.Token, "nats-token", "", "token: presented to --nats-url, or required by the embedded server")
	fs.StringVar(&f.users, "nats-users", "", `JSON file of embedded-server users: [{"name":…,"password":…,"role":"admin"|"read"}]`)
	fs.StringVar(&f.nats.TLSCert, "nats-tls-cert", "", "client certificate for --nats-url")
	fs.StringVar(&f.nats.TLSKey, "nats-tls-key", "", "key of --nats-tls-cert")
	fs.StringVar(&f.nats.TLSCA, "nats-tls-ca", "", "CA certificates to verify --nats-url's servers")
	fs.BoolVar(&f.events.Stream, "nats-events-stream", false, "keep events in the JetStream stream "+control.EventsStreamName)
	fs.DurationVar(&f.events.StreamMaxAge, "nats-events-max-age", 24*time.Hour, "how long the events stream keeps an event")
	fs.Int64Var(&f.events.StreamMaxBytes, "nats-events-max-bytes", 1<<30, "size bound of the events stream")
	fs.IntVar(&f.events.Buffer, "nats-events-buffer", 10000, "events kept while NATS is unreachable (then the oldest are dropped)")
	fs.StringVar(&f.disable, "nats-disable", "", `comma-separated commands not to serve ("topic.delete", "group.*"); they answer 403`)
	fs.DurationVar(&f.events.OffsetInterval, "nats-offset-interval", time.Second, "interval over which a group's offset commits become one event (negative: one event per commit)")
	return f
}

// controlPlane is the NATS connection, the event publisher and the command service; a nil
// *controlPlane (NATS disabled) does nothing.
type controlPlane struct {
	n   *control.NATS
	pub *control.Publisher
	svc *control.Service
	cfg control.ServiceConfig
}

func startControlPlane(ctx context.Context, f *natsFlags, cfg broker.Config, b *broker.Broker, ph *pluginHost, log *slog.Logger) (*controlPlane, error) {
	nc := f.nats
	nc.Logger = log
	nc.StoreDir = filepath.Join(cfg.DataDir, "nats")
	for _, u := range strings.Split(f.urls, ",") {
		if u = strings.TrimSpace(u); u != "" {
			nc.URLs = append(nc.URLs, u)
		}
	}
	if f.users != "" {
		raw, err := os.ReadFile(f.users)
		if err != nil {
			return nil, fmt.Errorf("serve: --nats-users: %w", err)
		}
		var users []struct{ Name, Password, Role string }
		if err := json.Unmarshal(raw, &users); err != nil {
			return nil, fmt.Errorf("serve: --nats-users %s: %w", f.users, err)
		}
		for _, u := range users {
			nc.Users = append(nc.Users, control.NATSUser{Name: u.Name, Password: u.Password, Role: control.Role(u.Role)})
		}
	}
	n, err := control.Open(ctx, nc)
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	ec := f.events
	ec.Cluster, ec.Node, ec.Version, ec.Logger = cfg.Cluster, cfg.BrokerName, version, log
	pub, err := control.NewPublisher(ctx, n, b, ec)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("serve: %w", err), n.Close(context.Background()))
	}
	ph.setSink(pub.Plugin)
	sc := control.ServiceConfig{Cluster: cfg.Cluster, Node: cfg.BrokerName, Logger: log, Plugins: ph.reg, PluginEvents: pub.Plugin}
	for _, d := range strings.Split(f.disable, ",") {
		if d = strings.TrimSpace(d); d != "" {
			sc.Disabled = append(sc.Disabled, d)
		}
	}
	return &controlPlane{n: n, pub: pub, cfg: sc}, nil
}

// started announces the broker and starts taking commands, once the broker serves.
func (c *controlPlane) started(ctx context.Context, b *broker.Broker) error {
	if c == nil {
		return nil
	}
	c.pub.Started()
	svc, err := control.StartService(ctx, c.n.Conn(), b, c.cfg)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	c.svc = svc
	return nil
}

// stopping announces the stop and stops taking commands before the broker shuts down.
func (c *controlPlane) stopping() error {
	if c == nil {
		return nil
	}
	c.pub.Stopping()
	if c.svc == nil {
		return nil
	}
	return c.svc.Stop()
}

func (c *controlPlane) url() string {
	if c == nil {
		return "off"
	}
	return c.n.ListenURL()
}

func (c *controlPlane) close(ctx context.Context) error {
	if c == nil {
		return nil
	}
	return errors.Join(c.pub.Close(ctx), c.n.Close(ctx))
}
