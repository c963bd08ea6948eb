package atomicfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWriteFileReplacesAndLeavesNoTemporaryFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "table.json")
	require.NoError(t, WriteFile(path, []byte("one"), 0o644))
	require.NoError(t, WriteFile(path, []byte("two"), 0o600))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "two", string(b))
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, ents, 1, "the temporary file is renamed, not left behind")
}

func TestWriteFileFailureKeepsTheOldContent(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "table.json")
	require.NoError(t, WriteFile(path, []byte("old"), 0o644))
	// A directory in the way of the rename: the write fails and the temporary file goes.
	blocked := filepath.Join(dir, "sub")
	require.NoError(t, os.MkdirAll(filepath.Join(blocked, "x"), 0o755))
	err := WriteFile(blocked, []byte("new"), 0o644)
	require.Error(t, err)
	assert.Contains(t, err.Error(), blocked)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, ents, 2)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "old", string(b))
}
