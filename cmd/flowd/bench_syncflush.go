package main

import (
	"context"
	"fmt"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/control"
)

// syncTarget is the broker of the sync-flush scenario, its store in SYNC_FLUSH: embedded in
// an in-process run, a `flowd serve --flush sync` child in a separate one.
type syncTarget struct {
	namesrv string
	pid     int                                      // the child's; 0: this process
	fsyncs  func(ctx context.Context) (int64, error) // the store's fsyncs so far
	stop    func()
}

// startSyncTarget starts the sync-flush scenario's broker.
func startSyncTarget(ctx context.Context, r *benchRun) (*syncTarget, error) {
	if r.c.deploy == deploySeparate {
		nodes, err := startBenchCluster(ctx, r.c, "broker-syncflush", 1, "--flush", "sync")
		if err != nil {
			return nil, err
		}
		nd := nodes[0]
		return &syncTarget{namesrv: nd.namesrv, pid: nd.cmd.Process.Pid, stop: nd.kill,
			fsyncs: func(ctx context.Context) (int64, error) {
				var st control.StatusReply
				if _, err := nd.control().request(ctx, "broker.status", nil, &st); err != nil {
					return 0, fmt.Errorf("bench: fsyncs of %s: %w", nd.name, err)
				}
				return st.Store.Fsyncs, nil
			}}, nil
	}
	b, err := startBenchBroker(r.c, "broker-syncflush", store.FlushSync, r.log)
	if err != nil {
		return nil, err
	}
	return &syncTarget{namesrv: b.NamesrvAddr(), stop: func() { _ = b.Shutdown(context.Background()) },
		fsyncs: func(context.Context) (int64, error) { return b.StoreStats().Fsyncs, nil }}, nil
}

// syncFlush produces with many synchronous producers to a broker whose store acknowledges a
// message only once an fsync covers it. One fsync covers every append that arrived while the
// previous one ran (group commit), so the figure should be a multiple of the disk's
// fsync-per-write rate, measured just before and just after it (a shared disk's rate drifts
// within a run).
func (r *benchRun) syncFlush(ctx context.Context, sc benchScenario) ([]benchResult, error) {
	var err error
	if r.syncBroker == nil {
		if r.syncBroker, err = startSyncTarget(ctx, r); err != nil {
			return nil, err
		}
	}
	before, err := diskFsync(r.c)
	if err != nil {
		return nil, err
	}
	fsyncs, err := r.syncBroker.fsyncs(ctx)
	if err != nil {
		return nil, err
	}
	w := newWindow(r.syncBroker.pid)
	_, rate, err := flowdProduce(ctx, r.c, r.syncBroker.namesrv, "sync", sc.size, sc.producers, r.log, w)
	if err != nil {
		return nil, err
	}
	if err := windowErr(w); err != nil {
		return nil, err
	}
	now, err := r.syncBroker.fsyncs(ctx)
	if err != nil {
		return nil, err
	}
	fsyncs = now - fsyncs
	after, err := diskFsync(r.c)
	if err != nil {
		return nil, err
	}
	res := newResult(sc.name, "msg/s", rate, "disk-fsync", 2/(1/before+1/after))
	res.BaselineBefore, res.BaselineAfter = before, after
	if fsyncs > 0 { // the first sends of each producer, outside the clock, are counted too
		res.MessagesPerFsync = float64(r.c.messages+sc.producers) / float64(fsyncs)
	}
	res.Size, res.Producers, res.InFlight = sc.size, sc.producers, 1
	res.Durability, res.BaselineDurability = durSyncFlush, durFsync
	res.addCosts(w, nil, r.c.messages)
	return []benchResult{res}, nil
}
