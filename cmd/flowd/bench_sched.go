package main

import (
	"math"
	"runtime/metrics"
	"time"
)

// runtimeSample is what the delay scenario reads of the Go runtime before and after its
// sends: how long goroutines waited to run, and how many GC cycles ran. The broker and both
// clients are goroutines of this one process, so every hand-off of a message between them is
// such a wait; its tail says how much of the delay's tail was the scheduler (or the machine
// stalling the process), not flowd's work.
type runtimeSample struct {
	sched *metrics.Float64Histogram
	gcs   uint64
}

const (
	schedLatencies = "/sched/latencies:seconds"
	gcCycles       = "/gc/cycles/total:gc-cycles"
)

func readRuntime() runtimeSample {
	s := []metrics.Sample{{Name: schedLatencies}, {Name: gcCycles}}
	metrics.Read(s)
	var r runtimeSample
	if s[0].Value.Kind() == metrics.KindFloat64Histogram {
		r.sched = s[0].Value.Float64Histogram()
	}
	if s[1].Value.Kind() == metrics.KindUint64 {
		r.gcs = s[1].Value.Uint64()
	}
	return r
}

// runtimeDelta is what happened in the runtime between two samples: the p99 and the
// largest of the scheduling latencies (each the upper bound of its histogram bucket), and
// the GC cycles.
type runtimeDelta struct {
	schedP99, schedMax time.Duration
	gcs                uint64
}

func (a runtimeSample) until(b runtimeSample) runtimeDelta {
	d := runtimeDelta{gcs: b.gcs - a.gcs}
	if a.sched == nil || b.sched == nil || len(a.sched.Counts) != len(b.sched.Counts) {
		return d
	}
	counts := make([]uint64, len(b.sched.Counts))
	var total uint64
	for i := range counts {
		counts[i] = b.sched.Counts[i] - a.sched.Counts[i]
		total += counts[i]
	}
	if total == 0 {
		return d
	}
	upper := func(i int) time.Duration {
		u := b.sched.Buckets[i+1]
		if math.IsInf(u, 1) {
			u = b.sched.Buckets[i]
		}
		return time.Duration(u * float64(time.Second))
	}
	rank := uint64(math.Ceil(0.99 * float64(total)))
	var seen uint64
	for i, c := range counts {
		if c == 0 {
			continue
		}
		if seen < rank && seen+c >= rank {
			d.schedP99 = upper(i)
		}
		seen += c
		d.schedMax = upper(i)
	}
	return d
}
