package vfs

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLock(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lock")
	l, err := Default().Lock(p)
	require.NoError(t, err)
	_, err = Default().Lock(p)
	assert.ErrorIs(t, err, ErrLocked)
	require.NoError(t, l.Close())
	l, err = Default().Lock(p)
	require.NoError(t, err)
	l.Close()
}

func TestDiskUsage(t *testing.T) {
	u, err := Default().DiskUsage(t.TempDir())
	require.NoError(t, err)
	assert.Greater(t, u.Total, uint64(0))
	assert.LessOrEqual(t, u.Free, u.Total)
}

func TestFaultCrashDropsUnsynced(t *testing.T) {
	dir := t.TempDir()
	fs := NewFaultFS(nil)
	fs.TrackUnsynced()
	p := filepath.Join(dir, "f")
	f, err := fs.Create(p)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("durable."), 0)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	_, err = f.WriteAt([]byte("LOST"), 2)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("-tail-lost"), 8)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(4096))
	require.NoError(t, fs.Crash())
	_, err = f.WriteAt([]byte("x"), 0)
	assert.ErrorIs(t, err, ErrCrashed)
	_, err = fs.OpenFile(p, os.O_RDONLY, 0)
	assert.ErrorIs(t, err, ErrCrashed)
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	assert.Equal(t, "durable.", string(b))
}

func TestFaultWrites(t *testing.T) {
	dir := t.TempDir()
	fs := NewFaultFS(nil)
	fs.Match(func(name string) bool { return filepath.Base(name) == "a" })
	a, err := fs.Create(filepath.Join(dir, "a"))
	require.NoError(t, err)
	b, err := fs.Create(filepath.Join(dir, "b"))
	require.NoError(t, err)

	fs.ShortWrites(1)
	n, err := a.WriteAt(make([]byte, 10), 0)
	assert.Equal(t, 5, n)
	assert.ErrorIs(t, err, io.ErrShortWrite)
	assert.ErrorIs(t, err, ErrInjected)
	n, err = a.WriteAt(make([]byte, 10), 0)
	assert.Equal(t, 10, n)
	assert.NoError(t, err)

	fs.NoSpaceAfter(15)
	_, err = b.WriteAt(make([]byte, 100), 0)
	assert.NoError(t, err, "b is not matched")
	n, err = a.WriteAt(make([]byte, 10), 0)
	assert.Equal(t, 10, n)
	assert.NoError(t, err)
	n, err = a.Write(make([]byte, 10))
	assert.Equal(t, 5, n)
	assert.True(t, errors.Is(err, syscall.ENOSPC))
	_, err = a.WriteAt(make([]byte, 1), 0)
	assert.ErrorIs(t, err, syscall.ENOSPC)

	fs.FailSyncs(syscall.EIO)
	assert.ErrorIs(t, a.Sync(), syscall.EIO)
	assert.NoError(t, b.Sync())
	fs.FailSyncs(nil)
	assert.NoError(t, a.Sync())
	assert.Greater(t, fs.BytesWritten(), int64(0))
}

// A Sync racing with Close (the checkpoint fsyncing a consume-queue file that retention or
// DeleteTopic just closed) must report os.ErrClosed, not EBADF from fdatasync(-1), or worse
// sync whatever file reused the descriptor number.
func TestSyncAfterClose(t *testing.T) {
	f, err := Default().Create(filepath.Join(t.TempDir(), "f"))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	assert.ErrorIs(t, f.Sync(), os.ErrClosed)
}

// FailReads fails the reads that reach into its range of the files it matches, returning
// the bytes before the range, with EIO (or another error) or as a short read, until it is
// switched off.
func TestFaultReads(t *testing.T) {
	dir := t.TempDir()
	fs := NewFaultFS(nil)
	a, err := fs.Create(filepath.Join(dir, "a"))
	require.NoError(t, err)
	b, err := fs.Create(filepath.Join(dir, "b"))
	require.NoError(t, err)
	data := []byte("0123456789abcdefghij")
	for _, f := range []File{a, b} {
		_, err := f.WriteAt(data, 0)
		require.NoError(t, err)
	}
	fs.FailReads(&ReadFault{Match: func(name string) bool { return filepath.Base(name) == "a" }, Off: 10, Len: 5})

	p := make([]byte, 8)
	n, err := a.ReadAt(p, 0)
	require.NoError(t, err, "below the range")
	assert.Equal(t, "01234567", string(p[:n]))
	n, err = a.ReadAt(p[:5], 15)
	require.NoError(t, err, "above the range")
	assert.Equal(t, "fghij", string(p[:n]))
	n, err = a.ReadAt(p, 6)
	assert.ErrorIs(t, err, syscall.EIO)
	assert.ErrorIs(t, err, ErrInjected)
	assert.Equal(t, "6789", string(p[:n]), "the bytes before the range")
	n, err = a.ReadAt(p, 12)
	assert.ErrorIs(t, err, syscall.EIO)
	assert.Zero(t, n)
	n, err = b.ReadAt(p, 6)
	require.NoError(t, err, "b is not matched")
	assert.Equal(t, 8, n)
	assert.EqualValues(t, 2, fs.ReadFaults())

	fs.FailReads(&ReadFault{Off: 4, Short: true})
	n, err = b.ReadAt(p, 0)
	assert.ErrorIs(t, err, io.EOF)
	assert.ErrorIs(t, err, ErrInjected)
	assert.Equal(t, 4, n)
	fs.FailReads(&ReadFault{Off: 0, Err: syscall.EBADMSG})
	_, err = a.ReadAt(p, 18)
	assert.ErrorIs(t, err, syscall.EBADMSG)
	assert.EqualValues(t, 4, fs.ReadFaults())

	fs.FailReads(nil)
	n, err = a.ReadAt(p, 6)
	require.NoError(t, err)
	assert.Equal(t, "6789abcd", string(p[:n]))
	assert.EqualValues(t, 4, fs.ReadFaults())
}
