package main

import (
	"fmt"
	"os"
	"time"
)

// diskWrite writes c.messages records of size bytes to a new file in the data directory,
// one write system call each and no fsync, and returns records per second: the raw
// sequential-write rate that the produce scenarios store the same bodies against.
func diskWrite(c benchConfig, size int) (float64, error) {
	buf := make([]byte, size)
	return timeWrites(c, "baseline-", "disk baseline", func(f *os.File) (int, error) {
		for range c.messages {
			if _, err := f.Write(buf); err != nil {
				return 0, err
			}
		}
		return c.messages, nil
	})
}

// Bounds of the fsync-per-write baseline: enough writes for a stable rate, few enough to
// stay within seconds on a slow disk.
const (
	fsyncMaxWrites = 2000
	fsyncMaxTime   = 2 * time.Second
)

// diskFsync appends 1 KiB records to a new file in the data directory, each followed by an
// fsync (what the store's flusher calls), and returns records per second: what a store
// without group commit could acknowledge durably, one writer at a time.
func diskFsync(c benchConfig) (float64, error) {
	buf := make([]byte, 1024)
	return timeWrites(c, "baseline-fsync-", "fsync baseline", func(f *os.File) (int, error) {
		start := time.Now()
		n := 0
		for n < fsyncMaxWrites && (n < 10 || time.Since(start) < fsyncMaxTime) {
			if _, err := f.Write(buf); err != nil {
				return 0, err
			}
			if err := f.Sync(); err != nil {
				return 0, err
			}
			n++
		}
		return n, nil
	})
}

// timeWrites runs write on a new file of the data directory, removed afterwards, and returns
// the records it wrote per second; what names the baseline in errors.
func timeWrites(c benchConfig, pattern, what string, write func(*os.File) (int, error)) (float64, error) {
	f, err := os.CreateTemp(c.dataDir, pattern)
	if err != nil {
		return 0, fmt.Errorf("bench: %s: %w", what, err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	start := time.Now()
	n, err := write(f)
	if err != nil {
		return 0, fmt.Errorf("bench: %s: %w", what, err)
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
