package main

import (
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStartProfileWritesMutexProfile: --cpuprofile's stop writes the scenario's CPU profile
// and its mutex contention profile, both gzip-compressed pprof files, and turns the mutex
// sampling off again.
func TestStartProfileWritesMutexProfile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "prof")
	stop, err := startProfile(file, "sc")
	require.NoError(t, err)
	var mu sync.Mutex
	var wg sync.WaitGroup
	n := 0
	for range 4 {
		wg.Go(func() {
			for range 2000 {
				mu.Lock()
				n++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Equal(t, 8000, n)
	stop()
	for _, name := range []string{file + ".sc", file + ".sc.mutex"} {
		b, err := os.ReadFile(name)
		require.NoError(t, err)
		require.Greater(t, len(b), 2, name)
		require.Equal(t, []byte{0x1f, 0x8b}, b[:2], "%s is gzip-compressed (pprof)", name)
	}
	require.Zero(t, runtime.SetMutexProfileFraction(-1), "mutex sampling is off after stop")
}
