//go:build !linux

package vfs

import (
	"io"
	"os"
)

func datasync(f *os.File) error { return f.Sync() }

// lockFile on other systems only creates the file: flowd's store is deployed on Linux, and
// the lock is a guard against operator mistakes, not a correctness mechanism.
func lockFile(name string) (io.Closer, error) {
	return os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
}

func diskUsage(string) (Usage, error) { return Usage{}, nil }
