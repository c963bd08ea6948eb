//go:build linux

package store

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGuardedCopySIGBUS: touching a mapped page past the end of its file raises SIGBUS; the
// guard turns it into an error.
func TestGuardedCopySIGBUS(t *testing.T) {
	p := filepath.Join(t.TempDir(), "seg")
	f, err := vfs.Default().Create(p)
	require.NoError(t, err)
	defer f.Close()
	m, err := mapSegment(f, 1<<16)
	require.NoError(t, err)
	require.NotNil(t, m)
	defer unmapSegment(m)
	require.NoError(t, guardedCopy(m[100:], []byte("hello")))
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(b[100:105]), "a store to the mapping is in the file at once")
	require.NoError(t, os.Truncate(p, 0))
	dst := make([]byte, 10)
	err = guardedCopy(dst, m[8192:])
	assert.ErrorContains(t, err, "fault")
	assert.Error(t, guardedCopy(m[8192:], dst))
}

func TestMappedAndPwritePathsAgree(t *testing.T) {
	for _, disable := range []bool{false, true} {
		dir := t.TempDir()
		o := testOptions()
		o.SegmentSize = 8192
		o.DisableMmap = disable
		s := openT(t, dir, o)
		res := putN(t, s, "M", 0, 100, "x")
		s.activeSeg.Load().mu.RLock()
		mapped := s.activeSeg.Load().m != nil
		s.activeSeg.Load().mu.RUnlock()
		assert.Equal(t, !disable, mapped)
		waitDispatch(t, s)
		checkConsistent(t, s)
		require.NoError(t, s.Close())
		s = openT(t, dir, o)
		checkConsistent(t, s)
		assert.Equal(t, int64(100), s.MaxOffset("M", 0))
		b, err := s.MessageAt(res[99].CommitLogOffset)
		require.NoError(t, err)
		assert.Len(t, b, int(res[99].Size))
		require.NoError(t, s.Close())
	}
}
