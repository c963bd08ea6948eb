//go:build unix

package consumer_test

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user and system) this process has used so far: benchmarks
// report CPU per message, which a machine shared with other work disturbs much less than
// throughput.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
