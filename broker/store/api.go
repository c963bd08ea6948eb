package store

import (
	"context"
	"slices"
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

// Filter selects the messages GetMessage returns. A nil *Filter accepts everything.
//
// A read applies it in two steps. TagsCodes is checked on each consume-queue unit and costs
// no I/O; only units that pass it are read from the commit log. Match, if set, then sees
// those candidates' stored bytes in batches: one call per window of candidates (a window
// holds as many candidates as the batch could still take, and grows while candidates are
// rejected), never one call per message, so a filter with a fixed cost per call (a Wasm
// module) pays it once per window.
//
// One Filter is shared: the broker compiles a subscription once and every pull of it, on
// its own goroutine, reads with the same value, while the long-poll wake-up checks
// MatchTagsCode on the dispatcher's goroutine. A Filter must therefore not change after it
// is built, and Match must be safe for concurrent use.
type Filter struct {
	// TagsCodes, when non-nil, admits only units whose tag code (Java's String.hashCode of
	// the TAGS property, 0 without tags) is one of them. It is a slice, not a set: a
	// subscription names a handful of tags, and a scan of a few codes beats a map lookup.
	TagsCodes []int64

	// Match, when set, decides on the candidates that passed TagsCodes.
	Match BatchFilter

	// OnError is what a read does when Match returns an error (or panics). The zero value is
	// FailClosed.
	OnError FilterErrorPolicy
}

// MatchTagsCode reports whether a unit with tag code tagsCode can match: it checks
// TagsCodes only. It never blocks, so the dispatcher may call it.
func (f *Filter) MatchTagsCode(tagsCode int64) bool {
	return f == nil || f.TagsCodes == nil || slices.Contains(f.TagsCodes, tagsCode)
}

// FilterErrorPolicy says what a read does when a filter fails.
type FilterErrorPolicy int

const (
	// FailClosed delivers nothing the failed call was asked about: a read that has not
	// taken a message yet returns an error wrapping ErrFilterFailed and no result, so the
	// queue stays at its offset until the filter works again; a read that already took
	// messages from earlier windows returns them, with NextBeginOffset at the first message
	// of the failed window. Choose it when delivering an unwanted message is worse than
	// stalling the queue.
	FailClosed FilterErrorPolicy = iota
	// FailOpen delivers every candidate of the failed window as if it matched (and logs the
	// error). Choose it when a consumer re-checks messages itself, or a stalled queue is
	// worse than an extra message.
	FailOpen
)

// String names the policy as configuration spells it.
func (p FilterErrorPolicy) String() string {
	switch p {
	case FailClosed:
		return "fail-closed"
	case FailOpen:
		return "fail-open"
	}
	return "FilterErrorPolicy(" + strconv.Itoa(int(p)) + ")"
}

// BatchFilter decides on a batch of candidate messages at once.
type BatchFilter interface {
	// MatchBatch sets keep[i] to true for each msgs[i] that matches; keep has len(msgs)
	// elements, all false on entry. ctx is the reading pull's: a filter that may be slow
	// must give up when it is done. Neither msgs nor their Stored bytes may be kept after
	// MatchBatch returns. An error applies the Filter's OnError policy to the whole batch.
	MatchBatch(ctx context.Context, msgs []Candidate, keep []bool) error
}

// Candidate is one message a BatchFilter decides on.
type Candidate struct {
	Topic       string
	QueueID     int32
	QueueOffset int64
	// TagsCode is the consume-queue unit's tag code.
	TagsCode int64
	// Stored is the message's exact stored bytes (StoredProperties finds its property
	// block without allocating). Valid only during the MatchBatch call.
	Stored []byte
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
	// Regions, from GetRegions instead of Messages, are where the messages' stored bytes lie
	// in the commit log, in queue order: a pull response body is their concatenation.
	Regions []Region
	// Count is the number of messages, in Messages or in Regions.
	Count int
	// TotalBytes is the sum of len(Messages[i]), or of Regions[i].Length.
	TotalBytes int
	// InDisk reports that the batch's last message lies more than Options.MemoryBudget
	// behind the commit log's end as the read saw it (the test that picks the on-disk batch
	// caps): the reader is far behind, and a replica set's master suggests a replica for
	// its next pull (RocketMQ's suggestPullingFromSlave). False when the read took nothing.
	InDisk bool

	buf  *[]byte
	pins []*segment // the segments of Regions, kept open until Release
	s    *Store
}

// Release hands the result's buffer back for reuse and unpins the segments of its Regions.
// Messages and Regions must not be used afterwards. Release is idempotent and safe on a nil
// result, but not safe for concurrent use.
func (r *GetResult) Release() {
	if r == nil {
		return
	}
	for _, seg := range r.pins {
		seg.unpin()
	}
	r.pins, r.Regions = nil, nil
	if r.buf == nil {
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
	// ReadErrors counts reads of the commit log, consume queues and key index since Open
	// that failed with an I/O error or came back short (ErrReadFailed). The store keeps
	// working: each such read fails, or ends its batch, at what it could not read.
	ReadErrors int64
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
	// RemovedUnits counts consume-queue units dropped because they pointed past End. (The
	// zeros after a file's last unit, which a power cut can leave and a file written through
	// a mapping always has, are not units.)
	RemovedUnits int64
	// Duration is how long recovery took.
	Duration time.Duration
}
