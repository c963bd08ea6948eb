package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/broker/store"
)

// benchConfig is what "flowd bench" measures.
type benchConfig struct {
	namesrv       string // a running flowd or RocketMQ name server; empty: an embedded broker
	dataDir       string // where the embedded brokers, JetStream and the disk baselines write
	sizes         []int
	messages      int
	inflight      int
	queues        int
	producers     int // the "N producers" runs; 1: none besides the single-producer ones
	syncProducers int // producers of the sync-flush run
	samples       int // end-to-end delays to sample
	rate          int // offered rate of the end-to-end delay run, msg/s
	baseline      string
	batch         int      // WithAsyncBatching count of the batched runs; < 2: no such runs
	patterns      []string // --scenarios: path.Match patterns; empty: all
	json          bool
	progress      bool
	embedded      bool   // namesrv is an embedded broker started by this run
	profile       string // --cpuprofile: a CPU profile of each scenario to profile.<scenario>
	// cluster is, for a --cluster run, how many `flowd serve` children form the cluster;
	// 0: the single-broker scenarios instead.
	cluster       int
	clusterTopics int    // topics created for the route-convergence figures
	clusterKills  int    // kill -9 rounds of the failure-detection figures
	flowdBin      string // the executable the children run; empty: this one
	// replicaSet is, for a --replica-set run, how many `flowd serve` members the replica
	// set has; 0: no such run. catchUpMB is how far (MiB) its restarted replica is behind.
	replicaSet int
	catchUpMB  int
	// deploy is where the brokers run: deploySeparate (child processes: `flowd serve`, and
	// JetStream in a `flowd bench-jetstream-server`) or deployInProcess (goroutines of
	// this process, as the clients).
	deploy string
	// brokerPID is, in a separate run, the pid of the `flowd serve` child measured.
	brokerPID int
	// grpcAddr is the RocketMQ 5 gRPC endpoint of the bench's own broker; empty with
	// --namesrv.
	grpcAddr string
}

// Where the brokers of a run go (--deploy).
const (
	deploySeparate  = "separate"
	deployInProcess = "in-process"
)

// benchResult is one figure of a run, in the --json document. The schema is stable: fields
// are only ever added. Baseline and Ratio are null when the run had no baseline for the
// scenario.
type benchResult struct {
	Scenario string   `json:"scenario"`
	Unit     string   `json:"unit"`
	Flowd    float64  `json:"flowd"`
	Baseline *float64 `json:"baseline"`
	Ratio    *float64 `json:"ratio"`
	// BaselineName says what Baseline measured: "jetstream" (embedded NATS JetStream),
	// "disk-fsync" (1 KiB writes to the data directory, each followed by an fsync).
	BaselineName string `json:"baseline_name,omitempty"`
	// Size is the message body size of the scenario, Producers how many producers (each its
	// own connection) sent at once, InFlight how many sends each had awaiting an answer.
	Size      int `json:"size,omitempty"`
	Producers int `json:"producers,omitempty"`
	InFlight  int `json:"inflight,omitempty"`
	// Durability says when flowd (and BaselineDurability when the baseline) acknowledged a
	// message: what a throughput figure was allowed to skip.
	Durability         string `json:"durability,omitempty"`
	BaselineDurability string `json:"baseline_durability,omitempty"`
	// MessagesPerFsync is, for the sync-flush scenario, how many acknowledged messages an
	// fsync covered on average: group commit at work.
	MessagesPerFsync float64 `json:"messages_per_fsync,omitempty"`
	// For the replica-set scenarios, BaselineBefore and BaselineAfter are the one node's
	// figure measured before and after the replica sets, and Baseline their mean.
	//
	// BaselineBefore and BaselineAfter are, for the sync-flush scenario, the disk's
	// fsync-per-write rate measured just before and just after it; Baseline is their harmonic
	// mean (the rate of the mean fsync time). A shared disk's fsync rate moves from one
	// minute to the next, so a single measurement taken earlier says little about the
	// minute the scenario ran in; the two show how far it moved.
	BaselineBefore float64 `json:"baseline_before,omitempty"`
	BaselineAfter  float64 `json:"baseline_after,omitempty"`
	// LateSends is, for the delay scenario (its p99 result), the share of its sends made
	// more than 2 ms after their scheduled time, and MaxSendLateness (ns) the latest one's
	// lateness: the sender did not run in time and its owed sends went out as a burst (see
	// pacer).
	LateSends       float64 `json:"late_sends,omitempty"`
	MaxSendLateness int64   `json:"max_send_lateness,omitempty"`
	// FromSchedule is, for each delay percentile, the same percentile of the delays measured
	// from when each send was due rather than from the send call (ns): the sender's own
	// lateness included, and with it the time a catch-up burst's messages waited to be sent.
	FromSchedule float64 `json:"from_schedule,omitempty"`
	// SchedLatencyP99 and SchedLatencyMax (ns) are, for the delay scenario (its p99 result),
	// how long this process's goroutines waited to run once runnable during the sends
	// (runtime/metrics /sched/latencies:seconds, to its bucket's upper bound), and GCCycles
	// how many GC cycles ran meanwhile: a message crosses several goroutines on its way, so
	// a scheduling tail near the delay's says the tail was waits to run, not work.
	SchedLatencyP99 int64  `json:"sched_latency_p99,omitempty"`
	SchedLatencyMax int64  `json:"sched_latency_max,omitempty"`
	GCCycles        uint64 `json:"gc_cycles,omitempty"`
	// Nodes is, for the cluster scenarios, how many nodes the cluster had (the baseline,
	// "1-node", had one), and TTL (ns) the broker registry's TTL that failure detection
	// waits out.
	Nodes int   `json:"nodes,omitempty"`
	TTL   int64 `json:"ttl,omitempty"`
	// Replication is, for the replica-set scenarios, the set's mode: "sync" or "async";
	// ReplicaCPU (µs) the mean CPU time per message of its replicas' processes during a
	// throughput scenario, whose BrokerCPU is the master's (and BaselineServerCPU the one
	// node's).
	Replication string  `json:"replication,omitempty"`
	ReplicaCPU  float64 `json:"replica_cpu_us,omitempty"`
	// In a run with --deploy separate, each process's cost per message of a throughput
	// scenario's timed section: ClientCPU (µs) and ClientCtxSwitches of this process, where
	// flowd's clients run; BrokerCPU and BrokerCtxSwitches of the `flowd serve` child; the
	// Baseline ones the same of this process during the JetStream run and of the JetStream
	// child. CPURatio is flowd's total (client + broker) over JetStream's: below 1, flowd
	// spends less CPU per message.
	ClientCPU                 float64 `json:"client_cpu_us,omitempty"`
	ClientCtxSwitches         float64 `json:"client_ctxsw,omitempty"`
	BrokerCPU                 float64 `json:"broker_cpu_us,omitempty"`
	BrokerCtxSwitches         float64 `json:"broker_ctxsw,omitempty"`
	BaselineClientCPU         float64 `json:"baseline_client_cpu_us,omitempty"`
	BaselineClientCtxSwitches float64 `json:"baseline_client_ctxsw,omitempty"`
	BaselineServerCPU         float64 `json:"baseline_server_cpu_us,omitempty"`
	BaselineServerCtxSwitches float64 `json:"baseline_server_ctxsw,omitempty"`
	CPURatio                  float64 `json:"cpu_ratio,omitempty"`
	// ProcessCPU and BaselineProcessCPU are, in an in-process run, the one process's CPU
	// time per message (µs), brokers and clients together, in flowd's run and JetStream's.
	ProcessCPU         float64 `json:"process_cpu_us,omitempty"`
	BaselineProcessCPU float64 `json:"baseline_process_cpu_us,omitempty"`
	// The read and write system calls per message (/proc/<pid>/io syscr + syscw) of the
	// same four processes: the socket I/O each message cost.
	ClientSyscalls         float64 `json:"client_rw_syscalls,omitempty"`
	BrokerSyscalls         float64 `json:"broker_rw_syscalls,omitempty"`
	BaselineClientSyscalls float64 `json:"baseline_client_rw_syscalls,omitempty"`
	BaselineServerSyscalls float64 `json:"baseline_server_rw_syscalls,omitempty"`
}

// benchReport is the --json document.
type benchReport struct {
	Messages  int   `json:"messages"`
	Size      int   `json:"size"` // the first of Sizes, as before --sizes
	Sizes     []int `json:"sizes"`
	InFlight  int   `json:"inflight"`
	Queues    int   `json:"queues"`
	Producers int   `json:"producers"`
	Rate      int   `json:"rate"`
	Cluster   int   `json:"cluster,omitempty"` // --cluster: the nodes of a cluster run
	// ReplicaSet is, for a --replica-set run, the members of the replica set.
	ReplicaSet int `json:"replica_set,omitempty"`
	// Deploy is where the brokers ran: "separate" (`flowd serve` and JetStream child
	// processes, the clients in the bench's) or "in-process" (all in the bench's process).
	Deploy  string        `json:"deploy,omitempty"`
	Results []benchResult `json:"results"`
}

// Durability of what each side acknowledges, stated next to every figure.
const (
	durAsync     = "page cache (async flush: fsync within 500 ms..10 s)"
	durSyncFlush = "fsync (SYNC_FLUSH, group commit)"
	durJetStream = "page cache (JetStream file store default: fsync every 2 min)"
	durFsync     = "fsync after every write"
	durNone      = "page cache, no fsync"
)

func newResult(scenario, unit string, flowd float64, baselineName string, baseline float64) benchResult {
	r := benchResult{Scenario: scenario, Unit: unit, Flowd: flowd}
	if baselineName != "" && baseline > 0 {
		ratio := flowd / baseline
		r.Baseline, r.Ratio, r.BaselineName = &baseline, &ratio, baselineName
	}
	return r
}

// benchScenario is one step of a run. Most yield one result named after the step; the
// end-to-end delay yields its percentiles (name-p50, name-p99, name-p999).
type benchScenario struct {
	name      string
	kind      string // disk-write, disk-fsync, produce, consume, syncflush, e2e
	size      int
	mode      string // produce: sync, async or batched
	producers int
	// receivers is how many receive loops a pop-remoting scenario runs on its one consumer
	// (and fetch loops on the JetStream baseline's one durable consumer); 0 is one.
	receivers int
}

// benchScenarios lists every scenario of a configuration, in the order they run.
func benchScenarios(c benchConfig) []benchScenario {
	if c.cluster > 0 {
		return clusterScenarios()
	}
	if c.replicaSet > 0 {
		return replicaScenarios(c)
	}
	var out []benchScenario
	for _, s := range c.sizes {
		out = append(out, benchScenario{name: fmt.Sprintf("disk-write-%d", s), kind: "disk-write", size: s})
	}
	out = append(out, benchScenario{name: "disk-fsync-1024", kind: "disk-fsync", size: 1024})
	modes := []string{"async", "sync"}
	if c.batch >= 2 {
		modes = append(modes, "batched")
	}
	for _, s := range c.sizes {
		for _, m := range modes {
			counts := []int{1}
			if c.producers > 1 {
				counts = append(counts, c.producers)
			}
			for _, n := range counts {
				name := fmt.Sprintf("produce-%d-%s", s, m)
				if n > 1 {
					name += fmt.Sprintf("-p%d", n)
				}
				out = append(out, benchScenario{name: name, kind: "produce", size: s, mode: m, producers: n})
			}
			if m == "async" {
				out = append(out, benchScenario{name: fmt.Sprintf("consume-%d", s), kind: "consume", size: s})
			}
		}
	}
	out = append(out, benchScenario{name: fmt.Sprintf("produce-1024-syncflush-p%d", c.syncProducers), kind: "syncflush", size: 1024, mode: "sync", producers: c.syncProducers})
	out = append(out, benchScenario{name: "e2e-delay", kind: "e2e", size: c.sizes[0], producers: 1})
	if c.namesrv == "" { // the gRPC endpoint is the bench's own broker's
		out = append(out, grpcScenarios()...)
	}
	out = append(out, benchScenario{name: fmt.Sprintf("pop-remoting-%d", remotingPopSize), kind: "pop-remoting", size: remotingPopSize},
		benchScenario{name: fmt.Sprintf("pop-remoting-%d-r%d", remotingPopSize, remotingPopReceivers), kind: "pop-remoting", size: remotingPopSize, receivers: remotingPopReceivers})
	return out
}

// selected reports whether a scenario is one --scenarios asked for. A pattern matches a
// scenario's name or, for the delay, one of its results' names.
func (c benchConfig) selected(sc benchScenario) bool {
	if len(c.patterns) == 0 {
		return true
	}
	names := append([]string{sc.name}, c.resultNames(sc)...)
	for _, p := range c.patterns {
		for _, n := range names {
			if ok, _ := path.Match(p, n); ok {
				return true
			}
		}
	}
	return false
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("bench: --sizes %q: %w", s, err)
		}
		if n < 8 || n > 4<<20 {
			return nil, fmt.Errorf("bench: --size %d must be within 8..%d", n, 4<<20)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// benchFlags are flowd bench's flags, as parsed.
type benchFlags struct {
	c                benchConfig
	sizes, scenarios string
	size             int
	list             bool
}

// benchCommand is "flowd bench". Its flags keep the names and defaults they had under Go's
// flag package, whose single-dash spelling longFlags still accepts.
func benchCommand() *cobra.Command {
	f := &benchFlags{}
	cmd := &cobra.Command{
		Use:   "bench [flags]",
		Short: "Measure produce, consume and delivery delay against a broker",
		Long: `Measure, in one run on this machine: raw sequential-write and fsync-per-write baselines on
the data disk; produce throughput (synchronous, asynchronous with sends in flight, batched) at
each message size with one and with N producers, each next to the same load on an embedded
NATS JetStream; consume throughput; produce with the store in SYNC_FLUSH against the disk's
fsync rate; and the delay from a send to a long-polling consumer at a fixed offered rate.
Every figure is reported next to a baseline of the same run, so that figures from a noisy
machine still compare. By default (--deploy separate) the broker is a "flowd serve" child
process and JetStream another child, the clients in this process, as deployed; each
throughput figure comes with each process's CPU time, context switches and read/write system
calls per message. --deploy in-process runs them all in this process. --list prints the
scenarios a configuration runs. --cluster N runs the cluster scenarios instead: N "flowd
serve" child processes joined by NATS routes, next to one node, for route convergence,
failure detection and produce/consume throughput. --replica-set N runs the replica-set
scenarios instead: N "flowd serve" members of one replica set, in sync then async mode, next
to one node, for produce throughput, sync send latency and a restarted replica's catch-up.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.run(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	fs := cmd.Flags()
	c := &f.c
	fs.StringVar(&c.namesrv, "namesrv", "", "name server of the broker to measure (default: start an embedded broker); the sync-flush run needs the embedded one")
	fs.StringVar(&c.dataDir, "data-dir", "", "data directory of the embedded brokers, JetStream and the disk baselines (default: a temporary directory, removed afterwards)")
	fs.StringVar(&f.sizes, "sizes", "128,1024", "message body sizes in bytes, comma-separated")
	fs.IntVar(&f.size, "size", 0, "one message body size (overrides --sizes)")
	fs.IntVar(&c.messages, "messages", 50000, "messages per produce and consume scenario")
	fs.IntVar(&c.inflight, "inflight", 64, "async sends in flight per producer")
	fs.IntVar(&c.queues, "queues", 8, "queues of the benchmark topics")
	fs.IntVar(&c.producers, "producers", 8, "producers (one connection each) of the multi-producer scenarios")
	fs.IntVar(&c.syncProducers, "sync-producers", 64, "synchronous producers of the sync-flush scenario")
	fs.IntVar(&c.samples, "latency-samples", 20000, "messages sent in the end-to-end delay scenario")
	fs.IntVar(&c.rate, "rate", 10000, "offered rate of the end-to-end delay scenario, msg/s")
	fs.StringVar(&c.baseline, "baseline", "jetstream", `what to compare produce and consume with: "jetstream" (an embedded NATS JetStream, file store, one replica, under the data directory) or "none"`)
	fs.IntVar(&c.batch, "batch", 64, "messages per batch of the batched runs (producer.WithAsyncBatching); below 2: no batched runs")
	fs.StringVar(&f.scenarios, "scenarios", "", "comma-separated scenario names or patterns (produce-1024-*, consume-*); default all; --list prints them")
	fs.StringVar(&c.profile, "cpuprofile", "", "write a CPU profile of each scenario (everything in this process: with --baseline none, flowd's broker and clients alone) to `FILE`.<scenario>, and a mutex contention profile to FILE.<scenario>.mutex (cumulative over the scenarios run)")
	fs.IntVar(&c.cluster, "cluster", 0, "run the cluster scenarios instead: start this many `flowd serve` nodes (2..9) as child processes on loopback, joined by NATS routes, and a one-node run next to them")
	fs.IntVar(&c.clusterTopics, "cluster-topics", 50, "topics created one after another for the route-convergence figures (--cluster)")
	fs.IntVar(&c.clusterKills, "cluster-kills", 3, "kill -9 and restart rounds of the failure-detection figures (--cluster)")
	fs.IntVar(&c.replicaSet, "replica-set", 0, "run the replica-set scenarios instead: start this many `flowd serve` members (2..5) of one replica set as child processes on loopback, in sync then async mode, next to one node: produce throughput of --producers async producers, sync send latency (--latency-samples sends), a restarted replica's catch-up")
	fs.IntVar(&c.catchUpMB, "catchup-mb", 64, "MiB of 16 KiB messages a stopped replica is left behind by before it restarts (--replica-set)")
	fs.StringVar(&c.flowdBin, "flowd-binary", "", "the flowd executable the --cluster nodes and the --deploy separate children run (default: this one)")
	fs.StringVar(&c.deploy, "deploy", deploySeparate, `where the brokers run: "separate" (a flowd serve child on free loopback ports and a temporary data directory, and JetStream in a child of its own, the clients in this process, each process's CPU, context switches and read/write syscalls per message reported: as deployed) or "in-process" (brokers and clients in this one process)`)
	fs.BoolVar(&f.list, "list", false, "print the scenarios this configuration and --scenarios would run, and exit")
	fs.BoolVar(&c.json, "json", false, `print one JSON document {"messages","size","sizes","inflight","queues","producers","rate","deploy","results":[{"scenario","unit","flowd","baseline","ratio","baseline_name","client_cpu_us","broker_cpu_us",…}]} instead of text`)
	return cmd
}

// bench runs "flowd bench" with args, its flags.
func bench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := benchCommand()
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	return cmd.ExecuteContext(ctx)
}

// plan checks the flags and returns the configuration they make and the scenarios they
// select, in the order they run.
func (f *benchFlags) plan() (benchConfig, []benchScenario, error) {
	c, sizes := f.c, f.sizes
	var err error
	if f.size != 0 {
		sizes = strconv.Itoa(f.size)
	}
	if c.sizes, err = parseSizes(sizes); err != nil {
		return c, nil, err
	}
	switch {
	case c.messages < 1:
		return c, nil, fmt.Errorf("bench: --messages %d must be positive", c.messages)
	case c.inflight < 1:
		return c, nil, fmt.Errorf("bench: --inflight %d must be positive", c.inflight)
	case c.queues < 1 || c.queues > 1024:
		return c, nil, fmt.Errorf("bench: --queues %d must be within 1..1024", c.queues)
	case c.producers < 1 || c.producers > 1000:
		return c, nil, fmt.Errorf("bench: --producers %d must be within 1..1000", c.producers)
	case c.syncProducers < 1 || c.syncProducers > 1000:
		return c, nil, fmt.Errorf("bench: --sync-producers %d must be within 1..1000", c.syncProducers)
	case c.baseline != "jetstream" && c.baseline != "none":
		return c, nil, fmt.Errorf(`bench: --baseline %q must be "jetstream" or "none"`, c.baseline)
	case c.samples < 1:
		return c, nil, fmt.Errorf("bench: --latency-samples %d must be positive", c.samples)
	case c.rate < 1 || c.rate > 1_000_000:
		return c, nil, fmt.Errorf("bench: --rate %d must be within 1..1000000", c.rate)
	case c.cluster != 0 && (c.cluster < 2 || c.cluster > 9):
		return c, nil, fmt.Errorf("bench: --cluster %d must be within 2..9", c.cluster)
	case c.cluster != 0 && c.namesrv != "":
		return c, nil, errors.New("bench: --cluster starts its own nodes: it takes no --namesrv")
	case c.replicaSet != 0 && (c.replicaSet < 2 || c.replicaSet > 5 || c.cluster != 0 || c.namesrv != ""):
		return c, nil, fmt.Errorf("bench: --replica-set %d must be within 2..5, without --cluster or --namesrv", c.replicaSet)
	case c.catchUpMB < 1:
		return c, nil, fmt.Errorf("bench: --catchup-mb %d must be positive", c.catchUpMB)
	case c.deploy != deploySeparate && c.deploy != deployInProcess:
		return c, nil, fmt.Errorf(`bench: --deploy %q must be "separate" or "in-process"`, c.deploy)
	case c.clusterTopics < 1 || c.clusterKills < 1:
		return c, nil, fmt.Errorf("bench: --cluster-topics %d and --cluster-kills %d must be positive", c.clusterTopics, c.clusterKills)
	}
	for _, p := range strings.Split(f.scenarios, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if _, err := path.Match(p, ""); err != nil {
			return c, nil, fmt.Errorf("bench: --scenarios %q: %w", p, err)
		}
		c.patterns = append(c.patterns, p)
	}
	var plan []benchScenario
	for _, sc := range benchScenarios(c) {
		if c.selected(sc) {
			plan = append(plan, sc)
		}
	}
	if len(plan) == 0 && !f.list {
		return c, nil, fmt.Errorf("bench: --scenarios %q matches none of this configuration's scenarios (see --list)", f.scenarios)
	}
	return c, plan, nil
}

// run runs the scenarios the flags select (see benchCommand), or lists them.
func (f *benchFlags) run(ctx context.Context, stdout, stderr io.Writer) error {
	c, plan, err := f.plan()
	if err != nil {
		return err
	}
	if f.list {
		for _, sc := range plan {
			fmt.Fprintln(stdout, sc.name)
		}
		return nil
	}
	if c.cluster > 0 {
		return f.runCluster(ctx, c, plan, stdout)
	}
	if c.replicaSet > 0 {
		return f.runReplicaSet(ctx, c, plan, stdout)
	}
	c.progress = !c.json && isTerminal(stderr)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if c.deploy == deploySeparate {
		// An interrupt ends the run through ctx, so that the deferred kills reap the children.
		var stop context.CancelFunc
		ctx, stop = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := c.defaultFlowdBin(); err != nil {
			return err
		}
	}
	undo, err := c.setUp(ctx, quiet)
	if err != nil {
		return err
	}
	defer undo()

	text := stdout
	if c.json {
		text = io.Discard
	}
	fmt.Fprintf(text, "flowd bench: %d messages of %v B per scenario, %d in flight per producer, 1 and %d producers, %d queues, name server %s\n",
		c.messages, c.sizes, c.inflight, c.producers, c.queues, c.namesrv)
	fmt.Fprintf(text, "flowd acknowledges in the %s; JetStream in the %s\n", durAsync, durJetStream)
	if c.deploy == deploySeparate {
		fmt.Fprintf(text, "brokers in child processes (flowd serve, pid %d; JetStream: flowd bench-jetstream-server), clients in this one (pid %d); CPU per message in µs and context switches per message of each process\n", c.brokerPID, os.Getpid())
	} else {
		fmt.Fprintln(text, "brokers and clients in this one process (--deploy in-process)")
	}
	results, err := runPlan(ctx, c, plan, quiet, text, stderr)
	if err != nil {
		return err
	}
	if !c.json {
		return nil
	}
	return writeReport(stdout, benchReport{Messages: c.messages, Size: c.sizes[0], Sizes: c.sizes, InFlight: c.inflight,
		Queues: c.queues, Producers: c.producers, Rate: c.rate, Deploy: c.deploy, Results: results})
}

// setUp gives the run a data directory (a temporary one unless --data-dir named one) and,
// unless --namesrv named one, a broker to measure: a `flowd serve` child in a separate run,
// an embedded one in an in-process run; undo stops and removes what it started.
func (c *benchConfig) setUp(ctx context.Context, log *slog.Logger) (undo func(), err error) {
	removeDir := func() {}
	if c.dataDir == "" {
		dir, err := os.MkdirTemp("", "flowd-bench-")
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		removeDir = func() { _ = os.RemoveAll(dir) }
		c.dataDir = dir
	}
	if c.namesrv != "" {
		return removeDir, nil
	}
	if c.deploy == deploySeparate {
		grpcAddr, err := benchGRPCPort()
		if err != nil {
			removeDir()
			return nil, err
		}
		nodes, err := startBenchCluster(ctx, *c, "broker", 1, "--grpc-listen", grpcAddr)
		if err != nil {
			removeDir()
			return nil, err
		}
		c.grpcAddr = grpcAddr
		c.namesrv, c.embedded, c.brokerPID = nodes[0].namesrv, true, nodes[0].cmd.Process.Pid
		return func() {
			stopBenchNodes(nodes)
			removeDir()
		}, nil
	}
	b, err := startBenchBroker(*c, "broker", store.FlushAsync, log)
	if err != nil {
		removeDir()
		return nil, err
	}
	grpcAddr, stopGRPC, err := startBenchGRPC(b, log)
	if err != nil {
		removeDir()
		return nil, errors.Join(err, b.Shutdown(context.Background()))
	}
	c.namesrv, c.embedded, c.grpcAddr = b.NamesrvAddr(), true, grpcAddr
	return func() {
		stopGRPC()
		_ = b.Shutdown(context.Background())
		removeDir()
	}, nil
}

// runPlan runs the scenarios in order, each result printed to text as it comes, with a
// progress bar on stderr when c.progress, and returns the results.
func runPlan(ctx context.Context, c benchConfig, plan []benchScenario, log *slog.Logger, text, stderr io.Writer) ([]benchResult, error) {
	var bar *progressbar.ProgressBar
	if c.progress {
		bar = progressbar.NewOptions(len(plan), progressbar.OptionSetWriter(stderr),
			progressbar.OptionSetDescription("bench"), progressbar.OptionShowCount(),
			progressbar.OptionClearOnFinish(), progressbar.OptionThrottle(100*time.Millisecond))
		defer bar.Exit()
	}
	r := &benchRun{c: c, log: log, asyncTopic: map[int]string{}, jsSubject: map[int]string{}, jsAsync: map[[2]int]jsFigures{}}
	defer r.close()
	if c.baseline == "jetstream" {
		var err error
		if r.js, err = startJetStream(ctx, c); err != nil {
			return nil, err
		}
	}
	var results []benchResult
	for _, sc := range plan {
		if bar != nil {
			bar.Describe(sc.name)
		}
		got, err := r.profiled(ctx, sc)
		if err != nil {
			return nil, err
		}
		for _, res := range got {
			results = append(results, res)
			if bar != nil {
				_ = bar.Clear()
			}
			fmt.Fprintln(text, formatResult(res))
		}
		if bar != nil {
			_ = bar.Add(1)
		}
	}
	if bar != nil {
		_ = bar.Finish()
	}
	return results, nil
}

// formatResult is a result's line in the text output.
func formatResult(r benchResult) string {
	value := fmt.Sprintf("%12.0f %-5s", r.Flowd, r.Unit)
	if r.Unit == "ns" {
		value = fmt.Sprintf("%12v %-5s", time.Duration(r.Flowd).Round(time.Microsecond), "")
	}
	line := fmt.Sprintf("  %-30s %s", r.Scenario, value)
	if r.Ratio != nil && r.Unit == "ns" {
		line += fmt.Sprintf("  %s %v  ratio %.2f×", r.BaselineName, time.Duration(*r.Baseline).Round(time.Microsecond), *r.Ratio)
	} else if r.Ratio != nil {
		line += fmt.Sprintf("  %s %.0f  ratio %.2f×", r.BaselineName, *r.Baseline, *r.Ratio)
	}
	if r.MessagesPerFsync > 0 {
		line += fmt.Sprintf("  (%.1f messages per fsync)", r.MessagesPerFsync)
	}
	if r.BaselineBefore > 0 && r.Unit == "ns" {
		line += fmt.Sprintf("  (%s %v before, %v after)", r.BaselineName, time.Duration(r.BaselineBefore).Round(time.Microsecond),
			time.Duration(r.BaselineAfter).Round(time.Microsecond))
	} else if r.BaselineBefore > 0 {
		line += fmt.Sprintf("  (%s %.0f before, %.0f after)", r.BaselineName, r.BaselineBefore, r.BaselineAfter)
	}
	if r.FromSchedule > 0 {
		line += fmt.Sprintf("  (from schedule %v)", time.Duration(r.FromSchedule).Round(time.Microsecond))
	}
	if r.SchedLatencyMax > 0 {
		line += fmt.Sprintf("  (waits to run p99 %v, max %v; %d GC cycles)", time.Duration(r.SchedLatencyP99).Round(time.Microsecond),
			time.Duration(r.SchedLatencyMax).Round(time.Microsecond), r.GCCycles)
	}
	if r.BrokerCPU > 0 {
		line += fmt.Sprintf("\n  %-30s per msg: cpu client %.1f µs + broker %.1f µs; ctx switches %.2f, %.2f; read/write syscalls %.2f, %.2f", "",
			r.ClientCPU, r.BrokerCPU, r.ClientCtxSwitches, r.BrokerCtxSwitches, r.ClientSyscalls, r.BrokerSyscalls)
		if r.ReplicaCPU > 0 {
			line += fmt.Sprintf("; cpu of each replica %.1f µs", r.ReplicaCPU)
		}
		if r.BaselineServerCPU > 0 {
			line += fmt.Sprintf("\n  %-30s %-13s cpu client %.1f µs + server %.1f µs; ctx switches %.2f, %.2f; read/write syscalls %.2f, %.2f; flowd/%s cpu %.2f", "",
				r.BaselineName+":", r.BaselineClientCPU, r.BaselineServerCPU, r.BaselineClientCtxSwitches, r.BaselineServerCtxSwitches,
				r.BaselineClientSyscalls, r.BaselineServerSyscalls, r.BaselineName, r.CPURatio)
		}
	}
	if r.ProcessCPU > 0 {
		line += fmt.Sprintf("\n  %-30s per msg: cpu of the one process %.1f µs", "", r.ProcessCPU)
		if r.BaselineProcessCPU > 0 {
			line += fmt.Sprintf("; %s's run %.1f µs; flowd/%s cpu %.2f", r.BaselineName, r.BaselineProcessCPU, r.BaselineName, r.CPURatio)
		}
	}
	if r.MaxSendLateness > 0 {
		line += fmt.Sprintf("  (%.1f %% of sends >2 ms late, the latest by %v)", 100*r.LateSends,
			time.Duration(r.MaxSendLateness).Round(10*time.Microsecond))
	}
	return line
}

// startBenchBroker starts an embedded broker on loopback ports under the data directory.
func startBenchBroker(c benchConfig, dir string, mode store.FlushMode, log *slog.Logger) (*broker.Broker, error) {
	cfg := broker.Config{
		DataDir: filepath.Join(c.dataDir, dir), Listen: "127.0.0.1:0", NamesrvListen: "127.0.0.1:0",
		DefaultTopicQueues: c.queues, Logger: log,
	}
	cfg.Store.FlushMode = mode
	b, err := broker.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("bench: start embedded broker: %w", err)
	}
	if err := b.Start(); err != nil {
		return nil, errors.Join(fmt.Errorf("bench: start embedded broker: %w", err), b.Shutdown(context.Background()))
	}
	return b, nil
}

// benchMutexFraction is the mutex profile's sampling: one contention in this many.
const benchMutexFraction = 5

// startProfile starts a CPU profile written to file.scenario, and a mutex profile written to
// file.scenario.mutex when it stops, and returns what stops them; with no file it does
// nothing. The runtime's mutex profile only grows, so a scenario's holds the contentions of
// those profiled before it too.
func startProfile(file, scenario string) (stop func(), err error) {
	if file == "" {
		return func() {}, nil
	}
	f, err := os.Create(file + "." + scenario)
	if err != nil {
		return nil, fmt.Errorf("bench: cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("bench: cpu profile: %w", err)
	}
	// The mutex profile says what goroutines queued on (with several producers, the
	// store's append lock); one contention in benchMutexFraction is recorded.
	runtime.SetMutexProfileFraction(benchMutexFraction)
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		runtime.SetMutexProfileFraction(0)
		if g, err := os.Create(file + "." + scenario + ".mutex"); err == nil {
			if err := pprof.Lookup("mutex").WriteTo(g, 0); err != nil {
				slog.Warn("bench: mutex profile", "file", g.Name(), "err", err)
			}
			g.Close()
		}
	}, nil
}

// defaultFlowdBin makes this executable the flowd the child processes run, unless
// --flowd-binary named one.
func (c *benchConfig) defaultFlowdBin() error {
	if c.flowdBin != "" {
		return nil
	}
	bin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench: the flowd executable: %w", err)
	}
	c.flowdBin = bin
	return nil
}

// writeReport writes the --json document.
func writeReport(w io.Writer, r benchReport) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}
