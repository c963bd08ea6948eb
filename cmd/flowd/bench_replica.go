package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/flowd-io/flowd/producer"
)

// benchReplicaBroker is the broker name every member of the bench's replica set shares.
const benchReplicaBroker = "rs"

// benchLeaseTTL is the replica set's lease TTL in the bench, above the 3 s default: killing
// a member for the catch-up can cost the cluster's JetStream a leader election, and on a
// loaded machine that outlasted two thirds of 3 s, the master fenced itself and the backlog's
// sends were refused. The bench measures replication, not failover.
const benchLeaseTTL = 10 * time.Second

// benchCatchUpBody is the body size of the messages a stopped replica is left behind by:
// large, so that producing the backlog takes little of the run.
const benchCatchUpBody = 16 << 10

// replicaScenarios are the scenarios of a --replica-set run, in the order their figures
// come: throughput and send latency of a sync-mode set, then of an async-mode set, each next
// to one node's, then the catch-up of a restarted replica.
func replicaScenarios(c benchConfig) []benchScenario {
	p := c.producers
	var out []benchScenario
	for _, mode := range []string{"sync", "async"} {
		out = append(out,
			benchScenario{name: fmt.Sprintf("replica-%s-produce-1024-p%d", mode, p), kind: "replica-produce", size: 1024, mode: mode, producers: p},
			benchScenario{name: fmt.Sprintf("replica-%s-send-1024", mode), kind: "replica-latency", size: 1024, mode: mode, producers: 1})
	}
	return append(out, benchScenario{name: "replica-catchup", kind: "replica-catchup", size: benchCatchUpBody})
}

// replicaRun is the state of one --replica-set run.
type replicaRun struct {
	c    benchConfig
	log  *slog.Logger
	text io.Writer
	plan []benchScenario
	out  []benchResult
	// catchUpRate (MB/s) and catchUpTime are the replica-catchup figures, once measured.
	catchUpRate float64
	catchUpTime time.Duration
}

// replicaFigures are what one broker (a single node or a replica set's master) measured.
type replicaFigures struct {
	produce    float64 // msg/s of c.producers async producers
	p50, p99   float64 // ns, one producer's sync sends
	w          *window // this process and the master over the produce's timed section
	replicaCPU float64 // µs per message, the mean of the replicas' processes
}

// has reports whether the plan holds a scenario of kind in mode ("" any).
func (r *replicaRun) has(kind, mode string) bool {
	return slices.ContainsFunc(r.plan, func(sc benchScenario) bool { return sc.kind == kind && (mode == "" || sc.mode == mode) })
}

// runReplicaSet measures one node, then a sync-mode and an async-mode replica set of
// c.replicaSet `flowd serve` children; every child is killed before it returns.
func runReplicaSet(ctx context.Context, c benchConfig, plan []benchScenario, text io.Writer) ([]benchResult, error) {
	if c.dataDir == "" {
		dir, err := os.MkdirTemp("", "flowd-bench-replica-")
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		defer os.RemoveAll(dir)
		c.dataDir = dir
	}
	r := &replicaRun{c: c, log: discardLogger(), text: text, plan: plan}
	one := r.has("replica-produce", "") || r.has("replica-latency", "")
	var before, after replicaFigures
	var err error
	if one {
		if before, err = r.measureOne(ctx, "single"); err != nil {
			return nil, err
		}
	}
	sets := map[string]replicaFigures{}
	for _, mode := range []string{"sync", "async"} {
		catchUp := mode == "async" && r.has("replica-catchup", "")
		if !r.has("replica-produce", mode) && !r.has("replica-latency", mode) && !catchUp {
			continue
		}
		if sets[mode], err = r.runSet(ctx, mode, catchUp); err != nil {
			return nil, fmt.Errorf("bench: replica set, %s mode: %w", mode, err)
		}
	}
	if one {
		// Measured again after the sets: a shared machine's speed moves from one minute to
		// the next, and the mean of the two is the fairer baseline.
		if after, err = r.measureOne(ctx, "single-after"); err != nil {
			return nil, err
		}
	}
	for _, mode := range []string{"sync", "async"} {
		if got, ok := sets[mode]; ok {
			r.emitSet(mode, got, before, after)
		}
	}
	if r.catchUpRate > 0 {
		r.emit(r.result("replica-catchup", "MB/s", r.catchUpRate, 0, "async", 0))
		r.emit(r.result("replica-catchup-time", "ns", float64(r.catchUpTime), 0, "async", 0))
	}
	return r.out, nil
}

// measureOne measures one `flowd serve` node under dir.
func (r *replicaRun) measureOne(ctx context.Context, dir string) (replicaFigures, error) {
	nodes, err := startBenchCluster(ctx, r.c, dir, 1)
	if err != nil {
		return replicaFigures{}, err
	}
	defer stopBenchNodes(nodes)
	got, err := r.measure(ctx, nodes[0], nil, "")
	if err != nil {
		return got, fmt.Errorf("bench: one node: %w", err)
	}
	return got, nil
}

// runSet starts a replica set in mode, measures it and, if catchUp, the catch-up of its last
// member after a restart.
func (r *replicaRun) runSet(ctx context.Context, mode string, catchUp bool) (replicaFigures, error) {
	nodes, err := startBenchReplicaSet(ctx, r.c, mode, r.c.replicaSet)
	if err != nil {
		return replicaFigures{}, err
	}
	defer stopBenchNodes(nodes)
	got, err := r.measure(ctx, nodes[0], nodes[1:], mode)
	if err != nil || !catchUp {
		return got, err
	}
	if r.catchUpRate, r.catchUpTime, err = r.catchUp(ctx, nodes[0], nodes[len(nodes)-1]); err != nil {
		return got, fmt.Errorf("replica-catchup: %w", err)
	}
	return got, nil
}

// emitSet adds the figures of the set in mode, each next to the mean of the one node's
// before and after the sets.
func (r *replicaRun) emitSet(mode string, got, before, after replicaFigures) {
	vs := func(res benchResult, b, a float64) benchResult {
		if b > 0 && a > 0 {
			res = r.result(res.Scenario, res.Unit, res.Flowd, (b+a)/2, mode, res.Producers)
			res.BaselineBefore, res.BaselineAfter = b, a
		}
		return res
	}
	if r.has("replica-produce", mode) {
		p := r.c.producers
		res := vs(r.result(fmt.Sprintf("replica-%s-produce-1024-p%d", mode, p), "msg/s", got.produce, 0, mode, p), before.produce, after.produce)
		res.addCosts(got.w, before.w, r.c.messages)
		res.ReplicaCPU = got.replicaCPU
		if base := res.BaselineClientCPU + res.BaselineServerCPU; base > 0 {
			res.CPURatio = (res.ClientCPU + res.BrokerCPU + float64(r.c.replicaSet-1)*res.ReplicaCPU) / base
		}
		r.emit(res)
	}
	if r.has("replica-latency", mode) {
		r.emit(vs(r.result(fmt.Sprintf("replica-%s-send-1024-p50", mode), "ns", got.p50, 0, mode, 1), before.p50, after.p50))
		r.emit(vs(r.result(fmt.Sprintf("replica-%s-send-1024-p99", mode), "ns", got.p99, 0, mode, 1), before.p99, after.p99))
	}
}

// measure takes the figures the plan asks of mode ("" for the one node: every mode's)
// from broker b, whose replicas are reps: the produce throughput with each process's CPU
// and the sync sends' latency.
func (r *replicaRun) measure(ctx context.Context, b *benchNode, reps []*benchNode, mode string) (replicaFigures, error) {
	var got replicaFigures
	c := r.c
	c.namesrv = b.namesrv
	if r.has("replica-produce", mode) {
		before, err := sampleNodes(reps)
		if err != nil {
			return got, err
		}
		got.w = newWindow(b.cmd.Process.Pid)
		if _, got.produce, err = flowdProduce(ctx, c, b.namesrv, "async", 1024, c.producers, r.log, got.w); err != nil {
			return got, err
		}
		after, err := sampleNodes(reps)
		if err != nil {
			return got, err
		}
		for i := range reps {
			got.replicaCPU += float64(after[i].sub(before[i]).cpu.Nanoseconds()) / 1e3 / float64(c.messages) / float64(len(reps))
		}
	}
	if r.has("replica-latency", mode) {
		ds, err := sendLatencies(ctx, c, b.namesrv, r.log)
		if err != nil {
			return got, err
		}
		got.p50, got.p99 = float64(quantileOf(ds, 0.50)), float64(quantileOf(ds, 0.99))
	}
	return got, nil
}

// sampleNodes reads each node's process counters.
func sampleNodes(nodes []*benchNode) ([]procSample, error) {
	out := make([]procSample, len(nodes))
	for i, nd := range nodes {
		s, err := readProc(nd.cmd.Process.Pid)
		if err != nil {
			return nil, err
		}
		out[i] = s
	}
	return out, nil
}

// result is a result of the run, next to the one node's figure when single is positive.
func (r *replicaRun) result(name, unit string, v, single float64, mode string, producers int) benchResult {
	base := ""
	if single > 0 {
		base = "1-node"
	}
	res := newResult(name, unit, v, base, single)
	res.Nodes, res.Replication, res.Producers = r.c.replicaSet, mode, producers
	res.Size, res.Durability = 1024, durAsync
	if strings.HasPrefix(name, "replica-catchup") {
		res.Size, res.Durability = benchCatchUpBody, ""
	}
	if unit == "msg/s" {
		res.InFlight = r.c.inflight
	}
	return res
}

// emit adds a result and prints it.
func (r *replicaRun) emit(res benchResult) {
	r.out = append(r.out, res)
	fmt.Fprintln(r.text, formatResult(res))
}

// sendLatencies sends c.samples 1 KiB bodies one at a time with one producer to a new
// topic and returns each send's time to its answer, sorted.
func sendLatencies(ctx context.Context, c benchConfig, namesrv string, log *slog.Logger) ([]time.Duration, error) {
	p, err := startBenchProducer(ctx, c, namesrv, "flowd-bench-latency", log)
	if err != nil {
		return nil, err
	}
	defer p.Close(context.Background())
	topic := fmt.Sprintf("flowd-bench-latency-%d", time.Now().UnixNano())
	body := make([]byte, 1024)
	if _, err := p.Send(ctx, &producer.Message{Topic: topic, Body: body}); err != nil { // the route, outside the clock
		return nil, fmt.Errorf("bench: first send: %w", err)
	}
	ds := make([]time.Duration, 0, c.samples)
	for range c.samples {
		t0 := time.Now()
		if _, err := p.Send(ctx, &producer.Message{Topic: topic, Body: body}); err != nil {
			return nil, fmt.Errorf("bench: send %d: %w", len(ds), err)
		}
		ds = append(ds, time.Since(t0))
	}
	slices.Sort(ds)
	return ds, nil
}

// catchUp waits until the replica holds the master's log, kills it, leaves it c.catchUpMB
// behind with 16 KiB sends to the master, restarts it and times, from its connection to
// the master (the first time the master's metrics list it) until it holds the master's
// end, the rate it copied the backlog at (MB/s); d is the time from the restart until it
// caught up, the process's start, its NATS and lease reads and its dial included. A backlog
// copied before the master was first seen listing the replica is timed from the restart.
func (r *replicaRun) catchUp(ctx context.Context, master, rep *benchNode) (rate float64, d time.Duration, err error) {
	node := benchReplicaBroker + "-" + strconv.Itoa(r.c.replicaSet)
	if err := pollFor(ctx, benchNodeWait, 5*time.Millisecond, func() (bool, error) {
		lag, ok, err := replicaLag(ctx, master, node)
		return ok && lag == 0, err
	}, "replica "+node+" holds the master's log"); err != nil {
		return 0, 0, err
	}
	from, err := commitLogEnd(ctx, master)
	if err != nil {
		return 0, 0, err
	}
	rep.kill()
	if err := r.backlog(ctx, master); err != nil {
		return 0, 0, err
	}
	to, err := commitLogEnd(ctx, master)
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	if err := rep.start(); err != nil {
		return 0, 0, err
	}
	var seen time.Time
	last := "never listed"
	err = pollFor(ctx, benchNodeWait, 2*time.Millisecond, func() (bool, error) {
		lag, ok, err := replicaLag(ctx, master, node)
		if err != nil || !ok {
			return false, err
		}
		last = fmt.Sprintf("%.0f bytes behind", lag)
		if seen.IsZero() {
			seen = time.Now()
			if lag == 0 {
				seen = start
			}
		}
		return lag == 0, nil
	}, "replica "+node+" caught up")
	if err != nil {
		return 0, 0, fmt.Errorf("%w (the master's metrics: %s; the replica's log ends %q)", err, last, logTail(rep.logs.String(), 3))
	}
	end := time.Now()
	return float64(to-from) / 1e6 / max(end.Sub(seen).Seconds(), 1e-3), end.Sub(start), nil
}

// logTail is the last n lines of a child's output.
func logTail(logs string, n int) string {
	lines := strings.Split(strings.TrimRight(logs, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// backlog sends c.catchUpMB of 16 KiB random bodies to the master with one async producer:
// random, since the producer compresses a body over 4 KiB and a zeroed one would shrink to
// almost nothing.
func (r *replicaRun) backlog(ctx context.Context, master *benchNode) error {
	p, err := startBenchProducer(ctx, r.c, master.namesrv, "flowd-bench-catchup", r.log)
	if err != nil {
		return err
	}
	defer p.Close(context.Background())
	body := make([]byte, benchCatchUpBody)
	for i := range body {
		body[i] = byte(rand.Uint32())
	}
	topic := fmt.Sprintf("flowd-bench-catchup-%d", time.Now().UnixNano())
	if err := sendN(ctx, p, topic, body, max(1, r.c.catchUpMB<<20/benchCatchUpBody), "async", r.c.inflight); err != nil {
		return fmt.Errorf("bench: catch-up backlog: %w", err)
	}
	return nil
}

// commitLogEnd reads the master's metrics for its commit log's written end.
func commitLogEnd(ctx context.Context, master *benchNode) (int64, error) {
	v, ok, err := metricValue(ctx, master, `flowd_store_commit_log_offset_bytes{position="max"} `)
	if err == nil && !ok {
		err = fmt.Errorf("bench: node %s reports no commit log end", master.name)
	}
	return int64(v), err
}

// replicaLag reads the master's metrics for how far replica node's acknowledged log is
// behind its end; ok is false while node is not connected.
func replicaLag(ctx context.Context, master *benchNode, node string) (lag float64, ok bool, err error) {
	return metricValue(ctx, master, `flowd_replication_replica_lag_bytes{replica="`+node+`"} `)
}

// metricValue is the value of the node's metric line that starts with prefix; ok is false
// when there is none.
func metricValue(ctx context.Context, nd *benchNode, prefix string) (v float64, ok bool, err error) {
	page, err := scrapeMetrics(ctx, nd.http)
	if err != nil {
		return 0, false, err
	}
	for _, line := range strings.Split(page, "\n") {
		if val, found := strings.CutPrefix(line, prefix); found {
			v, err = strconv.ParseFloat(strings.TrimSpace(val), 64)
			if err != nil {
				return 0, false, fmt.Errorf("bench: metric %s of %s: %w", prefix, nd.name, err)
			}
			return v, true, nil
		}
	}
	return 0, false, nil
}

// scrapeMetrics fetches a node's /metrics page.
func scrapeMetrics(ctx context.Context, addr string) (string, error) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return "", fmt.Errorf("bench: metrics of %s: %w", addr, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("bench: metrics of %s: %w", addr, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("bench: metrics of %s: %w", addr, err)
	}
	return string(b), nil
}

// benchHTTP is the child's HTTP address in its "flowd serving" line.
var benchHTTP = regexp.MustCompile(`msg="flowd serving".* http=(\S+)`)

// startBenchReplicaSet starts n members of one replica set in mode (broker ids 1..n, one
// broker name, joined by NATS routes, the lease in their JetStream) and waits until member
// 1, the first master, has every other member in sync.
func startBenchReplicaSet(ctx context.Context, c benchConfig, mode string, n int) ([]*benchNode, error) {
	ports, err := benchPorts(n)
	if err != nil {
		return nil, err
	}
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	var nodes []*benchNode
	fail := func(err error) ([]*benchNode, error) {
		stopBenchNodes(nodes)
		return nil, err
	}
	for i := range n {
		name := fmt.Sprintf("%s-%s-%d", mode, benchReplicaBroker, i+1)
		nd := &benchNode{name: name, bin: c.flowdBin, args: []string{"serve",
			"--data-dir", filepath.Join(c.dataDir, name), "--cluster", benchClusterName, "--broker-name", benchReplicaBroker,
			"--listen", "127.0.0.1:0", "--namesrv-listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0",
			"--http-listen", "127.0.0.1:0", "--grpc-listen", "off", "--ha-listen", "127.0.0.1:0",
			"--replication", mode, "--broker-id", strconv.Itoa(i + 1), "--replication-lease-ttl", benchLeaseTTL.String(),
			"--nats-cluster-listen", fmt.Sprintf("127.0.0.1:%d", ports[i]), "--nats-routes", strings.Join(routes, ",")}}
		if err := nd.start(); err != nil {
			return fail(err)
		}
		nodes = append(nodes, nd)
	}
	for _, nd := range nodes {
		if err := nd.awaitServing(ctx); err != nil {
			return fail(err)
		}
		m, err := nd.awaitLine(ctx, benchHTTP)
		if err != nil {
			return fail(err)
		}
		nd.http = m[1]
	}
	want := fmt.Sprintf("flowd_replication_in_sync_replicas %d\n", n-1)
	err = pollFor(ctx, benchNodeWait, 20*time.Millisecond, func() (bool, error) {
		page, err := scrapeMetrics(ctx, nodes[0].http)
		return err == nil && strings.Contains(page, "flowd_replication_master 1\n") && strings.Contains(page, want), nil
	}, fmt.Sprintf("member 1 of the replica set is master with %d replicas in sync", n-1))
	if err != nil {
		return fail(err)
	}
	return nodes, nil
}

// runReplicaSet is "flowd bench --replica-set N": the replica-set scenarios, printed as text
// or as the --json document.
func (f *benchFlags) runReplicaSet(ctx context.Context, c benchConfig, plan []benchScenario, stdout io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := c.defaultFlowdBin(); err != nil {
		return err
	}
	text := stdout
	if c.json {
		text = io.Discard
	}
	fmt.Fprintf(text, "flowd bench --replica-set %d: `flowd serve` members of one replica set on loopback (store.flush async), sync then async mode, next to one node; %d messages of 1024 B by %d producers, %d in flight each; %d sync sends by one producer; catch-up of %d MiB\n",
		c.replicaSet, c.messages, c.producers, c.inflight, c.samples, c.catchUpMB)
	results, err := runReplicaSet(ctx, c, plan, text)
	if err != nil {
		return err
	}
	if !c.json {
		return nil
	}
	return writeReport(stdout, benchReport{Messages: c.messages, Size: 1024, Sizes: []int{1024}, InFlight: c.inflight,
		Queues: c.queues, Producers: c.producers, Rate: c.rate, ReplicaSet: c.replicaSet, Results: results})
}
