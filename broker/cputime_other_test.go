//go:build !unix

package broker_test

import "time"

// processCPU is unknown here: benchmarks report 0 CPU per message.
func processCPU() time.Duration { return 0 }
