package store

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/flowd-io/flowd/broker/store/vfs"
)

// Errors returned by the store. Each is wrapped with context; test with errors.Is.
var (
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("store closed")
	// ErrMessageTooLarge: the stored form exceeds Options.MaxMessageSize.
	ErrMessageTooLarge = errors.New("message too large")
	// ErrFlushTimeout: in FlushSync mode the fsync covering the message did not finish within
	// Options.SyncFlushTimeout. The message is stored and will be dispatched; it is only not
	// known to be durable (RocketMQ's FLUSH_DISK_TIMEOUT).
	ErrFlushTimeout = errors.New("flush timeout")
	// ErrWriteFailed: a write or fsync failed. The store refuses every later write, because
	// continuing would leave a hole or an undetectably lost message; data stored before the
	// failure stays readable. Reopen the store (after fixing the disk) to recover.
	ErrWriteFailed = errors.New("store write failed")
	// ErrLocked: another process (or another Store in this one) has the directory open.
	ErrLocked = vfs.ErrLocked
	// ErrNotFound: no message at that commit-log offset.
	ErrNotFound = errors.New("message not found")
	// ErrBadTopic: the topic name is empty, too long, or has characters outside
	// [%|a-zA-Z0-9_-] (topics name directories), or the queue id is negative.
	ErrBadTopic = errors.New("bad topic or queue id")
	// ErrHalfMessage: the message is a transactional half (prepared) or rolled-back message,
	// which must never be delivered. The store does not implement transactions, so it never
	// stores them, where they would be dispatched like any other message.
	ErrHalfMessage = errors.New("transactional half message")
	// ErrCorrupt: a store file is damaged in a way recovery cannot repair by cutting.
	ErrCorrupt = errors.New("store corrupt")
	// ErrFilterFailed: a read's Filter.Match failed under FailClosed before the read took
	// any message; the queue stays at the requested offset. The filter's own error is
	// wrapped too.
	ErrFilterFailed = errors.New("message filter failed")
	// ErrReadFailed: a read of a store file (commit log, consume queue, key index,
	// checkpoint) failed with an I/O error or came back short. Nothing was skipped: a read
	// for a pull stops at the message it could not read, and a read during Open fails it
	// before anything is cut. The file's own error is wrapped too.
	ErrReadFailed = errors.New("store read failed")
)

// readFailure marks err, a failed read of a store file, as ErrReadFailed and counts it in
// n (Stats.ReadErrors).
func readFailure(n *atomic.Int64, err error) error {
	n.Add(1)
	return fmt.Errorf("%w: %w", ErrReadFailed, err)
}
