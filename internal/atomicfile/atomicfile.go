// Package atomicfile replaces small files (configuration, offset tables) so that a crash or
// power cut leaves either the old content or the new, never a mix or an empty file.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// WriteFile replaces path with data: it writes a temporary file in the same directory,
// fsyncs it, renames it over path and fsyncs the directory.
//
// Each step is needed: without the file fsync a power cut after the rename can leave an
// empty or partial file under the new name (the rename reached the disk, the data did not);
// without the directory fsync the rename itself can be lost, so a caller that acted on the
// new content (for example deleted data it no longer references) would find the old one.
// The temporary file is in the same directory because rename is atomic only within one
// file system. perm is applied to the new file.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("write %s: the new content is in place but may not survive a power cut: %w", path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", dir, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}
