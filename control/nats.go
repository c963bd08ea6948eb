package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
)

// Subject prefixes of the control plane. Subjects under "$" belong to NATS itself, so
// flowd's own subjects start with "flowd".
const (
	// EventSubjectPrefix starts every event subject: flowd.evt.<cluster>.<kind>.<event>.
	EventSubjectPrefix = "flowd.evt"
	// CommandSubjectPrefix starts every command subject; a command subject's last token is
	// its verb (for example flowd.ctl.<cluster>.topic.list).
	CommandSubjectPrefix = "flowd.ctl"
)

// readOnlyVerbs are the command verbs that only read state. Kept in a function rather than a
// package variable so that no caller can change what the "read" role may do.
func readOnlyVerbs() []string {
	return []string{"list", "describe", "get", "query", "status", "browse", "search"}
}

// ReadOnlyVerbs returns the command verbs a "read" user may send: list, describe, get,
// query, status, browse and search. Every other verb changes state and needs the "admin" role. The command
// service names its endpoints so that their subject's last token is one of these verbs
// exactly when the endpoint only reads. The slice is a fresh copy.
func ReadOnlyVerbs() []string { return readOnlyVerbs() }

// IsReadOnly reports whether a command verb only reads state (one of ReadOnlyVerbs).
func IsReadOnly(verb string) bool { return slices.Contains(readOnlyVerbs(), verb) }

// Role is what a user of the embedded NATS server may do.
type Role string

const (
	// RoleAdmin may send every command (all of flowd.ctl.>), read events, use service
	// discovery ($SRV) and the JetStream API.
	RoleAdmin Role = "admin"
	// RoleRead may send only the read-only verbs (ReadOnlyVerbs), subscribe to events, read
	// the events stream, and use service discovery.
	RoleRead Role = "read"
)

// maxVerbDepth is how many tokens may stand between flowd.ctl and a command's verb in the
// read role's permissions (flowd.ctl.<cluster>.<noun>.<sub-noun>.<verb>). NATS permissions
// have no "any number of tokens, then X" wildcard, so each depth is listed.
const maxVerbDepth = 3

// RolePermissions returns the nats-server permissions of a role, for the embedded server's
// users (NATSConfig.Users) or to copy into the configuration of an external NATS server.
// Replies travel on _INBOX subjects, which both roles may subscribe to.
func RolePermissions(r Role) (*server.Permissions, error) {
	inbox := "_INBOX.>"
	discovery := []string{"$SRV.PING", "$SRV.INFO", "$SRV.STATS", "$SRV.PING.>", "$SRV.INFO.>", "$SRV.STATS.>"}
	switch r {
	case RoleAdmin:
		return &server.Permissions{
			Publish: &server.SubjectPermission{Allow: append([]string{
				CommandSubjectPrefix + ".>", "$JS.API.>", "$JS.ACK.>", "$JS.FC.>", inbox,
			}, discovery...)},
			Subscribe: &server.SubjectPermission{Allow: []string{EventSubjectPrefix + ".>", inbox}},
		}, nil
	case RoleRead:
		var pub []string
		for _, v := range readOnlyVerbs() {
			wild := CommandSubjectPrefix
			for range maxVerbDepth {
				wild += ".*"
				pub = append(pub, wild+"."+v)
			}
		}
		// Reading FLOWD_EVENTS with an ephemeral consumer, nothing that changes a stream.
		js := []string{
			"$JS.API.INFO",
			"$JS.API.STREAM.INFO." + EventsStreamName,
			"$JS.API.STREAM.MSG.GET." + EventsStreamName,
			"$JS.API.DIRECT.GET." + EventsStreamName, "$JS.API.DIRECT.GET." + EventsStreamName + ".>",
			"$JS.API.CONSUMER.CREATE." + EventsStreamName, "$JS.API.CONSUMER.CREATE." + EventsStreamName + ".>",
			"$JS.API.CONSUMER.INFO." + EventsStreamName + ".>",
			"$JS.API.CONSUMER.DELETE." + EventsStreamName + ".>",
			"$JS.API.CONSUMER.MSG.NEXT." + EventsStreamName + ".>",
			"$JS.ACK." + EventsStreamName + ".>", "$JS.FC." + EventsStreamName + ".>",
		}
		pub = append(append(append(pub, discovery...), js...), inbox)
		return &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: pub},
			Subscribe: &server.SubjectPermission{Allow: []string{EventSubjectPrefix + ".>", inbox}},
		}, nil
	}
	return nil, fmt.Errorf("role %q: %w", r, ErrBadConfig)
}

// NATSUser is a user of the embedded NATS server.
type NATSUser struct {
	// Name is the user name clients connect with. Required.
	Name string
	// Password is the user's password. Required.
	Password string
	// Role is RoleAdmin or RoleRead. Required.
	Role Role
}

// NATSConfig says how flowd reaches NATS. The zero value runs an embedded nats-server with
// JetStream, listening on 127.0.0.1:4222 without authentication.
//
// With URLs set flowd connects to that NATS cluster instead and starts no server; the
// embedded-server fields (Listen, StoreDir, Users, ServerName, Cluster) are then ignored.
type NATSConfig struct {
	// URLs of an existing NATS cluster, e.g. "nats://n1:4222". Empty (the default) runs the
	// embedded server.
	URLs []string

	// CredsFile is a NATS credentials file (JWT and nkey seed) to connect to URLs with.
	CredsFile string
	// NKeySeedFile is a file holding an nkey seed ("SU…") to connect to URLs with.
	NKeySeedFile string
	// Token authenticates with a token. With URLs it is the token flowd presents; for the
	// embedded server it is the token every client must present. Cannot be combined with
	// Users. Default: none.
	Token string
	// TLSCert and TLSKey are a client certificate and its key, for URLs that require
	// mutual TLS. Default: none.
	TLSCert, TLSKey string
	// TLSCA is a file of CA certificates to verify the servers of URLs with. Default: the
	// system's roots (when the URL is tls://).
	TLSCA string

	// Listen is the embedded server's client address, so that the nats CLI and other
	// clients can connect. Default "127.0.0.1:4222"; port 0 picks a free port; "off" runs
	// the server without a listener (flowd itself connects in-process). A listener on
	// anything but a loopback address needs Token or Users: Open refuses it otherwise
	// (ErrInsecureListener).
	Listen string
	// StoreDir is where the embedded server keeps JetStream data. Default
	// "./flowd-data/nats"; the daemon sets <data-dir>/nats.
	StoreDir string
	// Users of the embedded server, each with a role. Default: none (no authentication,
	// unless Token is set). Cannot be combined with Token.
	Users []NATSUser
	// ServerName is the embedded server's name, which JetStream needs unique in a cluster:
	// a NATS subject token. Default "flowd"; the daemon sets the broker name in a cluster.
	ServerName string
	// Cluster joins the embedded server to a NATS cluster. Default: none.
	Cluster NATSClusterConfig

	// Name is the client connection's name, shown by the server's monitoring. Default
	// "flowd".
	Name string
	// ReconnectWait is the pause between reconnect attempts to URLs. flowd retries for ever.
	// Default 2 s.
	ReconnectWait time.Duration
	// StartTimeout bounds the embedded server's start and the first connection. Default 10 s.
	StartTimeout time.Duration

	// Logger receives connection changes and the embedded server's log. Default
	// slog.Default().
	Logger *slog.Logger
}

// Errors of Open.
var (
	// ErrBadConfig: a NATSConfig field is invalid; the message says which.
	ErrBadConfig = errors.New("bad NATS configuration")
	// ErrInsecureListener: the embedded server would accept clients on a non-loopback
	// address without authentication.
	ErrInsecureListener = errors.New("refusing an unauthenticated NATS listener on a non-loopback address")
)

// internalUser is the embedded server's user for flowd's own in-process connection when
// Users are configured; its password is random per start.
const internalUser = "flowd-internal"

func (c *NATSConfig) withDefaults() NATSConfig {
	cfg := *c
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:4222"
	}
	if cfg.StoreDir == "" {
		cfg.StoreDir = "./flowd-data/nats"
	}
	if cfg.Name == "" {
		cfg.Name = "flowd"
	}
	if cfg.ServerName == "" {
		cfg.ServerName = "flowd"
	}
	if cfg.ReconnectWait <= 0 {
		cfg.ReconnectWait = 2 * time.Second
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// Embedded reports whether the configuration runs an embedded server.
func (c *NATSConfig) Embedded() bool { return len(c.URLs) == 0 }

// NATS owns flowd's NATS connection and, in embedded mode, the server it connects to.
type NATS struct {
	cfg NATSConfig
	log *slog.Logger
	srv *server.Server // nil when connected to URLs
	nc  *nats.Conn

	closed chan struct{} // closed by the connection's ClosedHandler

	mu          sync.Mutex
	onReconnect []func()
}

// Open starts the embedded NATS server (with JetStream) and connects to it in-process, or
// connects to cfg.URLs. The connection reconnects for ever; Close drains it.
func Open(ctx context.Context, cfg NATSConfig) (*NATS, error) {
	cfg = cfg.withDefaults()
	n := &NATS{cfg: cfg, log: cfg.Logger.With("component", "nats"), closed: make(chan struct{})}
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(cfg.ReconnectWait),
		nats.Timeout(cfg.StartTimeout),
		nats.DisconnectErrHandler(func(c *nats.Conn, err error) {
			if c.IsClosed() || c.IsDraining() { // flowd's own Close
				return
			}
			n.log.Warn("NATS disconnected; reconnecting, events are buffered", "err", err)
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			n.log.Info("NATS reconnected", "url", c.ConnectedUrlRedacted())
			n.reconnected()
		}),
		nats.ClosedHandler(func(*nats.Conn) { close(n.closed) }),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if sub != nil {
				n.log.Error("NATS error", "subject", sub.Subject, "err", err)
				return
			}
			n.log.Error("NATS error", "err", err)
		}),
	}
	start := n.connectExternal
	if cfg.Embedded() {
		start = n.startEmbedded
	}
	if err := start(ctx, opts); err != nil {
		return nil, err
	}
	return n, nil
}

func (n *NATS) connectExternal(ctx context.Context, opts []nats.Option) error {
	cfg := n.cfg
	if cfg.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if cfg.NKeySeedFile != "" {
		o, err := nats.NkeyOptionFromSeed(cfg.NKeySeedFile)
		if err != nil {
			return fmt.Errorf("nats: nkey seed %s: %w", cfg.NKeySeedFile, err)
		}
		opts = append(opts, o)
	}
	if cfg.Token != "" {
		opts = append(opts, nats.Token(cfg.Token))
	}
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return fmt.Errorf("nats: a TLS client certificate needs both a certificate and a key: %w", ErrBadConfig)
	}
	if cfg.TLSCert != "" {
		opts = append(opts, nats.ClientCert(cfg.TLSCert, cfg.TLSKey))
	}
	if cfg.TLSCA != "" {
		opts = append(opts, nats.RootCAs(cfg.TLSCA))
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("nats: connect: %w", err)
	}
	nc, err := nats.Connect(strings.Join(cfg.URLs, ","), opts...)
	if err != nil {
		return fmt.Errorf("nats: connect to %s: %w", strings.Join(cfg.URLs, ","), err)
	}
	n.nc = nc
	n.log.Info("NATS connected", "url", nc.ConnectedUrlRedacted())
	return nil
}

// listenAddr splits Listen into the server's host and port; ok is false for "off".
func listenAddr(listen string) (host string, port int, ok bool, err error) {
	if listen == "off" {
		return "", 0, false, nil
	}
	h, p, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, false, fmt.Errorf("nats: listen %q: %w: %w", listen, ErrBadConfig, err)
	}
	port, err = strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, false, fmt.Errorf("nats: listen %q: bad port: %w", listen, ErrBadConfig)
	}
	if port == 0 {
		port = server.RANDOM_PORT // nats-server reads 0 as its default port
	}
	return h, port, true, nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// serverOptions builds the embedded server's options, and the credentials flowd's own
// connection presents.
func (n *NATS) serverOptions() (*server.Options, []nats.Option, error) {
	cfg := n.cfg
	host, port, listen, err := listenAddr(cfg.Listen)
	if err != nil {
		return nil, nil, err
	}
	if cfg.Token != "" && len(cfg.Users) > 0 {
		return nil, nil, fmt.Errorf("nats: set either a token or users, not both: %w", ErrBadConfig)
	}
	if listen && !isLoopback(host) && cfg.Token == "" && len(cfg.Users) == 0 {
		return nil, nil, fmt.Errorf("nats: listen %s: %w: set a token (--nats-token, NATSConfig.Token) or users with "+
			"roles (--nats-users, NATSConfig.Users), listen on 127.0.0.1, or connect to an existing cluster (--nats-url)", cfg.Listen, ErrInsecureListener)
	}
	if cfg.CredsFile != "" || cfg.NKeySeedFile != "" || cfg.TLSCert != "" || cfg.TLSCA != "" {
		return nil, nil, fmt.Errorf("nats: credentials, nkey and TLS options apply to --nats-url only: %w", ErrBadConfig)
	}
	opts := &server.Options{
		ServerName: cfg.ServerName,
		Host:       host,
		Port:       port,
		DontListen: !listen,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		NoSigs:     true,
		// The in-process connection is flowd's own; no HTTP monitoring port is opened.
	}
	if err := n.clusterOptions(opts); err != nil {
		return nil, nil, err
	}
	var conn []nats.Option
	switch {
	case cfg.Token != "":
		opts.Authorization = cfg.Token
		conn = append(conn, nats.Token(cfg.Token))
	case len(cfg.Users) > 0:
		pass := nuid.Next() + nuid.Next()
		opts.Users = append(opts.Users, &server.User{Username: internalUser, Password: pass})
		seen := map[string]bool{internalUser: true}
		for _, u := range cfg.Users {
			if u.Name == "" || u.Password == "" {
				return nil, nil, fmt.Errorf("nats: user %q: a user needs a name and a password: %w", u.Name, ErrBadConfig)
			}
			if seen[u.Name] {
				return nil, nil, fmt.Errorf("nats: user %q: duplicate or reserved name: %w", u.Name, ErrBadConfig)
			}
			seen[u.Name] = true
			perms, err := RolePermissions(u.Role)
			if err != nil {
				return nil, nil, fmt.Errorf("nats: user %q: %w", u.Name, err)
			}
			opts.Users = append(opts.Users, &server.User{Username: u.Name, Password: u.Password, Permissions: perms})
		}
		conn = append(conn, nats.UserInfo(internalUser, pass))
	}
	return opts, conn, nil
}

func (n *NATS) startEmbedded(ctx context.Context, opts []nats.Option) error {
	sopts, auth, err := n.serverOptions()
	if err != nil {
		return err
	}
	if err := n.probeRoutes(ctx, sopts.Routes); err != nil {
		return err
	}
	s, err := server.NewServer(sopts)
	if err != nil {
		return fmt.Errorf("nats: embedded server: %w", err)
	}
	// The server reports a failure to listen only through its logger (Fatalf), so that is
	// where Open learns of it rather than waiting out StartTimeout.
	fatal := make(chan string, 1)
	s.SetLoggerV2(serverLogger{l: n.log.With("component", "nats-server"), fatal: fatal}, n.log.Enabled(ctx, slog.LevelDebug), false, false)
	s.Start()
	n.srv = s
	ready := make(chan bool, 1)
	go func() { ready <- s.ReadyForConnections(n.cfg.StartTimeout) }()
	select {
	case ok := <-ready:
		if !ok {
			n.shutdownServer(context.Background())
			return fmt.Errorf("nats: embedded server on %s not ready within %s", n.cfg.Listen, n.cfg.StartTimeout)
		}
	case msg := <-fatal:
		n.shutdownServer(context.Background())
		return fmt.Errorf("nats: embedded server on %s: %s", n.cfg.Listen, msg)
	case <-ctx.Done():
		n.shutdownServer(context.Background())
		return fmt.Errorf("nats: start: %w", ctx.Err())
	}
	nc, err := nats.Connect("", append(append(opts, auth...), nats.InProcessServer(s))...)
	if err != nil {
		n.shutdownServer(context.Background())
		return fmt.Errorf("nats: connect in-process: %w", err)
	}
	n.nc = nc
	n.log.Info("NATS server started", "listen", n.ListenURL(), "store", n.cfg.StoreDir, "auth", n.authMode())
	n.logCluster(sopts)
	return nil
}

func (n *NATS) authMode() string {
	switch {
	case n.cfg.Token != "":
		return "token"
	case len(n.cfg.Users) > 0:
		return "users"
	}
	return "none"
}

// Conn is flowd's connection. It belongs to NATS: callers must not close or drain it.
func (n *NATS) Conn() *nats.Conn { return n.nc }

// Embedded reports whether flowd runs the NATS server itself.
func (n *NATS) Embedded() bool { return n.srv != nil }

// Server is the embedded server, or nil when connected to URLs.
func (n *NATS) Server() *server.Server { return n.srv }

// ListenURL is the URL clients such as the nats CLI connect to: the embedded server's
// listener ("" when Listen is "off"), or the server flowd is connected to.
func (n *NATS) ListenURL() string {
	if n.srv == nil {
		return n.nc.ConnectedUrlRedacted()
	}
	if n.cfg.Listen == "off" {
		return ""
	}
	return n.srv.ClientURL()
}

// watchReconnect registers fn to run after every reconnect (on the connection's callback
// goroutine).
func (n *NATS) watchReconnect(fn func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.onReconnect = append(n.onReconnect, fn)
}

func (n *NATS) reconnected() {
	n.mu.Lock()
	fns := append([]func(){}, n.onReconnect...)
	n.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}

// Close drains the connection (pending publishes are flushed, subscriptions finish their
// messages), then shuts the embedded server down. ctx bounds both; on expiry the
// connection is closed without waiting.
func (n *NATS) Close(ctx context.Context) error {
	var errs []error
	if n.nc != nil {
		if err := n.nc.Drain(); err != nil {
			// Closed already, or reconnecting: there is nothing to drain to.
			n.nc.Close()
		}
		select {
		case <-n.closed:
		case <-ctx.Done():
			n.nc.Close()
			errs = append(errs, fmt.Errorf("nats: drain: %w", ctx.Err()))
		}
	}
	if err := n.shutdownServer(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (n *NATS) shutdownServer(ctx context.Context) error {
	if n.srv == nil {
		return nil
	}
	n.srv.Shutdown()
	done := make(chan struct{})
	go func() {
		n.srv.WaitForShutdown()
		close(done)
	}()
	select {
	case <-done:
		n.log.Info("NATS server stopped")
		return nil
	case <-ctx.Done():
		return fmt.Errorf("nats: server shutdown: %w", ctx.Err())
	}
}

// serverLogger sends the embedded server's log to slog, and its fatal errors to fatal too.
type serverLogger struct {
	l     *slog.Logger
	fatal chan<- string
}

// Noticef logs at debug level: the server's notices (its start banner) would drown flowd's
// own start lines at info.
func (s serverLogger) Noticef(format string, v ...any) { s.l.Debug(fmt.Sprintf(format, v...)) }
func (s serverLogger) Warnf(format string, v ...any)   { s.l.Warn(fmt.Sprintf(format, v...)) }
func (s serverLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	s.l.Error(msg)
	select {
	case s.fatal <- msg:
	default:
	}
}
func (s serverLogger) Errorf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if isClusterNameConflict(msg) {
		s.l.Error(msg, "hint", clusterNameHint)
		return
	}
	s.l.Error(msg)
}
func (s serverLogger) Debugf(format string, v ...any) { s.l.Debug(fmt.Sprintf(format, v...)) }
func (s serverLogger) Tracef(format string, v ...any) { s.l.Debug(fmt.Sprintf(format, v...)) }
