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
	f, err := os.CreateTemp(c.dataDir, "baseline-")
	if err != nil {
		return 0, fmt.Errorf("bench: disk baseline: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, size)
	start := time.Now()
	for range c.messages {
		if _, err := f.Write(buf); err != nil {
			return 0, fmt.Errorf("bench: disk baseline: %w", err)
		}
	}
	return float64(c.messages) / time.Since(start).Seconds(), nil
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
	f, err := os.CreateTemp(c.dataDir, "baseline-fsync-")
	if err != nil {
		return 0, fmt.Errorf("bench: fsync baseline: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 1024)
	start := time.Now()
	n := 0
	for n < fsyncMaxWrites && (n < 10 || time.Since(start) < fsyncMaxTime) {
		if _, err := f.Write(buf); err != nil {
			return 0, fmt.Errorf("bench: fsync baseline: %w", err)
		}
		if err := f.Sync(); err != nil {
			return 0, fmt.Errorf("bench: fsync baseline: %w", err)
		}
		n++
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
