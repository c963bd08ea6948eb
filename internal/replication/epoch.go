package replication

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"

	"github.com/flowd-io/flowd/internal/atomicfile"
)

// EpochFileName is the epoch file's name in the store directory's parent (the data dir).
const EpochFileName = "epochs.json"

// Epoch is one term of a replica set's mastership: the master elected with Epoch wrote the
// commit log from Start on, until the next epoch's Start. Set is the replica set whose
// history it is (zero in histories written before sets had identities).
type Epoch struct {
	Epoch int64 `json:"epoch"`
	Start int64 `json:"start"`
	Set   SetID `json:"set,omitempty"`
}

// SetID is a replica set's identity: 64 random bits the set's first master chooses, kept in
// every record of every member's epoch history. Two sets' histories both start with epoch 1
// at offset 0; only the identity tells a log copied from another set apart. Zero: unknown
// (a history written before identities). Written as 16 hex digits.
type SetID uint64

// NewSetID chooses a new, non-zero identity.
func NewSetID() SetID {
	for {
		if id := SetID(rand.Uint64()); id != 0 {
			return id
		}
	}
}

func (id SetID) String() string { return fmt.Sprintf("%016x", uint64(id)) }

// MarshalText writes the identity as 16 hex digits.
func (id SetID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText reads 16 hex digits.
func (id *SetID) UnmarshalText(b []byte) error {
	v, err := strconv.ParseUint(string(b), 16, 64)
	if err != nil {
		return fmt.Errorf("replica set identity %q: %w", b, err)
	}
	*id = SetID(v)
	return nil
}

// ErrOtherSet: a history, or a log, belongs to another replica set than the one asked of
// it (a data directory restored from another set's backup). Nothing of it is cut.
var ErrOtherSet = errors.New("the log of another replica set")

// ErrEpochOrder: an epoch added is not after the last one (a lower epoch, or a start below
// the last start), which would make the history ambiguous.
var ErrEpochOrder = errors.New("epoch out of order")

// EpochFile is a node's epoch history, RocketMQ 5's epoch file: which epoch wrote which
// range of its commit log. Comparing two histories finds where two logs stop agreeing
// (CommonOffset). Safe for concurrent use.
type EpochFile struct {
	path string
	mu   sync.Mutex
	eps  []Epoch
	set  SetID // the set's identity: stamped on every record Add writes
}

// OpenEpochFile reads the history at path, or starts an empty one if there is none.
func OpenEpochFile(path string) (*EpochFile, error) {
	f := &EpochFile{path: path}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return f, nil
	case err != nil:
		return nil, fmt.Errorf("read epoch file %s: %w", path, err)
	}
	if err := json.Unmarshal(b, &f.eps); err != nil {
		return nil, fmt.Errorf("decode epoch file %s: %w", path, err)
	}
	for i, e := range f.eps {
		if i > 0 && (e.Epoch <= f.eps[i-1].Epoch || e.Start < f.eps[i-1].Start) {
			return nil, fmt.Errorf("epoch file %s: entry %d: %w", path, i, ErrEpochOrder)
		}
		switch {
		case e.Set == 0:
		case f.set == 0:
			f.set = e.Set
		case e.Set != f.set:
			return nil, fmt.Errorf("epoch file %s: entry %d is of replica set %s, entry 0 of %s: %w", path, i, e.Set, f.set, ErrOtherSet)
		}
	}
	return f, nil
}

// Identity is the replica set the history belongs to (zero: not known yet, an empty history
// or one written before identities).
func (f *EpochFile) Identity() SetID {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.set
}

// SetIdentity makes id the history's identity and writes it into every record: a new set's
// first master, or a member whose history predates identities adopting its master's. A
// history of another identity is left as it is (ErrOtherSet).
func (f *EpochFile) SetIdentity(id SetID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case id == 0 || id == f.set && !slices.ContainsFunc(f.eps, func(e Epoch) bool { return e.Set != id }):
		return nil
	case f.set != 0 && f.set != id:
		return fmt.Errorf("this member's history is of replica set %s, not %s: %w", f.set, id, ErrOtherSet)
	}
	eps := slices.Clone(f.eps)
	for i := range eps {
		eps[i].Set = id
	}
	if len(eps) > 0 {
		if err := f.writeLocked(eps); err != nil {
			return err
		}
	}
	f.set = id
	return nil
}

// Epochs is a copy of the history, oldest first.
func (f *EpochFile) Epochs() []Epoch {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.eps)
}

// Last is the newest epoch (zero value when the history is empty).
func (f *EpochFile) Last() Epoch {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.eps) == 0 {
		return Epoch{}
	}
	return f.eps[len(f.eps)-1]
}

// Add appends epoch e, starting at e.Start, and writes the file before it returns (a
// record of epoch e must never be on disk while the file does not know e). Adding the
// last epoch again is a no-op.
func (f *EpochFile) Add(e Epoch) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case e.Set == 0:
		e.Set = f.set
	case f.set != 0 && e.Set != f.set:
		return fmt.Errorf("add epoch %d of replica set %s to a history of %s: %w", e.Epoch, e.Set, f.set, ErrOtherSet)
	}
	if n := len(f.eps); n > 0 {
		last := f.eps[n-1]
		if last.Epoch == e.Epoch && last.Start == e.Start {
			return nil
		}
		if e.Epoch <= last.Epoch || e.Start < last.Start {
			return fmt.Errorf("add epoch %d at %d after epoch %d at %d: %w", e.Epoch, e.Start, last.Epoch, last.Start, ErrEpochOrder)
		}
	}
	if err := f.writeLocked(append(slices.Clone(f.eps), e)); err != nil {
		return err
	}
	f.set = e.Set
	return nil
}

// TruncateTo forgets what the history says about offsets at and past end: epochs that start
// at or after end are dropped (the log was cut there; the replica records them again from the
// master's frames as it follows). Run it with store.Truncate.
func (f *EpochFile) TruncateTo(end int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	keep := slices.Clone(f.eps)
	for len(keep) > 0 && keep[len(keep)-1].Start >= end {
		keep = keep[:len(keep)-1]
	}
	if len(keep) == len(f.eps) {
		return nil
	}
	return f.writeLocked(keep)
}

func (f *EpochFile) writeLocked(eps []Epoch) error {
	b, err := json.Marshal(eps)
	if err != nil {
		return fmt.Errorf("encode epoch file: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(f.path), 0o755); err != nil {
		return fmt.Errorf("write epoch file %s: %w", f.path, err)
	}
	if err := atomicfile.WriteFile(f.path, b, 0o644); err != nil {
		return fmt.Errorf("write epoch file %s: %w", f.path, err)
	}
	f.eps = eps
	return nil
}

// EpochAt is the epoch that wrote offset off according to eps, and where that epoch's range
// ends (the next epoch's start; -1 for the last, open-ended one). ok is false when off is
// before the first epoch.
func EpochAt(eps []Epoch, off int64) (e Epoch, end int64, ok bool) {
	for i := len(eps) - 1; i >= 0; i-- {
		if eps[i].Start <= off {
			end = -1
			if i+1 < len(eps) {
				end = eps[i+1].Start
			}
			return eps[i], end, true
		}
	}
	return Epoch{}, 0, false
}

// CommonOffset is where a replica's log (history replica, end replicaEnd) stops agreeing
// with the master's (history master, end masterEnd): the end of the newest epoch both
// histories hold with the same start, bounded by both logs' ends. Everything the replica
// has past it was written by a master the current one does not know of (a deposed master's
// unreplicated tail), and must be cut before it follows. An empty replica history agrees
// with everything up to its end only if the replica is empty too; otherwise the result is 0
// (no common ground). RocketMQ 5's epoch-file comparison.
func CommonOffset(master []Epoch, masterEnd int64, replica []Epoch, replicaEnd int64) int64 {
	if replicaEnd == 0 {
		return 0
	}
	for i := len(replica) - 1; i >= 0; i-- {
		r := replica[i]
		j := slices.IndexFunc(master, func(m Epoch) bool { return m.Epoch == r.Epoch })
		if j < 0 || master[j].Start != r.Start {
			continue
		}
		mEnd := masterEnd
		if j+1 < len(master) {
			mEnd = master[j+1].Start
		}
		rEnd := replicaEnd
		if i+1 < len(replica) {
			rEnd = replica[i+1].Start
		}
		return min(mEnd, rEnd, masterEnd, replicaEnd)
	}
	return 0
}
