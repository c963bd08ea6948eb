//go:build unix

package store

import (
	"syscall"
	"testing"
	"time"
)

// processCPU is the CPU time (user and system) the process has used: a benchmark's
// ns/op misses what its background goroutines (the dispatcher, the prefaulter, the
// flusher) spend per message, and on a shared machine CPU time is steadier than wall time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process CPU time per operation since start as "cpu-ns/op".
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
}
