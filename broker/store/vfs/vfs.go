// Package vfs is the small file-system interface the store writes through, with the
// operating system's implementation (Default()) and a fault-injecting wrapper (NewFaultFS) for
// tests.
//
// It is modelled on pebble's vfs package but keeps only what a commit log needs: positional
// reads and writes, fsync, truncation, directory listing and sync, an advisory lock, and the
// volume's usage (for the disk-usage retention rule).
//
// # Notes
//
//   - File.Sync is a data sync: on Linux it is fdatasync(2), which is what a preallocated,
//     fixed-size segment needs and is cheaper than fsync(2).
//   - Implementations must make ReadAt and WriteAt safe for concurrent use on one File, as
//     *os.File is; a read racing with Close returns an error, never another file's bytes.
package vfs

import (
	"errors"
	"io"
	"io/fs"
	"os"
)

// File is an open file.
type File interface {
	io.ReaderAt
	io.WriterAt
	io.Writer
	io.Closer
	// Sync makes the file's written data durable (fdatasync on Linux).
	Sync() error
	// Truncate changes the file's size; growing it leaves a hole that reads as zeros.
	Truncate(size int64) error
	Stat() (fs.FileInfo, error)
}

// Usage is a volume's size and what is free on it, in bytes.
type Usage struct {
	Total, Free uint64
}

// FS is a file system.
type FS interface {
	// OpenFile opens name with os.OpenFile's flag and permission semantics.
	OpenFile(name string, flag int, perm fs.FileMode) (File, error)
	// Create creates or truncates name for reading and writing.
	Create(name string) (File, error)
	Remove(name string) error
	// RemoveAll removes name and everything under it.
	RemoveAll(name string) error
	Rename(oldname, newname string) error
	MkdirAll(dir string, perm fs.FileMode) error
	// ReadDir lists dir sorted by file name.
	ReadDir(dir string) ([]fs.DirEntry, error)
	Stat(name string) (fs.FileInfo, error)
	// SyncDir makes dir's entries (files created, renamed or removed in it) durable.
	SyncDir(dir string) error
	// Lock takes an exclusive advisory lock on name, creating it if needed. It fails with
	// ErrLocked, without waiting, when another process (or another Lock call) holds it.
	// Closing the returned io.Closer releases the lock.
	Lock(name string) (io.Closer, error)
	// DiskUsage reports the usage of the volume holding path.
	DiskUsage(path string) (Usage, error)
}

// ErrLocked is returned by FS.Lock when the lock is held elsewhere.
var ErrLocked = errors.New("lock held by another process")

// Default returns the operating system's file system.
func Default() FS { return osFS{} }

type osFS struct{}

type osFile struct{ *os.File }

func (f osFile) Sync() error { return datasync(f.File) }

func (osFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (fsys osFS) Create(name string) (File, error) {
	return fsys.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
}

func (osFS) Remove(name string) error                    { return os.Remove(name) }
func (osFS) RemoveAll(name string) error                 { return os.RemoveAll(name) }
func (osFS) Rename(oldname, newname string) error        { return os.Rename(oldname, newname) }
func (osFS) MkdirAll(dir string, perm fs.FileMode) error { return os.MkdirAll(dir, perm) }
func (osFS) ReadDir(dir string) ([]fs.DirEntry, error)   { return os.ReadDir(dir) }
func (osFS) Stat(name string) (fs.FileInfo, error)       { return os.Stat(name) }

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

func (osFS) Lock(name string) (io.Closer, error) { return lockFile(name) }

func (osFS) DiskUsage(path string) (Usage, error) { return diskUsage(path) }
