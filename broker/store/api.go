package store

import (
	"strconv"
	"time"
)

// DispatchEvent describes one consume-queue unit just appended by the dispatcher.
type DispatchEvent struct {
	Topic           string
	QueueID         int32
	QueueOffset     int64
	CommitLogOffset int64
	Size            int32
	TagsCode        int64
	StoreTimestamp  int64 // Unix milliseconds
}

// PutResult is where an appended message was stored.
type PutResult struct {
	CommitLogOffset int64
	QueueOffset     int64
	Size            int32
	StoreTimestamp  int64 // Unix milliseconds
	// MsgID is the offsetMsgId: hex of the store host's address, its port and
	// CommitLogOffset; MessageAt(CommitLogOffset) finds the message again.
	MsgID string
}

// GetStatus is the outcome of GetMessage. The names are RocketMQ's GetMessageStatus.
type GetStatus int

const (
	Found GetStatus = iota
	NoMatchedMessage
	MessageWasRemoving
	OffsetFoundNull
	OffsetOverflowBadly
	OffsetOverflowOne
	OffsetTooSmall
	NoMatchedLogicQueue
	NoMessageInQueue
)

var getStatusNames = [...]string{
	Found:               "FOUND",
	NoMatchedMessage:    "NO_MATCHED_MESSAGE",
	MessageWasRemoving:  "MESSAGE_WAS_REMOVING",
	OffsetFoundNull:     "OFFSET_FOUND_NULL",
	OffsetOverflowBadly: "OFFSET_OVERFLOW_BADLY",
	OffsetOverflowOne:   "OFFSET_OVERFLOW_ONE",
	OffsetTooSmall:      "OFFSET_TOO_SMALL",
	NoMatchedLogicQueue: "NO_MATCHED_LOGIC_QUEUE",
	NoMessageInQueue:    "NO_MESSAGE_IN_QUEUE",
}

// String is the RocketMQ status name, which a pull response carries as its remark.
func (s GetStatus) String() string {
	if s >= 0 && int(s) < len(getStatusNames) {
		return getStatusNames[s]
	}
	return "GetStatus(" + strconv.Itoa(int(s)) + ")"
}

// Filter is the read path's hook: GetMessage returns only messages both methods accept.
//
// MatchTagsCode sees the consume-queue unit's tag hash and costs nothing to call;
// MatchMessage sees the exact stored bytes of a message that passed it (decode what you
// need: StoredProperties finds the property block without allocating). stored must not be
// kept after MatchMessage returns. A nil Filter accepts everything.
//
// One Filter value is called from several goroutines at once, so implementations must be
// safe for concurrent use (flowd's are immutable after they are built). A pull builds one
// Filter and passes it to GetMessage on the pull's goroutine, which calls both methods, one
// call at a time; while that pull is parked, the broker's long-poll wake-up calls
// MatchTagsCode on the dispatcher's goroutine (from Options.OnDispatch) for every message
// dispatched to the queue, which can overlap the pull's own read after parking.
// MatchTagsCode runs inside the dispatcher, so it must be cheap and never block.
type Filter interface {
	MatchTagsCode(tagsCode int64) bool
	MatchMessage(stored []byte) bool
}

// GetResult is what GetMessage read.
//
// Messages alias one pooled buffer: they are valid until Release. Call Release once the
// pull response is written; a result that is never released is simply garbage collected.
type GetResult struct {
	Status GetStatus
	// NextBeginOffset is where the next pull of this queue should start (RocketMQ's rules; see GetMessage).
	NextBeginOffset int64
	// MinOffset and MaxOffset are the queue's bounds at the time of the read; MaxOffset is
	// exclusive.
	MinOffset, MaxOffset int64
	// Messages are the exact stored bytes of each message, in queue order: a pull response
	// body is their concatenation.
	Messages [][]byte
	// TotalBytes is the sum of len(Messages[i]).
	TotalBytes int

	buf *[]byte
	s   *Store
}

// Release hands the result's buffer back for reuse. Messages must not be used afterwards.
// Release is idempotent and safe on a nil result.
func (r *GetResult) Release() {
	if r == nil || r.buf == nil {
		return
	}
	r.s.putReadBuf(r.buf, *r.buf) // drops buffers above readBufRetainMax
	r.buf = nil
	r.Messages = nil
}

// Stats is a snapshot of the store's positions and counters.
type Stats struct {
	// CommitLogMinOffset is the first offset still stored (the oldest segment's start).
	CommitLogMinOffset int64
	// CommitLogMaxOffset is the end of the written commit log (exclusive).
	CommitLogMaxOffset int64
	// DispatchedOffset is how far the dispatcher has built consume queues.
	DispatchedOffset int64
	// FlushedOffset is how far the commit log is known durable.
	FlushedOffset int64
	// Segments is the number of commit-log segment files.
	Segments int
	// Fsyncs counts commit-log fsyncs since Open (group commit makes it much smaller than
	// the number of synchronous appends).
	Fsyncs int64
	// ConsumeQueues is the number of (topic, queue id) pairs.
	ConsumeQueues int
	// WriteFailure is the write error that stopped the store taking writes, or nil.
	WriteFailure error
	// Recovery is what Open found and repaired.
	Recovery RecoveryReport
}

// RecoveryReport says what Open did to bring the store back to a consistent state.
type RecoveryReport struct {
	// Clean is true when the previous run closed the store (no abort marker).
	Clean bool
	// CheckpointFound is false when the checkpoint was missing or damaged; recovery then
	// validated the whole commit log.
	CheckpointFound bool
	// ValidatedFrom is the commit-log offset where validation started.
	ValidatedFrom int64
	// End is the recovered end of the commit log: appends continue here.
	End int64
	// Cut is true when a torn or corrupt tail was removed; CutAt is where the first bad
	// message started, CutBytes how many bytes of data (not blank preallocation) followed,
	// and CutReason why the message at CutAt was rejected.
	Cut       bool
	CutAt     int64
	CutBytes  int64
	CutReason string
	// RemovedSegments are segment files after CutAt that were deleted.
	RemovedSegments []string
	// Redispatched counts messages whose consume-queue units were rewritten.
	Redispatched int64
	// RemovedUnits counts consume-queue units dropped because they pointed past End or
	// were zero-filled garbage.
	RemovedUnits int64
	// Duration is how long recovery took.
	Duration time.Duration
}
