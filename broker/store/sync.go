package store

import "fmt"

// Sync makes every message appended so far durable: it fsyncs the commit log up to the write
// position, whatever the flush mode. Consume queues need no fsync for this: recovery rebuilds
// every unit the checkpoint does not cover from the commit log.
//
// The broker calls it before it persists consumer offsets, so that a committed offset never
// points past what a power cut leaves of the log. A store that failed returns its write
// failure: nothing written after the failure is known durable.
func (s *Store) Sync() error {
	if s.closedA.Load() {
		return ErrClosed
	}
	if err := s.flushCommitLog(); err != nil {
		return fmt.Errorf("sync store: %w", err)
	}
	return nil
}
