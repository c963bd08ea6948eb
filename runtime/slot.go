package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Slot holds the active version of a module and swaps versions without failing calls. The
// zero value is an empty slot, ready to use; a Slot is safe for concurrent use.
//
// # Notes
//
//   - Warming and validation happen in [Runtime.Load], before Swap: a version that fails
//     to load, fails its ABI check or its self-test never becomes active, and the old one
//     keeps serving.
//   - A borrower that raced a swap (it read the old version just as it closed) retries on
//     the new one, so a swap fails no call.
type Slot struct {
	mu     sync.Mutex // serialises Swap and Close
	cur    atomic.Pointer[Module]
	closed atomic.Bool
}

// Active is the module new borrows go to, or nil.
func (s *Slot) Active() *Module { return s.cur.Load() }

// Swap makes next, a module returned by [Runtime.Load], the active version, then closes the
// previous one: it waits until the calls borrowed from it are released (or ctx is done; it
// then drains in the background) and frees it. New borrows go to next as soon as Swap is
// called.
func (s *Slot) Swap(ctx context.Context, next *Module) error {
	if next == nil {
		return errors.New("swap: nil module")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return fmt.Errorf("swap to %s %s: slot: %w", next.Name(), next.Version(), ErrClosed)
	}
	old := s.cur.Swap(next)
	if old == nil || old == next {
		return nil
	}
	if err := old.Close(ctx); err != nil {
		return fmt.Errorf("swap to %s %s: drain the previous version: %w", next.Name(), next.Version(), err)
	}
	return nil
}

// Borrow borrows an instance of the active version (see [Module.Borrow]).
func (s *Slot) Borrow(ctx context.Context) (*Instance, error) {
	for {
		m := s.cur.Load()
		if m == nil || s.closed.Load() {
			return nil, fmt.Errorf("slot has no active module: %w", ErrClosed)
		}
		inst, err := m.Borrow(ctx)
		if err != nil && errors.Is(err, ErrClosed) && s.cur.Load() != m {
			continue // swapped while we borrowed: use the new version
		}
		return inst, err
	}
}

// Do borrows an instance of the active version, runs fn with it and releases it.
func (s *Slot) Do(ctx context.Context, fn func(*Instance) error) error {
	inst, err := s.Borrow(ctx)
	if err != nil {
		return err
	}
	defer inst.Release()
	return fn(inst)
}

// Close closes the active version (see [Module.Close]); borrows then fail with [ErrClosed].
func (s *Slot) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed.Store(true)
	if m := s.cur.Load(); m != nil {
		return m.Close(ctx)
	}
	return nil
}
