package broker

import (
	"encoding/json"
	"fmt"
	"sync"

	"github.com/flowd-io/flowd/internal/atomicfile"
)

// tableFile persists one broker table (topics, subscription groups) as a JSON document,
// written whole and atomically, and remembers which change it last wrote so that the
// periodic flush writes only a table that changed.
//
// The owning table embeds it and passes its own mutex: gen and written are guarded by that
// mutex, which is held only while the document is encoded, never during the write.
type tableFile struct {
	path string
	what string // names the file in errors: "topics", "subscription groups"

	flushMu sync.Mutex // serializes writes, so an older snapshot never overwrites a newer one
	gen     uint64     // counts changes; guarded by the owner's mutex
	written uint64     // the gen the file holds; guarded by the owner's mutex
}

// writeDoc writes the document doc returns; the caller holds flushMu (not mu). A failed
// write leaves the table dirty, so the next flush retries it.
func (f *tableFile) writeDoc(mu *sync.RWMutex, doc func() any) error {
	mu.RLock()
	b, err := json.MarshalIndent(doc(), "", "  ")
	gen := f.gen
	mu.RUnlock()
	if err == nil {
		err = atomicfile.WriteFile(f.path, b, 0o644)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", f.what, err)
	}
	mu.Lock()
	f.written = max(f.written, gen)
	mu.Unlock()
	return nil
}

// flushIfDirtyDoc writes the document if the table changed since the last write.
func (f *tableFile) flushIfDirtyDoc(mu *sync.RWMutex, doc func() any) error {
	f.flushMu.Lock()
	defer f.flushMu.Unlock()
	mu.RLock()
	dirty := f.gen != f.written
	mu.RUnlock()
	if !dirty {
		return nil
	}
	return f.writeDoc(mu, doc)
}
