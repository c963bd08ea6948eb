// Package config is flowd's daemon configuration: one YAML file, decoded strictly, with
// FLOWD_* environment variables and command-line flags layered over it.
//
// Every setting is a field of Config carrying four struct tags: yaml (its key), env (its
// environment variable), flag (its serve flag, when it has one) and doc (what it means). The
// default of every setting is the value Default returns. `flowd config defaults` is generated
// from these tags and Default, so the documented defaults cannot drift from the code.
//
// Precedence, highest first: a flag given on the command line, a FLOWD_* environment
// variable, the configuration file, the default.
//
// Durations are Go duration strings ("500ms", "72h"). Sizes are a byte count (4194304) or a
// string with a binary unit ("4MiB", "1GiB"; KiB, MiB, GiB, TiB, and B).
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/flowd-io/flowd/fields"
	"github.com/flowd-io/flowd/internal/subjects"
	"github.com/flowd-io/flowd/pipeline/definition"
)

// Config is the daemon's configuration.
type Config struct {
	DataDir    string `yaml:"data_dir" env:"FLOWD_DATA_DIR" flag:"data-dir" doc:"directory of the commit log, consume queues, broker state, plugins and NATS JetStream data"`
	Cluster    string `yaml:"cluster" env:"FLOWD_CLUSTER" flag:"cluster" doc:"cluster name announced in routes and the <cluster> token of NATS subjects"`
	BrokerName string `yaml:"broker_name" env:"FLOWD_BROKER_NAME" flag:"broker-name" doc:"broker name announced in routes and message queues"`

	Listen  Listen  `yaml:"listen" doc:"network addresses"`
	Store   Store   `yaml:"store" doc:"the commit log"`
	Limits  Limits  `yaml:"limits" doc:"bounds on what clients may use"`
	NATS    NATS    `yaml:"nats" doc:"the NATS control plane: events and commands"`
	Plugins Plugins `yaml:"plugins" doc:"Wasm plugins deployed from a directory"`
	HTTP    HTTP    `yaml:"http" doc:"Prometheus metrics and health checks over HTTP"`
	GRPC    GRPC    `yaml:"grpc" doc:"the RocketMQ 5 gRPC endpoint (listen.grpc, docs/grpc.md)"`
	Txn     Txn     `yaml:"transactions" doc:"transaction check-backs of half messages without an outcome"`
	Log     Log     `yaml:"log" doc:"the daemon's log, on standard error"`

	Replication Replication `yaml:"replication" doc:"replica sets: nodes of one broker_name sharing its commit log (docs/cluster.md)"`

	// Pipelines are run by the daemon once the broker serves. A reload starts the new ones,
	// stops (draining) the removed ones and restarts the changed ones.
	Pipelines []definition.Definition `yaml:"pipelines" reload:"true" doc:"pipelines hosted by the daemon, each {name, topics, source_name_servers, selector, transforms, sink, ...} as in docs/pipelines.md; source_name_servers (host:port) read the topics of another flowd, default this one; default none"`
}

// HTTP configures the observability listener.
type HTTP struct {
	Listen string `yaml:"listen" env:"FLOWD_HTTP_LISTEN" flag:"http-listen" doc:"address serving the console (/ and /api/v1/, docs/console.md), /metrics (Prometheus), /healthz and /readyz; \"off\" disables it; a non-loopback one needs nats.token or nats.users"`
}

// Listen holds the addresses flowd binds and announces.
type Listen struct {
	Broker    string `yaml:"broker" env:"FLOWD_LISTEN" flag:"listen" doc:"broker address (RocketMQ remoting protocol); port 0 picks a free port"`
	Namesrv   string `yaml:"namesrv" env:"FLOWD_NAMESRV_LISTEN" flag:"namesrv-listen" doc:"built-in name service address; \"off\" disables it"`
	Advertise string `yaml:"advertise" env:"FLOWD_ADVERTISE" flag:"advertise" doc:"address put into topic routes; empty: the bound broker address"`
	GRPC      string `yaml:"grpc" env:"FLOWD_GRPC_LISTEN" flag:"grpc-listen" doc:"RocketMQ 5 gRPC endpoint (apache.rocketmq.v2 MessagingService, docs/grpc.md) for the 5.x clients; \"off\" disables it"`
	HA        string `yaml:"ha" env:"FLOWD_HA_LISTEN" flag:"ha-listen" doc:"replica-set stream address: a master serves its commit log to its replicas here (with replication on); port 0 picks a free port"`
}

// GRPC configures the RocketMQ 5 gRPC endpoint beyond its address.
type GRPC struct {
	Advertise string `yaml:"advertise" env:"FLOWD_GRPC_ADVERTISE" flag:"grpc-advertise" doc:"gRPC address put into the routes 5.x clients receive (they send everything there); empty: the bound listen.grpc address"`
	TLSCert   string `yaml:"tls_cert" env:"FLOWD_GRPC_TLS_CERT" flag:"grpc-tls-cert" doc:"PEM certificate: the endpoint speaks TLS only; empty: plaintext"`
	TLSKey    string `yaml:"tls_key" env:"FLOWD_GRPC_TLS_KEY" flag:"grpc-tls-key" doc:"PEM key of tls_cert"`
}

// Txn configures the check-backs of transactional half messages (broker.Config's
// TransactionTimeout, TransactionCheckInterval and TransactionCheckMax).
type Txn struct {
	FirstCheck    time.Duration `yaml:"first_check" env:"FLOWD_TXN_FIRST_CHECK" flag:"txn-first-check" doc:"age of a half message without an outcome at its first check-back (a message's own immunity time can make it later)"`
	CheckInterval time.Duration `yaml:"check_interval" env:"FLOWD_TXN_CHECK_INTERVAL" flag:"txn-check-interval" doc:"how often half messages without an outcome are checked back"`
	MaxChecks     int           `yaml:"max_checks" env:"FLOWD_TXN_MAX_CHECKS" flag:"txn-max-checks" doc:"check-backs a half message gets before it is discarded (and reported)"`
}

// Store configures the commit log.
type Store struct {
	Flush     string        `yaml:"flush" env:"FLOWD_FLUSH" flag:"flush" doc:"async: acknowledge once in the page cache, fsync on a timer; sync: acknowledge after an fsync (group commit)"`
	Retention time.Duration `yaml:"retention" env:"FLOWD_RETENTION" flag:"retention" doc:"how long a commit-log segment is kept after its last write"`
	// MaxDiskUsage mirrors store.Options.MaxDiskUsage.
	MaxDiskUsage float64 `yaml:"max_disk_usage" env:"FLOWD_MAX_DISK_USAGE" doc:"used fraction of the volume above which the oldest segments are deleted regardless of retention; negative disables"`
	SegmentSize  Size    `yaml:"segment_size" env:"FLOWD_SEGMENT_SIZE" doc:"size of one commit-log segment file"`
	// OffsetFlushInterval bounds what a crash of the whole daemon re-delivers: commits made
	// since the last write of the offsets file are read again after a restart.
	OffsetFlushInterval time.Duration `yaml:"offset_flush_interval" env:"FLOWD_OFFSET_FLUSH_INTERVAL" doc:"how often changed consumer offsets are written to disk (with an fsync); commits since the last write are re-delivered after a crash"`
	// ZeroCopy mirrors the inverse of broker.Config.DisableZeroCopy.
	ZeroCopy bool `yaml:"zero_copy" env:"FLOWD_ZERO_COPY" doc:"answer pulls without a content filter from the commit-log files with sendfile(2); false copies every pull through memory"`
	// MemoryBudget and AccessMessageInMemoryMaxRatio mirror store.Options.Memory and
	// InMemoryMaxRatio: messages more than ratio % of the budget behind the commit log's
	// end count as on disk (smaller pull batches; with replication.replica_reads, a
	// master suggests a replica for them).
	MemoryBudget                  Size `yaml:"memory_budget" env:"FLOWD_MEMORY_BUDGET" flag:"memory-budget" doc:"bytes of memory access_message_in_memory_max_ratio applies to; 0: the machine's memory"`
	AccessMessageInMemoryMaxRatio int  `yaml:"access_message_in_memory_max_ratio" env:"FLOWD_ACCESS_MESSAGE_IN_MEMORY_MAX_RATIO" doc:"percent of memory_budget behind the commit log's end within which messages count as in memory (RocketMQ's accessMessageInMemoryMaxRatio); older ones are read in smaller batches and, with replication.replica_reads, from a replica"`
}

// Limits bound what clients may use.
type Limits struct {
	MaxMessageSize Size `yaml:"max_message_size" env:"FLOWD_MAX_MESSAGE_SIZE" flag:"max-message-size" doc:"largest message body accepted, after compression"`
	MaxGroups      int  `yaml:"max_groups" env:"FLOWD_MAX_GROUPS" doc:"subscription groups kept; a request that would create one more is refused"`
	MaxConnections int  `yaml:"max_connections" env:"FLOWD_MAX_CONNECTIONS" doc:"broker connections open at once; negative: no cap"`
	MaxInFlight    int  `yaml:"max_in_flight" env:"FLOWD_MAX_IN_FLIGHT" doc:"requests served at once on one connection; more are answered SYSTEM_BUSY"`
	MaxParked      int  `yaml:"max_parked" env:"FLOWD_MAX_PARKED" doc:"long-polling pulls parked at once on one connection"`
}

// NATS configures the control plane.
type NATS struct {
	Enabled   bool     `yaml:"enabled" env:"FLOWD_NATS" flag:"nats" doc:"run the NATS control plane (events and commands)"`
	Listen    string   `yaml:"listen" env:"FLOWD_NATS_LISTEN" flag:"nats-listen" doc:"embedded NATS server's client address; \"off\": no listener; a non-loopback one needs token or users"`
	URLs      []string `yaml:"urls" env:"FLOWD_NATS_URL" flag:"nats-url" doc:"URLs of an existing NATS cluster to use instead of the embedded server (env and flag: comma-separated)"`
	Creds     string   `yaml:"creds" env:"FLOWD_NATS_CREDS" flag:"nats-creds" doc:"NATS credentials file for urls"`
	NKey      string   `yaml:"nkey" env:"FLOWD_NATS_NKEY" flag:"nats-nkey" doc:"file with an nkey seed for urls"`
	Token     string   `yaml:"token" env:"FLOWD_NATS_TOKEN" flag:"nats-token" doc:"token presented to urls, or required by the embedded server"`
	Users     []User   `yaml:"users" doc:"embedded-server users, each {name, password, role: admin|read}; cannot be combined with token"`
	UsersFile string   `yaml:"users_file" env:"FLOWD_NATS_USERS" flag:"nats-users" doc:"JSON file of embedded-server users: [{\"name\":…,\"password\":…,\"role\":\"admin\"|\"read\"}], added to users"`
	TLSCert   string   `yaml:"tls_cert" env:"FLOWD_NATS_TLS_CERT" flag:"nats-tls-cert" doc:"client certificate for urls"`
	TLSKey    string   `yaml:"tls_key" env:"FLOWD_NATS_TLS_KEY" flag:"nats-tls-key" doc:"key of tls_cert"`
	TLSCA     string   `yaml:"tls_ca" env:"FLOWD_NATS_TLS_CA" flag:"nats-tls-ca" doc:"CA certificates to verify the servers of urls"`
	Events    Events   `yaml:"events" doc:"events published on flowd.evt.<cluster>.>"`
	Disabled  []string `yaml:"disabled_commands" env:"FLOWD_NATS_DISABLE" flag:"nats-disable" reload:"true" doc:"commands not served (\"topic.delete\", \"group.*\"); they answer 403 (env and flag: comma-separated)"`

	// The embedded server in a NATS cluster: checked in cluster.go.
	ServerName string      `yaml:"server_name" env:"FLOWD_NATS_SERVER_NAME" flag:"nats-server-name" doc:"embedded server's name, unique in a NATS cluster (a NATS subject token); empty: broker_name in a cluster, \"flowd\" alone"`
	Cluster    NATSCluster `yaml:"cluster" doc:"the embedded server joining a NATS cluster through routes (docs/cluster.md)"`
}

// User is an embedded NATS server user.
type User struct {
	Name     string `yaml:"name"`
	Password string `yaml:"password"`
	Role     string `yaml:"role"`
}

// Events configures the event publisher.
type Events struct {
	Stream         bool          `yaml:"stream" env:"FLOWD_NATS_EVENTS_STREAM" flag:"nats-events-stream" doc:"keep events in the JetStream stream FLOWD_EVENTS"`
	MaxAge         time.Duration `yaml:"max_age" env:"FLOWD_NATS_EVENTS_MAX_AGE" flag:"nats-events-max-age" doc:"how long the events stream keeps an event"`
	MaxBytes       Size          `yaml:"max_bytes" env:"FLOWD_NATS_EVENTS_MAX_BYTES" flag:"nats-events-max-bytes" doc:"size bound of the events stream; the oldest events go first"`
	Buffer         int           `yaml:"buffer" env:"FLOWD_NATS_EVENTS_BUFFER" flag:"nats-events-buffer" doc:"events kept while NATS is unreachable (then the oldest are dropped)"`
	OffsetInterval time.Duration `yaml:"offset_interval" env:"FLOWD_NATS_OFFSET_INTERVAL" flag:"nats-offset-interval" doc:"a group's offset commits within it become one event; negative: one event per commit"`
}

// Plugins configures the plugin directory.
type Plugins struct {
	Dir  string        `yaml:"dir" env:"FLOWD_PLUGIN_DIR" flag:"plugin-dir" reload:"true" doc:"directory watched for Wasm plugins (<name>.wasm with its manifest <name>.json); empty: none"`
	Poll time.Duration `yaml:"poll" env:"FLOWD_PLUGIN_POLL" flag:"plugin-poll" reload:"true" doc:"how often the plugin directory is scanned for new or changed plugins"`
}

// Log configures the daemon's log.
type Log struct {
	Level  string `yaml:"level" env:"FLOWD_LOG_LEVEL" flag:"log-level" reload:"true" doc:"debug, info, warn or error"`
	Format string `yaml:"format" env:"FLOWD_LOG_FORMAT" flag:"log-format" doc:"text or json"`
}

// Default returns the configuration flowd runs with when nothing is configured. It is the
// single source of every default.
func Default() Config {
	return Config{
		DataDir:    "./flowd-data",
		Cluster:    "local",
		BrokerName: "broker-a",
		Listen:     Listen{Broker: "127.0.0.1:10911", Namesrv: "127.0.0.1:9876", GRPC: "127.0.0.1:8081", HA: "127.0.0.1:10912"},
		Store: Store{Flush: "async", Retention: 72 * time.Hour, MaxDiskUsage: 0.75, SegmentSize: 1 << 30,
			OffsetFlushInterval: 500 * time.Millisecond, ZeroCopy: true, AccessMessageInMemoryMaxRatio: 40},
		Limits: Limits{MaxMessageSize: 4 << 20, MaxGroups: 10000, MaxConnections: 10000,
			MaxInFlight: 256, MaxParked: 4096},
		NATS: NATS{
			Enabled: true, Listen: "127.0.0.1:4222", URLs: []string{}, Users: []User{}, Disabled: []string{}, Cluster: NATSCluster{Routes: []string{}},
			Events: Events{MaxAge: 24 * time.Hour, MaxBytes: 1 << 30, Buffer: 10000, OffsetInterval: time.Second},
		},
		Plugins:     Plugins{Poll: time.Second},
		HTTP:        HTTP{Listen: "127.0.0.1:8080"},
		Txn:         Txn{FirstCheck: 6 * time.Second, CheckInterval: time.Minute, MaxChecks: 15},
		Log:         Log{Level: "info", Format: "text"},
		Replication: Replication{Mode: "off", MinInSync: 2, MaxLag: 4 << 20, MaxLagTime: 5 * time.Second, AsyncPace: time.Millisecond, ElectLongestLog: true, LeaseTTL: 3 * time.Second},

		Pipelines: []definition.Definition{},
	}
}

// ErrInvalid is wrapped by every error of Load, Decode, Validate and ApplyEnv that is about
// the configuration's content rather than reading it. Those errors are *InvalidError, which
// lists every problem found.
var ErrInvalid = errors.New("invalid configuration")

// Load reads the file at path (none when path is empty) over the defaults, then applies the
// FLOWD_* variables of env (os.Environ form; nil: none), and validates the result. Every
// problem is reported at once, in one *InvalidError: unknown keys (with the key meant when
// it is close), values of the wrong type, variables that do not parse and values that
// decode but cannot work, each with its key path and, when it is in the file, its line.
func Load(path string, env []string) (Config, error) {
	cfg := Default()
	var root *yaml.Node
	var probs []Problem
	if path != "" {
		raw, err := os.ReadFile(path)
		if err != nil {
			return cfg, fmt.Errorf("config: %w", err)
		}
		cfg, root, probs = decode(raw)
		if root == nil && len(probs) > 0 { // not YAML: there is nothing more to check
			return cfg, fmt.Errorf("config %s: %w", path, problemsError(probs))
		}
	}
	envProbs, fromEnv := applyEnv(&cfg, env)
	probs = append(probs, envProbs...)
	// A value that did not decode left its default (or a zero) behind: what the checks would
	// say of that is not news.
	var undecoded []string
	for _, p := range probs {
		if p.Key != "" {
			undecoded = append(undecoded, p.Key)
		}
	}
	var lines map[string]int
	if root != nil {
		lines = keyLines(root)
	}
	for _, p := range cfg.problems() {
		if under(p.Key, undecoded) {
			continue
		}
		if !fromEnv[p.Key] {
			p.Line = lineOf(lines, p.Key)
		}
		probs = append(probs, p)
	}
	if err := problemsError(probs); err != nil {
		if path != "" {
			return cfg, fmt.Errorf("config %s: %w", path, err)
		}
		return cfg, err
	}
	return cfg, nil
}

// Decode decodes a YAML document over the defaults. Unknown keys and values of the wrong
// type are errors naming the key or value and its line (an *InvalidError listing every one);
// settings left out keep their defaults. The values that did decode are returned with the
// error. Decode does not validate: Load and Validate do.
func Decode(raw []byte) (Config, error) {
	cfg, _, probs := decode(raw)
	return cfg, problemsError(probs)
}

// decode is Decode returning the document's node tree (nil when raw is not YAML) and the
// problems unsorted.
func decode(raw []byte) (Config, *yaml.Node, []Problem) {
	cfg := Default()
	var root yaml.Node
	if err := yaml.Unmarshal(raw, &root); err != nil {
		return cfg, nil, []Problem{syntaxProblem(err)}
	}
	if root.Kind == 0 {
		return cfg, &root, nil // an empty file: all defaults
	}
	probs := unknownKeys(&root, reflect.TypeFor[Config]())
	if err := root.Decode(&cfg); err != nil {
		// A type error lists every value of the wrong type; any other error stopped the
		// decoding at the value it names.
		msgs := []string{strings.TrimPrefix(err.Error(), "yaml: ")}
		var te *yaml.TypeError
		if errors.As(err, &te) {
			msgs = te.Errors
		}
		used := map[*yaml.Node]bool{}
		for _, m := range msgs {
			probs = append(probs, typeProblem(&root, m, used))
		}
	}
	return cfg, &root, probs
}

// Validate checks values that decode but cannot work. The error is an *InvalidError
// listing every problem, by key.
func (c Config) Validate() error { return problemsError(c.problems()) }

// problems lists what Validate reports, in the order of the settings.
func (c Config) problems() []Problem {
	var probs []Problem
	bad := func(key, format string, args ...any) {
		probs = append(probs, Problem{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	if c.DataDir == "" {
		bad("data_dir", "must not be empty")
	}
	if err := subjects.Token(c.Cluster); err != nil {
		bad("cluster", "%v", err)
	}
	if c.BrokerName == "" {
		bad("broker_name", "must not be empty")
	}
	if c.Store.Flush != "async" && c.Store.Flush != "sync" {
		bad("store.flush", "%q is neither async nor sync", c.Store.Flush)
	}
	// Zero means "the default" to the packages configured below, so a zero here would be
	// silently replaced: it is refused instead.
	positive := func(key string, v int64) {
		if v <= 0 {
			bad(key, "must be positive, not %d", v)
		}
	}
	positive("store.retention", int64(c.Store.Retention))
	positive("store.segment_size", int64(c.Store.SegmentSize))
	positive("store.offset_flush_interval", int64(c.Store.OffsetFlushInterval))
	if c.Store.MaxDiskUsage == 0 || c.Store.MaxDiskUsage > 1 {
		bad("store.max_disk_usage", "must be in (0, 1], or negative to disable the rule, not %g", c.Store.MaxDiskUsage)
	}
	if c.Store.MemoryBudget < 0 {
		bad("store.memory_budget", "must be 0 (the machine's memory) or positive, not %d", c.Store.MemoryBudget)
	}
	if r := c.Store.AccessMessageInMemoryMaxRatio; r < 1 || r > 100 {
		bad("store.access_message_in_memory_max_ratio", "must be a percentage from 1 to 100, not %d", r)
	}
	positive("limits.max_message_size", int64(c.Limits.MaxMessageSize))
	positive("limits.max_groups", int64(c.Limits.MaxGroups))
	positive("limits.max_in_flight", int64(c.Limits.MaxInFlight))
	positive("limits.max_parked", int64(c.Limits.MaxParked))
	if c.Limits.MaxConnections == 0 {
		bad("limits.max_connections", "must be positive, or negative for no cap")
	}
	positive("nats.events.max_age", int64(c.NATS.Events.MaxAge))
	positive("nats.events.max_bytes", int64(c.NATS.Events.MaxBytes))
	positive("nats.events.buffer", int64(c.NATS.Events.Buffer))
	if c.NATS.Events.OffsetInterval == 0 {
		bad("nats.events.offset_interval", "must be positive, or negative for one event per commit")
	}
	if _, err := c.LogLevel(); err != nil {
		bad("log.level", "%q is not debug, info, warn or error", c.Log.Level)
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		bad("log.format", "%q is neither text nor json", c.Log.Format)
	}
	probs = append(probs, c.addrProblems()...)
	probs = append(probs, c.natsClusterProblems()...)
	probs = append(probs, c.replicationProblems()...)
	if c.Plugins.Poll <= 0 {
		bad("plugins.poll", "must be positive")
	}
	for i, u := range c.NATS.Users {
		if u.Name == "" || u.Password == "" || (u.Role != "admin" && u.Role != "read") {
			bad(fmt.Sprintf("nats.users[%d]", i), "needs name, password and role admin or read")
		}
	}
	names := map[string]int{}
	for i, d := range c.Pipelines {
		key := fmt.Sprintf("pipelines[%d]", i)
		fes := fields.Errors(d.Validate())
		for _, fe := range fes {
			bad(fields.Join(key, fe.Field), "%s", fe.Detail())
		}
		if len(fes) > 0 {
			continue
		}
		if j, ok := names[d.Name]; ok {
			bad(key+".name", "%q is the name of pipelines[%d] too", d.Name, j)
		}
		names[d.Name] = i
	}
	return probs
}

// addrProblems checks the addresses here, so that a typo is named by "config validate"
// rather than found by the listener at start (or, for advertise, by clients following
// routes), and so that two listeners given one address are named as such rather than as an
// address in use.
func (c Config) addrProblems() []Problem {
	var probs []Problem
	bad := func(key, format string, args ...any) {
		probs = append(probs, Problem{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	type bound struct{ key, host, port string }
	var seen []bound
	listen := func(key, addr string, off bool) {
		if off && addr == "off" {
			return
		}
		if err := checkListen(addr); err != nil {
			if off {
				bad(key, `%q %v, or "off"`, addr, err)
			} else {
				bad(key, "%q %v", addr, err)
			}
			return
		}
		host, port, _ := net.SplitHostPort(addr)
		for _, o := range seen {
			if port != "0" && port == o.port && (host == o.host || wildcard(host) || wildcard(o.host)) {
				bad(key, "%q is the address of %s too", addr, o.key)
				return
			}
		}
		seen = append(seen, bound{key, host, port})
	}
	listen("listen.broker", c.Listen.Broker, false)
	listen("listen.namesrv", c.Listen.Namesrv, true)
	if c.Listen.Advertise != "" {
		host, port, err := net.SplitHostPort(c.Listen.Advertise)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
			bad("listen.advertise", "%q is not host:port with a port in 1-65535", c.Listen.Advertise)
		}
	}
	if c.NATS.Enabled && len(c.NATS.URLs) == 0 {
		listen("nats.listen", c.NATS.Listen, true)
		if c.NATS.Cluster.Listen != "" {
			listen("nats.cluster.listen", c.NATS.Cluster.Listen, false)
		}
	} else if c.NATS.Listen != "off" {
		if err := checkListen(c.NATS.Listen); err != nil {
			bad("nats.listen", `%q %v, or "off"`, c.NATS.Listen, err)
		}
	}
	listen("http.listen", c.HTTP.Listen, true)
	listen("listen.grpc", c.Listen.GRPC, true)
	if a := c.GRPC.Advertise; a != "" {
		host, port, err := net.SplitHostPort(a)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
			bad("grpc.advertise", "%q is not host:port with a port in 1-65535", a)
		}
	}
	if (c.GRPC.TLSCert == "") != (c.GRPC.TLSKey == "") {
		bad("grpc.tls_key", "tls_cert and tls_key go together: set both or neither")
	}
	if c.Txn.FirstCheck <= 0 {
		bad("transactions.first_check", "%s is not positive", c.Txn.FirstCheck)
	}
	if c.Txn.CheckInterval <= 0 {
		bad("transactions.check_interval", "%s is not positive", c.Txn.CheckInterval)
	}
	if c.Txn.MaxChecks < 1 {
		bad("transactions.max_checks", "%d is under 1", c.Txn.MaxChecks)
	}
	return probs
}

// wildcard reports whether host binds every interface.
func wildcard(host string) bool { return host == "" || host == "0.0.0.0" || host == "::" }

// checkListen checks a listen address: [host]:port with a port in 0-65535 (0: any free one).
func checkListen(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("is not host:port")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return errors.New("has no port in 0-65535")
	}
	return nil
}

// LogLevel parses Log.Level.
func (c Config) LogLevel() (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.Log.Level)); err != nil {
		return l, fmt.Errorf("log level %q: %w", c.Log.Level, err)
	}
	return l, nil
}

// Setting describes one setting: its dotted YAML key, environment variable, flag and doc.
type Setting struct {
	Key, Env, Flag, Doc string
	// Reload says whether SIGHUP applies a change of it without a restart.
	Reload bool
	// Value is the setting's field within the Config it was listed from.
	Value reflect.Value
}

// Settings lists the leaf settings of c in file order; their Values are addressable fields
// of *c.
func Settings(c *Config) []Setting {
	var out []Setting
	var walk func(v reflect.Value, prefix string)
	walk = func(v reflect.Value, prefix string) {
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			key := prefix + strings.Split(f.Tag.Get("yaml"), ",")[0]
			fv := v.Field(i)
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Duration]() {
				walk(fv, key+".")
				continue
			}
			out = append(out, Setting{Key: key, Env: f.Tag.Get("env"), Flag: f.Tag.Get("flag"), Doc: f.Tag.Get("doc"),
				Reload: f.Tag.Get("reload") == "true", Value: fv})
		}
	}
	walk(reflect.ValueOf(c).Elem(), "")
	return out
}

// SetString sets a setting from its environment or flag spelling: lists are comma-separated,
// everything else is read as a YAML scalar (so "1s", "64MiB", "true" and "0.5" work).
func SetString(v reflect.Value, s string) error {
	if err := setString(v, s); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// setString is SetString, its error saying what is wrong with s alone: a variable's problem
// puts the variable's name before it, not ErrInvalid.
func setString(v reflect.Value, s string) error {
	switch {
	case v.Kind() == reflect.String:
		v.SetString(s)
		return nil
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.String:
		list := []string{}
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				list = append(list, p)
			}
		}
		v.Set(reflect.ValueOf(list))
		return nil
	case v.Kind() == reflect.Slice:
		return errors.New("a list of objects cannot be set from a string")
	}
	n := reflect.New(v.Type())
	var node yaml.Node
	node.SetString(s)
	node.Style = 0
	node.Tag = ""
	if err := node.Decode(n.Interface()); err != nil {
		return fmt.Errorf("%q: %s", s, scalarError(err))
	}
	v.Set(n.Elem())
	return nil
}

// scalarError is what yaml says of a scalar that did not decode, on one line: a type error's
// messages without "unmarshal errors:" and the line they give (0: the value is not from a
// file).
func scalarError(err error) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return strings.TrimPrefix(err.Error(), "yaml: ")
	}
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		msgs[i] = strings.TrimPrefix(m, lineAt.FindString(m))
	}
	return strings.Join(msgs, "; ")
}

// ApplyEnv applies the FLOWD_* variables found in env (os.Environ form) to c. A variable
// that does not parse leaves its setting as it was and is a problem of the *InvalidError
// returned.
func ApplyEnv(c *Config, env []string) error {
	probs, _ := applyEnv(c, env)
	return problemsError(probs)
}

// applyEnv is ApplyEnv returning the problems and the keys of the settings the variables
// set.
func applyEnv(c *Config, env []string) ([]Problem, map[string]bool) {
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "FLOWD_") {
			vars[k] = v
		}
	}
	var probs []Problem
	set := map[string]bool{}
	for _, s := range Settings(c) {
		val, ok := vars[s.Env]
		if s.Env == "" || !ok {
			continue
		}
		set[s.Key] = true
		if err := setString(s.Value, val); err != nil {
			probs = append(probs, Problem{Key: s.Key, Msg: "environment " + s.Env + ": " + err.Error()})
		}
	}
	return probs, set
}

// Changed lists the settings whose values differ between a and b, by key.
func Changed(a, b Config) []Setting {
	sa, sb := Settings(&a), Settings(&b)
	var out []Setting
	for i := range sa {
		if !reflect.DeepEqual(sa[i].Value.Interface(), sb[i].Value.Interface()) {
			out = append(out, sb[i])
		}
	}
	return out
}
