package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/flowd-io/flowd/config"
	"github.com/flowd-io/flowd/metrics"
	"github.com/flowd-io/flowd/pipeline"
)

// serveCmd is `flowd serve`: its flags, bound to the settings of config.Config.
type serveCmd struct {
	configFile string
	flags      *pflag.FlagSet
}

// settingFlag is a flag standing for one configuration setting. It only records what was
// given; the value is applied over the file and the environment once they are read, so that
// a flag wins over both.
type settingFlag struct {
	def, val, typ string
}

func (f *settingFlag) String() string {
	if f.val != "" {
		return f.val
	}
	return f.def
}
func (f *settingFlag) Set(s string) error { f.val = s; return nil }
func (f *settingFlag) Type() string       { return f.typ }

// addFlags registers --config and one flag per setting that has one (the flag tag of
// config.Config), with the setting's default and doc.
func (s *serveCmd) addFlags(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVarP(&s.configFile, "config", "c", "", "configuration file (YAML; see \"flowd config defaults\"); env FLOWD_CONFIG")
	def := config.Default()
	for _, st := range config.Settings(&def) {
		if st.Flag == "" {
			continue
		}
		v := st.Value.Interface()
		f := &settingFlag{typ: "string"}
		switch x := v.(type) {
		case bool:
			f.typ, f.def = "bool", fmt.Sprint(x)
		case []string:
			f.typ, f.def = "list", strings.Join(x, ",")
		case time.Duration:
			f.typ, f.def = "duration", x.String()
		case config.Size:
			f.typ, f.def = "size", x.String()
		default:
			f.def = fmt.Sprint(x)
		}
		fl := fs.VarPF(f, st.Flag, "", st.Doc+" (setting "+st.Key+")")
		if f.typ == "bool" {
			fl.NoOptDefVal = "true"
		}
	}
	s.flags = fs
}

// load reads the configuration: the file (--config, else FLOWD_CONFIG), the environment,
// then the flags given.
func (s *serveCmd) load() (config.Config, error) {
	path := s.configFile
	if path == "" {
		path = os.Getenv("FLOWD_CONFIG")
	}
	cfg, err := config.Load(path, os.Environ())
	if err != nil {
		return cfg, err
	}
	var errs []error
	for _, st := range config.Settings(&cfg) {
		if st.Flag == "" || !s.flags.Changed(st.Flag) {
			continue
		}
		f := s.flags.Lookup(st.Flag).Value.(*settingFlag)
		if err := config.SetString(st.Value, f.val); err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", st.Flag, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return cfg, err
	}
	if err := cfg.Validate(); err != nil {
		return cfg, flagNames(err)
	}
	return cfg, nil
}

// flagNames adds the flag spelling to the problems of settings that have a flag, so that
// `--log-level loud` is reported as such.
func flagNames(err error) error {
	var inv *config.InvalidError
	if !errors.As(err, &inv) {
		return err
	}
	flags := map[string]string{}
	def := config.Default()
	for _, st := range config.Settings(&def) {
		if st.Flag != "" {
			flags[st.Key] = st.Flag
		}
	}
	out := &config.InvalidError{Problems: slices.Clone(inv.Problems)}
	for i, p := range out.Problems {
		// A list's item ("nats.cluster.routes[1]") comes from its list's flag.
		if f, ok := flags[strings.Split(p.Key, "[")[0]]; ok {
			out.Problems[i].Key = p.Key + " (--" + f + ")"
		}
	}
	return out
}

// brokerConfig maps the daemon configuration onto the broker's.
func brokerConfig(c config.Config, log *slog.Logger) broker.Config {
	bc := broker.Config{
		DataDir:        c.DataDir,
		Listen:         c.Listen.Broker,
		NamesrvListen:  c.Listen.Namesrv,
		AdvertisedAddr: c.Listen.Advertise,
		Cluster:        c.Cluster,
		BrokerName:     c.BrokerName,
		MaxMessageSize: int(c.Limits.MaxMessageSize),
		MaxGroups:      c.Limits.MaxGroups,
		Logger:         log,

		OffsetFlushInterval: c.Store.OffsetFlushInterval,
		DisableZeroCopy:     !c.Store.ZeroCopy,

		TransactionTimeout:       c.Txn.FirstCheck,
		TransactionCheckInterval: c.Txn.CheckInterval,
		TransactionCheckMax:      c.Txn.MaxChecks,
	}
	bc.Store.Retention = c.Store.Retention
	bc.Store.MaxDiskUsage = c.Store.MaxDiskUsage
	bc.Store.SegmentSize = int64(c.Store.SegmentSize)
	bc.Store.Memory = int64(c.Store.MemoryBudget)
	bc.Store.InMemoryMaxRatio = c.Store.AccessMessageInMemoryMaxRatio
	bc.ReplicaReads = c.Replication.Enabled() && c.Replication.ReplicaReads
	if c.Store.Flush == "sync" {
		bc.Store.FlushMode = store.FlushSync
	}
	bc.Transport.MaxConns = c.Limits.MaxConnections
	bc.Transport.MaxInFlightPerConn = c.Limits.MaxInFlight
	bc.Transport.MaxParkedPerConn = c.Limits.MaxParked
	return bc
}

func newLogger(c config.Config, level *slog.LevelVar, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if c.Log.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func (s *serveCmd) run(cmd *cobra.Command, _ []string) error {
	c, err := s.load()
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return serve(cmd.Context(), c, s, cmd.ErrOrStderr())
}

// serve runs the daemon until ctx ends or SIGINT/SIGTERM; SIGHUP reloads what it can. The
// daemon is built and stopped as written above start (start.go).
func serve(ctx context.Context, c config.Config, reload *serveCmd, stderr io.Writer) error {
	var level slog.LevelVar
	lv, _ := c.LogLevel() // validated by load
	level.Set(lv)
	log := newLogger(c, &level, stderr)

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	cl := &closers{log: log}
	// The parts outlive ctx's signals: they are stopped in their turn, within one bound.
	shutdown := func() error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
		defer cancel()
		return cl.close(sctx)
	}
	d, err := start(ctx, c, cl, log)
	if err != nil {
		return errors.Join(err, shutdown())
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	select {
	case <-d.restartRequested(): // asked for while starting: these addresses are about to close
	default:
		log.Info("flowd serving", "version", version, "broker", d.b.Addr(), "namesrv", d.b.NamesrvAddr(), "nats", d.natsURL(), "http", addrOrOff(d.httpLn), "grpc", d.grpcAddr(), "data", c.DataDir, "plugin_dir", c.Plugins.Dir, "pid", os.Getpid())
	}
	for running := true; running; {
		select {
		case <-ctx.Done():
			running = false
		case <-d.restartRequested():
			running = false
		case <-hup:
			c = reloadConfig(ctx, c, reload, &level, d.w, func(dis []string) error { return d.setDisabled(ctx, dis) }, d.pl.apply, log)
		}
	}
	log.Info("flowd stopping")
	if err := shutdown(); err != nil {
		return err
	}
	select {
	case <-d.restartRequested():
		log.Info("flowd restarting")
		return reexec()
	default:
	}
	return nil
}

// watchMetrics makes m read the broker, plugins, pipelines and publisher at scrape time, and
// returns the function that stops watching the broker and the readiness checks.
func watchMetrics(m *metrics.Metrics, b *broker.Broker, ph *pluginHost, pl *pipelineHost, cp *controlPlane) (stop func(), checks []metrics.Check) {
	stop = m.WatchBroker(b)
	m.WatchPlugins(ph.reg.Stats)
	m.WatchPipelines(pl.stats)
	checks = metrics.BrokerChecks(b)
	if cp != nil {
		m.WatchPublisher(cp.pub.Stats)
		checks = append(checks, metrics.NATSCheck(func() bool { return cp.pub.Stats().Connected }))
	}
	return stop, checks
}

// addrOrOff is ln's address, or "off" when there is no listener.
func addrOrOff(ln net.Listener) string {
	if ln == nil {
		return "off"
	}
	return ln.Addr().String()
}

// serveHTTP serves h on ln (nil: nothing) until stop is called, which returns the
// server's error. The server outlives ctx's signals: the daemon stops it in its own turn.
func serveHTTP(ctx context.Context, ln net.Listener, h http.Handler) (stop func() error) {
	if ln == nil {
		return func() error { return nil }
	}
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- metrics.ServeListener(hctx, ln, h) }()
	var once sync.Once
	var err error
	return func() error {
		once.Do(func() {
			cancel()
			err = <-done
		})
		return err
	}
}

// reloadConfig re-reads the configuration on SIGHUP, applies the settings that can change
// while running and logs the others as needing a restart. A configuration that does not load
// changes nothing.
func reloadConfig(ctx context.Context, old config.Config, s *serveCmd, level *slog.LevelVar, w *dirWatcher,
	setDisabled func([]string) error, setPipelines func([]pipeline.Definition) error, log *slog.Logger) config.Config {
	if s == nil {
		return old
	}
	c, err := s.load()
	if err != nil {
		log.Error("reload: configuration not applied", "err", err)
		return old
	}
	changed := config.Changed(old, c)
	if len(changed) == 0 {
		log.Info("reload: no setting changed")
		return old
	}
	// Settings that need a restart keep their running values, so that the next reload
	// reports them again.
	next := old
	var applied, restart []string
	pluginsChanged := false
	for _, st := range changed {
		if !st.Reload {
			restart = append(restart, st.Key)
			continue
		}
		switch st.Key {
		case "log.level":
			lv, _ := c.LogLevel()
			level.Set(lv)
			next.Log.Level = c.Log.Level
		case "plugins.dir", "plugins.poll":
			pluginsChanged = true
			next.Plugins = c.Plugins
		case "nats.disabled_commands":
			if err := setDisabled(c.NATS.Disabled); err != nil {
				log.Error("reload: nats.disabled_commands not applied", "err", err)
				continue
			}
			next.NATS.Disabled = c.NATS.Disabled
		case "pipelines":
			// The pipelines that did start run even when others did not; every reload that
			// changes the pipelines tries the missing ones again.
			if err := setPipelines(c.Pipelines); err != nil {
				log.Error("reload: pipelines not all applied", "err", err)
			}
			next.Pipelines = c.Pipelines
		}
		applied = append(applied, st.Key)
	}
	if pluginsChanged {
		if c.Plugins.Dir != "" {
			if err := os.MkdirAll(c.Plugins.Dir, 0o755); err != nil {
				log.Error("reload: plugins.dir", "err", err)
			}
		}
		w.set(ctx, c.Plugins.Dir, c.Plugins.Poll)
	}
	if len(restart) > 0 {
		log.Warn("reload: settings changed that take effect after a restart", "settings", strings.Join(restart, ","))
	}
	log.Info("reload: applied", "settings", strings.Join(applied, ","))
	return next
}

// dirWatcher runs the plugin directory's watch loop and restarts it when the directory or
// the poll interval changes.
type dirWatcher struct {
	ph     *pluginHost
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (w *dirWatcher) set(ctx context.Context, dir string, poll time.Duration) {
	w.stop()
	if dir == "" {
		return
	}
	wctx, cancel := context.WithCancel(ctx)
	w.cancel = cancel
	w.wg.Go(func() { w.ph.watchDir(wctx, dir, poll) })
}

func (w *dirWatcher) stop() {
	if w.cancel != nil {
		w.cancel()
		w.cancel = nil
	}
	w.wg.Wait()
}

// errDataDirInUse is returned by serve when another flowd holds the data directory.
var errDataDirInUse = errors.New("data directory in use")

// checkDataDirFree fails when another process holds the data directory's store lock. The
// lock is let go at once; broker.New takes it for good (and fails the same way if another
// daemon got there in between).
func checkDataDirFree(dir string) error {
	sdir := filepath.Join(dir, "store")
	if err := os.MkdirAll(sdir, 0o755); err != nil {
		return fmt.Errorf("serve: data_dir: %w", err)
	}
	lk, err := vfs.Default().Lock(filepath.Join(sdir, "lock"))
	if err != nil {
		return dataDirError(dir, err)
	}
	return lk.Close()
}

// dataDirError turns the store's lock error into one that says what to do.
func dataDirError(dir string, err error) error {
	if errors.Is(err, store.ErrLocked) {
		return fmt.Errorf("serve: %w: %s is locked by another flowd (lock file %s); stop that daemon or choose another data_dir (--data-dir)",
			errDataDirInUse, dir, filepath.Join(dir, "store", "lock"))
	}
	return err
}
