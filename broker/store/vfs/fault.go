package vfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"sync"
	"syscall"
)

// ErrInjected is wrapped by every error FaultFS injects, except ENOSPC, which is
// syscall.ENOSPC itself so that callers' errors.Is checks see what a full disk returns.
var ErrInjected = errors.New("injected fault")

// ErrCrashed is returned by every operation of a FaultFS after Crash.
var ErrCrashed = errors.New("file system crashed (simulated power cut)")

// FaultFS wraps an FS and injects faults into writes and syncs of the files Match selects,
// and into reads (FailReads), for tests. Its zero configuration injects nothing. All methods
// are safe for concurrent use, and every fault can be switched on and off while files are
// in use.
//
// With TrackUnsynced set before files are opened, it also remembers the old contents under
// every write and truncation that no Sync has covered yet, so that Crash can put them back:
// the files then look as they would after a power cut that lost everything unsynced.
// Directory operations (create, remove, rename) are treated as immediately durable.
type FaultFS struct {
	FS

	mu          sync.Mutex
	match       func(name string) bool
	noSpaceLeft int64 // bytes writable before ENOSPC; < 0 means unlimited
	shortWrites int   // the next n writes are short
	syncErr     error
	syncHold    <-chan struct{} // Syncs of matching files wait until it is closed
	track       bool
	undo        map[string][]undoRecord
	crashed     bool
	writes      int64
	usage       *Usage
	readFault   *ReadFault
	readFaults  int64 // reads failed by readFault
}

// ReadFault describes the reads FailReads makes fail.
type ReadFault struct {
	// Match selects the files by name (nil: every file). It is independent of
	// FaultFS.Match, so that reads of one kind of file can fail while its writes work.
	Match func(name string) bool
	// Off and Len are the byte range [Off, Off+Len) of the file that a failing read
	// overlaps; Len <= 0 means from Off to the end of the file.
	Off, Len int64
	// Short makes a failing read a short one: it returns the bytes before the range and an
	// error wrapping io.EOF, as a read of a file cut short under the reader does. Otherwise
	// it returns the bytes before the range and Err (syscall.EIO when nil), as pread does
	// when it reaches a bad sector.
	Short bool
	Err   error
}

// overlaps reports whether a read of n bytes at off reaches into the range, and how many
// bytes before it the read may return.
func (r *ReadFault) overlaps(off int64, n int) (int, bool) {
	end := off + int64(n)
	if n == 0 || end <= r.Off || (r.Len > 0 && off >= r.Off+r.Len) {
		return n, false
	}
	return int(max(0, r.Off-off)), true
}

type undoRecord struct {
	off     int64
	old     []byte // bytes present before the write (may be shorter than it)
	oldSize int64  // file size before the operation
}

// NewFaultFS wraps base (Default() if nil).
func NewFaultFS(base FS) *FaultFS {
	if base == nil {
		base = Default()
	}
	return &FaultFS{FS: base, noSpaceLeft: -1, undo: make(map[string][]undoRecord)}
}

// Match restricts injected write and sync faults to files whose name match accepts
// (nil: every file).
func (f *FaultFS) Match(match func(name string) bool) {
	f.mu.Lock()
	f.match = match
	f.mu.Unlock()
}

// NoSpaceAfter makes writes fail with ENOSPC once n more bytes have been written; the write
// that crosses the limit is partial, as a real one is.
func (f *FaultFS) NoSpaceAfter(n int64) {
	f.mu.Lock()
	f.noSpaceLeft = n
	f.mu.Unlock()
}

// ShortWrites makes the next n writes store only half their bytes and fail with
// io.ErrShortWrite (wrapped with ErrInjected).
func (f *FaultFS) ShortWrites(n int) {
	f.mu.Lock()
	f.shortWrites = n
	f.mu.Unlock()
}

// FailSyncs makes every later Sync fail with err (wrapped with ErrInjected); nil stops it.
func (f *FaultFS) FailSyncs(err error) {
	f.mu.Lock()
	f.syncErr = err
	f.mu.Unlock()
}

// HoldSyncs makes every later Sync of a matching file wait until release is closed before
// it syncs, as a slow disk would; nil stops holding later Syncs. Syncs already waiting go on
// waiting for their release, so close it to let them finish.
func (f *FaultFS) HoldSyncs(release <-chan struct{}) {
	f.mu.Lock()
	f.syncHold = release
	f.mu.Unlock()
}

// FailReads makes every later ReadAt of a file rf.Match accepts fail when it overlaps rf's
// range (see ReadFault); nil stops failing reads. Each failure counts in ReadFaults.
func (f *FaultFS) FailReads(rf *ReadFault) {
	var c *ReadFault
	if rf != nil {
		cp := *rf
		c = &cp
	}
	f.mu.Lock()
	f.readFault = c
	f.mu.Unlock()
}

// ReadFaults is how many reads FailReads has made fail.
func (f *FaultFS) ReadFaults() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.readFaults
}

// TrackUnsynced enables the bookkeeping Crash needs. Set it before opening files.
func (f *FaultFS) TrackUnsynced() {
	f.mu.Lock()
	f.track = true
	f.mu.Unlock()
}

// SetDiskUsage makes DiskUsage report u instead of the real volume's usage.
func (f *FaultFS) SetDiskUsage(u Usage) {
	f.mu.Lock()
	f.usage = &u
	f.mu.Unlock()
}

func (f *FaultFS) DiskUsage(path string) (Usage, error) {
	f.mu.Lock()
	u := f.usage
	f.mu.Unlock()
	if u != nil {
		return *u, nil
	}
	return f.FS.DiskUsage(path)
}

// BytesWritten is the number of bytes written through the FaultFS.
func (f *FaultFS) BytesWritten() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.writes
}

// Crash simulates a power cut: every write and truncation not covered by a Sync of its file
// is undone, and every later operation fails with ErrCrashed. Files must not be used by the
// code under test afterwards; reopen the directory through a new FS.
func (f *FaultFS) Crash() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.crashed = true
	var errs []error
	for name, recs := range f.undo {
		h, err := f.FS.OpenFile(name, os.O_RDWR, 0)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		for i := len(recs) - 1; i >= 0; i-- {
			r := recs[i]
			if len(r.old) > 0 {
				if _, err := h.WriteAt(r.old, r.off); err != nil {
					errs = append(errs, err)
				}
			}
			if err := h.Truncate(r.oldSize); err != nil {
				errs = append(errs, err)
			}
		}
		errs = append(errs, h.Sync(), h.Close())
	}
	f.undo = make(map[string][]undoRecord)
	return errors.Join(errs...)
}

func (f *FaultFS) applies(name string) bool { return f.match == nil || f.match(name) }

func (f *FaultFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	h, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: h, fs: f, name: name}, nil
}

func (f *FaultFS) Create(name string) (File, error) {
	return f.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
}

func (f *FaultFS) Remove(name string) error {
	if err := f.check(); err != nil {
		return err
	}
	f.mu.Lock()
	delete(f.undo, name)
	f.mu.Unlock()
	return f.FS.Remove(name)
}

func (f *FaultFS) RemoveAll(name string) error {
	if err := f.check(); err != nil {
		return err
	}
	return f.FS.RemoveAll(name)
}

func (f *FaultFS) Rename(oldname, newname string) error {
	if err := f.check(); err != nil {
		return err
	}
	return f.FS.Rename(oldname, newname)
}

func (f *FaultFS) SyncDir(dir string) error {
	if err := f.check(); err != nil {
		return err
	}
	return f.FS.SyncDir(dir)
}

func (f *FaultFS) check() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.crashed {
		return ErrCrashed
	}
	return nil
}

type faultFile struct {
	File
	fs   *FaultFS
	name string
}

// allow decides how many of n bytes a write may store and the error to return.
func (h *faultFile) allow(n int) (int, error) {
	f := h.fs
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.crashed {
		return 0, ErrCrashed
	}
	if !f.applies(h.name) {
		return n, nil
	}
	if f.shortWrites > 0 {
		f.shortWrites--
		return n / 2, fmt.Errorf("write %s: %w: %w", h.name, ErrInjected, io.ErrShortWrite)
	}
	if f.noSpaceLeft >= 0 && int64(n) > f.noSpaceLeft {
		k := int(f.noSpaceLeft)
		f.noSpaceLeft = 0
		return k, &fs.PathError{Op: "write", Path: h.name, Err: syscall.ENOSPC}
	}
	if f.noSpaceLeft >= 0 {
		f.noSpaceLeft -= int64(n)
	}
	return n, nil
}

func (h *faultFile) record(off int64, n int) {
	f := h.fs
	f.mu.Lock()
	track := f.track
	f.mu.Unlock()
	if !track {
		return
	}
	fi, err := h.File.Stat()
	if err != nil {
		return
	}
	size := fi.Size()
	var old []byte
	if off < size {
		old = make([]byte, min(int64(n), size-off))
		k, _ := h.File.ReadAt(old, off)
		old = old[:k]
	}
	f.mu.Lock()
	f.undo[h.name] = append(f.undo[h.name], undoRecord{off: off, old: old, oldSize: size})
	f.mu.Unlock()
}

func (h *faultFile) WriteAt(p []byte, off int64) (int, error) {
	n, ferr := h.allow(len(p))
	if n == 0 && ferr != nil {
		return 0, ferr
	}
	h.record(off, n)
	w, err := h.File.WriteAt(p[:n], off)
	h.fs.mu.Lock()
	h.fs.writes += int64(w)
	h.fs.mu.Unlock()
	if err != nil {
		return w, err
	}
	return w, ferr
}

// Write is passed through with the faults of WriteAt, but Crash cannot undo it (the File
// interface has no Seek to learn its offset); the store only uses WriteAt.
func (h *faultFile) Write(p []byte) (int, error) {
	n, ferr := h.allow(len(p))
	if n == 0 && ferr != nil {
		return 0, ferr
	}
	w, err := h.File.Write(p[:n])
	if err != nil {
		return w, err
	}
	return w, ferr
}

func (h *faultFile) Truncate(size int64) error {
	if err := h.fs.check(); err != nil {
		return err
	}
	f := h.fs
	f.mu.Lock()
	track := f.track
	f.mu.Unlock()
	if track {
		if fi, err := h.File.Stat(); err == nil {
			old := fi.Size()
			var tail []byte
			if size < old {
				tail = make([]byte, old-size)
				k, _ := h.File.ReadAt(tail, size)
				tail = tail[:k]
			}
			f.mu.Lock()
			f.undo[h.name] = append(f.undo[h.name], undoRecord{off: size, old: tail, oldSize: old})
			f.mu.Unlock()
		}
	}
	return h.File.Truncate(size)
}

func (h *faultFile) Sync() error {
	f := h.fs
	f.mu.Lock()
	if f.crashed {
		f.mu.Unlock()
		return ErrCrashed
	}
	if f.syncErr != nil && f.applies(h.name) {
		err := f.syncErr
		f.mu.Unlock()
		return fmt.Errorf("sync %s: %w: %w", h.name, ErrInjected, err)
	}
	var hold <-chan struct{}
	if f.applies(h.name) {
		hold = f.syncHold
	}
	f.mu.Unlock()
	if hold != nil {
		<-hold
	}
	if err := h.File.Sync(); err != nil {
		return err
	}
	f.mu.Lock()
	delete(f.undo, h.name)
	f.mu.Unlock()
	return nil
}

func (h *faultFile) ReadAt(p []byte, off int64) (int, error) {
	f := h.fs
	f.mu.Lock()
	if f.crashed {
		f.mu.Unlock()
		return 0, ErrCrashed
	}
	rf := f.readFault
	keep, fail := len(p), false
	if rf != nil && (rf.Match == nil || rf.Match(h.name)) {
		keep, fail = rf.overlaps(off, len(p))
	}
	if fail {
		f.readFaults++
	}
	f.mu.Unlock()
	if !fail {
		return h.File.ReadAt(p, off)
	}
	n, err := h.File.ReadAt(p[:keep], off)
	if err != nil {
		return n, err
	}
	cause := rf.Err
	switch {
	case rf.Short:
		cause = io.EOF
	case cause == nil:
		cause = syscall.EIO
	}
	return n, fmt.Errorf("read %s at %d: %w: %w", h.name, off+int64(n), ErrInjected, cause)
}
