package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/flowd-io/flowd/internal/clientcore"
)

// benchRegistryTTL is the TTL of serve's broker registry (cluster.Options' default, which
// serve keeps): the failure-detection figures are read against it.
const benchRegistryTTL = 6 * time.Second

// clusterScenarios are the scenarios of a --cluster run, in the order they run: the
// throughput pair first (the one-node run before the cluster starts, so that the two never
// share the cores), then route convergence, then the kills.
func clusterScenarios() []benchScenario {
	return []benchScenario{
		{name: "cluster-produce-1024-async", kind: "cluster-produce", size: 1024, mode: "async", producers: 1},
		{name: "cluster-consume-1024", kind: "cluster-consume", size: 1024},
		{name: "cluster-route-convergence", kind: "cluster-convergence"},
		{name: "cluster-failure-detection", kind: "cluster-failure"},
	}
}

// resultNames are the names of a scenario's results, which --scenarios may match too.
func (c benchConfig) resultNames(sc benchScenario) []string {
	switch sc.kind {
	case "e2e":
		return []string{sc.name + "-p50", sc.name + "-p99", sc.name + "-p999"}
	case "cluster-convergence":
		return []string{sc.name + "-p50", sc.name + "-p99", sc.name + "-max"}
	case "replica-latency":
		return []string{sc.name + "-p50", sc.name + "-p99"}
	case "replica-catchup":
		return []string{sc.name + "-time"}
	case "cluster-failure":
		var out []string
		for i := range c.clusterKills {
			out = append(out, fmt.Sprintf("%s-%d", sc.name, i+1))
		}
		return append(out, sc.name+"-mean")
	case "grpc-send":
		return grpcResultNames(sc)
	}
	return nil
}

// clusterRun is the state of one --cluster run.
type clusterRun struct {
	c     benchConfig
	log   *slog.Logger
	text  io.Writer
	plan  []benchScenario
	out   []benchResult
	names []string // the cluster's broker names, sorted
}

// runCluster starts the nodes of a --cluster run as `flowd serve` child processes and runs
// the selected cluster scenarios against them; every child is killed before it returns.
func runCluster(ctx context.Context, c benchConfig, plan []benchScenario, text io.Writer) ([]benchResult, error) {
	if c.dataDir == "" {
		dir, err := os.MkdirTemp("", "flowd-bench-cluster-")
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		defer os.RemoveAll(dir)
		c.dataDir = dir
	}
	r := &clusterRun{c: c, log: discardLogger(), text: text, plan: plan}
	for i := range c.cluster {
		r.names = append(r.names, fmt.Sprintf("node-%d", i+1))
	}
	var single [2]float64
	if r.has("cluster-produce") || r.has("cluster-consume") {
		nodes, err := startBenchCluster(ctx, c, "single", 1)
		if err != nil {
			return nil, err
		}
		single[0], single[1], err = r.throughput(ctx, nodes, []string{"single-1"})
		stopBenchNodes(nodes)
		if err != nil {
			return nil, fmt.Errorf("bench: one node: %w", err)
		}
	}
	nodes, err := startBenchCluster(ctx, c, "node", c.cluster)
	if err != nil {
		return nil, err
	}
	defer stopBenchNodes(nodes)
	if r.has("cluster-produce") || r.has("cluster-consume") {
		p, cons, err := r.throughput(ctx, nodes, r.names)
		if err != nil {
			return nil, fmt.Errorf("bench: %d nodes: %w", c.cluster, err)
		}
		r.emit("cluster-produce", "cluster-produce-1024-async", "msg/s", p, single[0])
		r.emit("cluster-consume", "cluster-consume-1024", "msg/s", cons, single[1])
	}
	if r.has("cluster-convergence") {
		if err := r.convergence(ctx, nodes); err != nil {
			return nil, fmt.Errorf("cluster-route-convergence: %w", err)
		}
	}
	if r.has("cluster-failure") {
		if err := r.failure(ctx, nodes); err != nil {
			return nil, fmt.Errorf("cluster-failure-detection: %w", err)
		}
	}
	return r.out, nil
}

// has reports whether the plan holds a scenario of kind.
func (r *clusterRun) has(kind string) bool {
	return slices.ContainsFunc(r.plan, func(sc benchScenario) bool { return sc.kind == kind })
}

// emit adds a result of a scenario of kind, if the plan holds it, next to the one-node
// figure single when it is positive, and prints it.
func (r *clusterRun) emit(kind, name, unit string, v, single float64) {
	if !r.has(kind) {
		return
	}
	res := newResult(name, unit, v, "1-node", single)
	res.Nodes = r.c.cluster
	switch kind {
	case "cluster-produce":
		res.Size, res.Producers, res.InFlight, res.Durability = 1024, 1, r.c.inflight, durAsync
	case "cluster-consume":
		res.Size = 1024
	case "cluster-failure":
		res.TTL = int64(benchRegistryTTL)
	}
	r.out = append(r.out, res)
	fmt.Fprintln(r.text, formatResult(res))
}

// awaitRoute polls namesrv until topic's route lists exactly the brokers want, checking
// every period, and returns how long that took from since.
func awaitRoute(ctx context.Context, cl *clientcore.Client, namesrv, topic string, want []string, since time.Time, period time.Duration) (time.Duration, error) {
	var d time.Duration
	err := pollFor(ctx, benchNodeWait, period, func() (bool, error) {
		got, err := routeBrokerNames(ctx, cl, namesrv, topic)
		if err != nil {
			return false, err
		}
		d = time.Since(since)
		return slices.Equal(got, want), nil
	}, fmt.Sprintf("route of %s from %s lists %v", topic, namesrv, want))
	return d, err
}

// throughput creates a topic with the run's queues on every broker through the first node's
// control plane, then sends c.messages 1 KiB bodies to it with one async producer through the
// last node's name service, and reads them back with a lite-pull consumer through the same.
func (r *clusterRun) throughput(ctx context.Context, nodes []*benchNode, names []string) (produce, consumed float64, err error) {
	c, entry := r.c, nodes[len(nodes)-1]
	topic := fmt.Sprintf("flowd-bench-cluster-%d", time.Now().UnixNano())
	if err := nodes[0].createTopic(ctx, topic, c.queues); err != nil {
		return 0, 0, err
	}
	cl, err := newRouteClient(entry.namesrv)
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close(context.Background())
	if _, err := awaitRoute(ctx, cl, entry.namesrv, topic, names, time.Now(), 10*time.Millisecond); err != nil {
		return 0, 0, err
	}
	p, err := startBenchProducer(ctx, c, entry.namesrv, "flowd-bench-cluster", r.log)
	if err != nil {
		return 0, 0, err
	}
	defer p.Close(context.Background())
	body := make([]byte, 1024)
	if err := sendN(ctx, p, topic, body, 1, "sync", 1); err != nil { // the route, outside the clock
		return 0, 0, fmt.Errorf("bench: first send: %w", err)
	}
	start := time.Now()
	if err := sendN(ctx, p, topic, body, c.messages, "async", c.inflight); err != nil {
		return 0, 0, fmt.Errorf("bench: produce: %w", err)
	}
	produce = float64(c.messages) / time.Since(start).Seconds()
	cc := c
	cc.namesrv = entry.namesrv
	if consumed, err = consume(ctx, topic, cc, r.log, nil); err != nil {
		return 0, 0, err
	}
	return produce, consumed, nil
}

// convergence creates c.clusterTopics topics one after another through the first node's
// control plane and times, for each, how long from the create request until the last node's
// name service routes it to every broker (polled every millisecond).
func (r *clusterRun) convergence(ctx context.Context, nodes []*benchNode) error {
	last := nodes[len(nodes)-1]
	cl, err := newRouteClient(last.namesrv)
	if err != nil {
		return err
	}
	defer cl.Close(context.Background())
	var ds []time.Duration
	for k := range r.c.clusterTopics {
		topic := fmt.Sprintf("flowd-bench-route-%d-%d", k, time.Now().UnixNano())
		start := time.Now()
		if err := nodes[0].createTopic(ctx, topic, r.c.queues); err != nil {
			return err
		}
		d, err := awaitRoute(ctx, cl, last.namesrv, topic, r.names, start, time.Millisecond)
		if err != nil {
			return err
		}
		ds = append(ds, d)
	}
	slices.Sort(ds)
	name := "cluster-route-convergence"
	r.emit("cluster-convergence", name+"-p50", "ns", float64(quantileOf(ds, 0.50)), 0)
	r.emit("cluster-convergence", name+"-p99", "ns", float64(quantileOf(ds, 0.99)), 0)
	r.emit("cluster-convergence", name+"-max", "ns", float64(ds[len(ds)-1]), 0)
	return nil
}

// failure kills the last node with SIGKILL c.clusterKills times and times, each time, how
// long until the first node's name service routes a topic without it (polled every 10 ms);
// the node restarts on its data directory and is routed again before the next round.
func (r *clusterRun) failure(ctx context.Context, nodes []*benchNode) error {
	first, victim := nodes[0], nodes[len(nodes)-1]
	topic := fmt.Sprintf("flowd-bench-failure-%d", time.Now().UnixNano())
	if err := first.createTopic(ctx, topic, r.c.queues); err != nil {
		return err
	}
	cl, err := newRouteClient(first.namesrv)
	if err != nil {
		return err
	}
	defer cl.Close(context.Background())
	if _, err := awaitRoute(ctx, cl, first.namesrv, topic, r.names, time.Now(), 10*time.Millisecond); err != nil {
		return err
	}
	survivors := slices.DeleteFunc(slices.Clone(r.names), func(n string) bool { return n == victim.name })
	var sum time.Duration
	for i := range r.c.clusterKills {
		victim.kill()
		d, err := awaitRoute(ctx, cl, first.namesrv, topic, survivors, time.Now(), 10*time.Millisecond)
		if err != nil {
			return err
		}
		sum += d
		r.emit("cluster-failure", fmt.Sprintf("cluster-failure-detection-%d", i+1), "ns", float64(d), 0)
		if err := victim.start(); err != nil {
			return err
		}
		if err := victim.awaitServing(ctx); err != nil {
			return err
		}
		if _, err := awaitRoute(ctx, cl, first.namesrv, topic, r.names, time.Now(), 10*time.Millisecond); err != nil {
			return err
		}
	}
	r.emit("cluster-failure", "cluster-failure-detection-mean", "ns", float64(sum)/float64(r.c.clusterKills), 0)
	return nil
}

// quantileOf is the q-quantile of sorted durations (nearest rank).
func quantileOf(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// runCluster is "flowd bench --cluster N": the cluster scenarios, printed as text or as the
// --json document.
func (f *benchFlags) runCluster(ctx context.Context, c benchConfig, plan []benchScenario, stdout io.Writer) error {
	// An interrupt ends the run through ctx, so that the deferred kills reap every child
	// rather than leave them serving.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := c.defaultFlowdBin(); err != nil {
		return err
	}
	text := stdout
	if c.json {
		text = io.Discard
	}
	fmt.Fprintf(text, "flowd bench --cluster %d: `flowd serve` child processes on loopback next to one node; %d messages of 1024 B, %d in flight, %d queues per broker; %d topics; %d kill -9 rounds (registry TTL %v, heartbeat every %v)\n",
		c.cluster, c.messages, c.inflight, c.queues, c.clusterTopics, c.clusterKills, benchRegistryTTL, benchRegistryTTL/3)
	results, err := runCluster(ctx, c, plan, text)
	if err != nil {
		return err
	}
	if !c.json {
		return nil
	}
	return writeReport(stdout, benchReport{Messages: c.messages, Size: 1024, Sizes: []int{1024}, InFlight: c.inflight,
		Queues: c.queues, Producers: 1, Rate: c.rate, Cluster: c.cluster, Results: results})
}
