package plugins

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/flowd-io/flowd/internal/atomicfile"
	"github.com/flowd-io/flowd/runtime"
)

// Store keeps deployed plugin versions and which version of each plugin is active. The
// [Registry] runs on it; [DirStore] keeps it in a directory, and a cluster can keep it in a
// replicated key-value store instead. Implementations must be safe for concurrent use.
type Store interface {
	// Put stores a version. The manifest is valid and its SHA256 matches wasm.
	Put(ctx context.Context, m *Manifest, wasm []byte) error
	// Get returns a version, its module checked against the manifest's SHA256 (a mismatch
	// wraps [runtime.ErrChecksum]), or an error wrapping [ErrNotFound].
	Get(ctx context.Context, name, version string) (*Manifest, []byte, error)
	// Delete removes a version; removing one that is not there is not an error.
	Delete(ctx context.Context, name, version string) error
	// List returns the manifests of every version, sorted by name and version string.
	List(ctx context.Context) ([]*Manifest, error)
	// Active returns the active version of each plugin that has one.
	Active(ctx context.Context) (map[string]string, error)
	// SetActive records version as the active one of name; "" clears it. It is durable
	// when it returns.
	SetActive(ctx context.Context, name, version string) error
}

// DirStore is a [Store] in a directory (for example <data-dir>/plugins):
//
//	<dir>/<name>/<version>/module.wasm
//	<dir>/<name>/<version>/manifest.json
//	<dir>/active.json               {"name": "version", ...}
//
// Every file is replaced atomically (write, fsync, rename, fsync the directory), and the
// manifest is written after the module, so a version whose manifest exists is complete.
type DirStore struct {
	dir string
}

// NewDirStore returns a DirStore in dir, creating it if needed.
func NewDirStore(dir string) (*DirStore, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("plugin store %s: %w", dir, err)
	}
	return &DirStore{dir: dir}, nil
}

const (
	moduleFile   = "module.wasm"
	manifestFile = "manifest.json"
	activeFile   = "active.json"
)

func (s *DirStore) versionDir(name, version string) string {
	return filepath.Join(s.dir, name, version)
}

// Put implements [Store].
func (s *DirStore) Put(_ context.Context, m *Manifest, wasm []byte) error {
	if err := m.Validate(); err != nil {
		return err
	}
	dir := s.versionDir(m.Name, m.Version)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("store plugin %s: %w", m.ID(), err)
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, moduleFile), wasm, 0o644); err != nil {
		return fmt.Errorf("store plugin %s: %w", m.ID(), err)
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("store plugin %s: encode manifest: %w", m.ID(), err)
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, manifestFile), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("store plugin %s: %w", m.ID(), err)
	}
	return nil
}

// Get implements [Store].
func (s *DirStore) Get(_ context.Context, name, version string) (*Manifest, []byte, error) {
	if !nameRE.MatchString(name) || !semverRE.MatchString(version) {
		return nil, nil, fmt.Errorf("plugin %s@%s: %w", name, version, ErrNotFound)
	}
	dir := s.versionDir(name, version)
	mb, err := os.ReadFile(filepath.Join(dir, manifestFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("plugin %s@%s: %w", name, version, ErrNotFound)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("plugin %s@%s: %w", name, version, err)
	}
	m, err := ParseManifest(mb)
	if err != nil {
		return nil, nil, fmt.Errorf("plugin %s@%s: %s: %w", name, version, filepath.Join(dir, manifestFile), err)
	}
	if m.Name != name || m.Version != version {
		return nil, nil, fmt.Errorf("plugin %s@%s: %s names %s: %w", name, version, filepath.Join(dir, manifestFile), m.ID(), ErrManifest)
	}
	wasm, err := os.ReadFile(filepath.Join(dir, moduleFile))
	if err != nil {
		return nil, nil, fmt.Errorf("plugin %s: %w", m.ID(), err)
	}
	if err := checkSum(m, wasm); err != nil {
		return nil, nil, fmt.Errorf("plugin %s: %s: %w", m.ID(), filepath.Join(dir, moduleFile), err)
	}
	return m, wasm, nil
}

func checkSum(m *Manifest, wasm []byte) error {
	sum := sha256.Sum256(wasm)
	if got := hex.EncodeToString(sum[:]); got != m.SHA256 {
		return fmt.Errorf("sha256 is %s, the manifest says %s: %w", got, m.SHA256, runtime.ErrChecksum)
	}
	return nil
}

// Delete implements [Store].
func (s *DirStore) Delete(_ context.Context, name, version string) error {
	if !nameRE.MatchString(name) || !semverRE.MatchString(version) {
		return nil
	}
	dir := s.versionDir(name, version)
	// The manifest goes first: a version without one is incomplete and ignored.
	if err := os.Remove(filepath.Join(dir, manifestFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove plugin %s@%s: %w", name, version, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove plugin %s@%s: %w", name, version, err)
	}
	_ = os.Remove(filepath.Join(s.dir, name)) // only if it is empty now
	return nil
}

// List implements [Store]. Versions whose manifest is missing (a deploy cut short) are
// skipped; unreadable ones are errors.
func (s *DirStore) List(_ context.Context) ([]*Manifest, error) {
	names, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("list plugins in %s: %w", s.dir, err)
	}
	var out []*Manifest
	for _, n := range names {
		if !n.IsDir() || !nameRE.MatchString(n.Name()) {
			continue
		}
		versions, err := os.ReadDir(filepath.Join(s.dir, n.Name()))
		if err != nil {
			return nil, fmt.Errorf("list plugins: %w", err)
		}
		for _, v := range versions {
			path := filepath.Join(s.dir, n.Name(), v.Name(), manifestFile)
			b, err := os.ReadFile(path)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("list plugins: %w", err)
			}
			m, err := ParseManifest(b)
			if err != nil {
				return nil, fmt.Errorf("list plugins: %s: %w", path, err)
			}
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b *Manifest) int {
		if a.Name != b.Name {
			return compareStrings(a.Name, b.Name)
		}
		return compareStrings(a.Version, b.Version)
	})
	return out, nil
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Active implements [Store].
func (s *DirStore) Active(_ context.Context) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, activeFile))
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read active plugin versions: %w", err)
	}
	active := map[string]string{}
	if err := json.Unmarshal(b, &active); err != nil {
		return nil, fmt.Errorf("read active plugin versions %s: %w", filepath.Join(s.dir, activeFile), err)
	}
	return active, nil
}

// SetActive implements [Store]. It rewrites active.json; a DirStore has one writer, the
// registry, which serialises calls.
func (s *DirStore) SetActive(ctx context.Context, name, version string) error {
	active, err := s.Active(ctx)
	if err != nil {
		return err
	}
	if version == "" {
		delete(active, name)
	} else {
		active[name] = version
	}
	b, err := json.MarshalIndent(active, "", "  ")
	if err != nil {
		return fmt.Errorf("encode active plugin versions: %w", err)
	}
	if err := atomicfile.WriteFile(filepath.Join(s.dir, activeFile), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("record active plugin versions: %w", err)
	}
	return nil
}
