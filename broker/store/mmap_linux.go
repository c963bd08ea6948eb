//go:build linux

package store

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/flowd-io/flowd/broker/store/vfs"
)

// mapSegment reserves the whole segment on disk and maps it shared and writable. It
// returns nil (and no error) when the file cannot be mapped (it does not expose a
// descriptor, as the fault-injecting FS's files do not, or the file system lacks
// fallocate): the caller then uses pwrite.
//
// # Notes
//
// The fallocate is what makes the mapping safe to write: a store into a hole of a sparse
// file allocates a block at fault time, and a full disk then raises SIGBUS instead of
// returning ENOSPC. With the blocks reserved up front, a full disk shows up as an error
// from this function, at the roll, where the store can fail cleanly.
func mapSegment(f vfs.File, size int64) ([]byte, error) {
	fd, ok := f.(interface{ Fd() uintptr })
	if !ok {
		return nil, nil
	}
	if err := syscall.Fallocate(int(fd.Fd()), 0, 0, size); err != nil {
		if errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS) {
			return nil, nil
		}
		return nil, fmt.Errorf("fallocate: %w", err)
	}
	m, err := syscall.Mmap(int(fd.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap: %w", err)
	}
	return m, nil
}

func unmapSegment(m []byte) error { return syscall.Munmap(m) }

// mapSparse maps f shared and writable, first extending it to size (sparse: nothing is
// allocated) if it is shorter. It returns nil (and no error) when the file does not expose a
// descriptor (the fault-injecting FS): the caller then uses pwrite. A consume-queue file is
// mapped this way; see writeUnits for why it is not fallocated like a segment.
func mapSparse(f vfs.File, size int64) ([]byte, error) {
	fd, ok := f.(interface{ Fd() uintptr })
	if !ok {
		return nil, nil
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat: %w", err)
	}
	if fi.Size() < size {
		if err := f.Truncate(size); err != nil {
			return nil, fmt.Errorf("extend to %d bytes: %w", size, err)
		}
	}
	m, err := syscall.Mmap(int(fd.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap: %w", err)
	}
	return m, nil
}

// madvPopulateWrite is Linux's MADV_POPULATE_WRITE (5.14+; not in package syscall).
const madvPopulateWrite = 23

// prefault faults m's pages in writable ahead of the writer, so that the appender's copy
// pays neither for page allocation and zeroing nor for a write-protect fault. The caller
// ignores errors: prefaulting is an optimization (older kernels reject the advice with
// EINVAL). See prefaultLoop for why writable.
func prefault(m []byte) error { return syscall.Madvise(m, madvPopulateWrite) }
