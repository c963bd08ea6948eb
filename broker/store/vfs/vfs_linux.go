//go:build linux

package vfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// datasync fdatasyncs f through its RawConn, which holds a reference on the descriptor: a
// Sync racing with Close fails with os.ErrClosed instead of fdatasync(-1) (EBADF), and can
// never sync a file that reused the descriptor number.
func datasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = syscall.Fdatasync(int(fd))
			if serr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		// Control fails only when f is closed (poll's "use of closed file").
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: os.ErrClosed}
	}
	if serr != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: serr}
	}
	return nil
}

type flock struct{ f *os.File }

func (l flock) Close() error {
	// Closing the descriptor drops the flock.
	return l.f.Close()
}

func lockFile(name string) (io.Closer, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	// flock locks belong to the open file description, so a second Lock in this process
	// conflicts too, which is what a store wants.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock %s: %w", name, ErrLocked)
		}
		return nil, &os.PathError{Op: "flock", Path: name, Err: err}
	}
	return flock{f}, nil
}

func diskUsage(path string) (Usage, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return Usage{}, &os.PathError{Op: "statfs", Path: path, Err: err}
	}
	bs := uint64(st.Bsize)
	return Usage{Total: st.Blocks * bs, Free: st.Bavail * bs}, nil
}
