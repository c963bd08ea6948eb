package store

import (
	"errors"
	"fmt"
)

// unitIter walks the consume-queue units one read scanned and holds what GetMessage's rules
// say about them, so that its three ways of reading (readBatch, readRegions, readFiltered)
// only say what to do with a unit's message:
//
//   - next passes over holes (zero units), damaged units, units of a segment retention
//     removed, and units f's tag codes reject, and stops at a unit the batch cannot take
//     (the batch's count and byte bounds);
//   - settle applies the outcome of reading a unit's message: a removed one skips the rest of
//     its segment, one that does not match the log is logged and passed over, one that could
//     not be read stops the read at it;
//   - take, reject and stop keep the status and where the read ends, and end puts them, with
//     NextBeginOffset, into the result.
//
// It lives on the reading goroutine's stack: no allocation per read.
type unitIter struct {
	s       *Store
	f       *Filter
	topic   string
	queueID int32
	units   []byte // the scanned units, aliasing a pooled buffer
	base    int64  // the queue offset of units[0]
	n, i    int    // units below i are decided

	maxPhy, budget, segSize int64 // for inDisk and for telling damaged units apart
	skipBelow               int64 // units of a removed segment are passed over without reading

	// the batch's bounds and what it took so far
	maxMsgs, maxBytes int
	count, total      int
	inDisk            bool // the last message taken lies beyond the memory budget

	status  GetStatus
	stopped bool  // the read ends at i
	err     error // why it ended early, if it did; returned when it took nothing
	faulted bool  // err is a message that could not be read
}

// cqUnit is one consume-queue unit of a read: its index in the scan, where its message lies
// in the commit log, its tag code, and whether the message is beyond the memory budget.
type cqUnit struct {
	idx     int
	off     int64
	size    int
	tagCode int64
	inDisk  bool
}

func (s *Store) newUnitIter(topic string, queueID int32, offset int64, units []byte, maxMsgs, maxBytes int, f *Filter) unitIter {
	return unitIter{
		s: s, f: f, topic: topic, queueID: queueID,
		units: units, base: offset, n: len(units) / cqUnitSize,
		maxPhy: s.written.Load(), budget: s.opts.MemoryBudget, segSize: s.opts.SegmentSize,
		skipBelow: -1,
		maxMsgs:   maxMsgs, maxBytes: maxBytes,
		status: NoMatchedMessage,
	}
}

// next returns the next unit whose message the read should look at and moves past it. It
// returns false at the end of the scan, once the read stopped, and at a unit the batch
// cannot take (the read then ends there).
func (it *unitIter) next() (cqUnit, bool) {
	for ; it.i < it.n && !it.stopped; it.i++ {
		off, size, tc := decodeUnit(it.units[it.i*cqUnitSize:])
		if size <= 0 || int64(size) > it.segSize || off < it.skipBelow {
			continue // a hole (zero unit), a damaged unit, or a removed segment
		}
		inDisk := it.maxPhy-off > it.budget
		if it.full(int(size), inDisk) {
			return cqUnit{}, false
		}
		if !it.f.MatchTagsCode(tc) {
			it.reject()
			continue
		}
		u := cqUnit{idx: it.i, off: off, size: int(size), tagCode: tc, inDisk: inDisk}
		it.i++
		return u, true
	}
	return cqUnit{}, false
}

// back makes u the next unit again: a filter window that cannot hold it leaves it to the next.
func (it *unitIter) back(u cqUnit) { it.i = u.idx }

// settle applies the outcome err of reading u's message and reports whether the message is
// there to take.
func (it *unitIter) settle(u cqUnit, err error) bool {
	switch {
	case err == nil:
		return true
	case errors.Is(err, ErrReadFailed):
		// Passing over it would move NextBeginOffset past a message nobody read: the batch
		// ends here, and the next read starts with it.
		it.stop(u.idx, fmt.Errorf("read %s/%d at queue offset %d: %w", it.topic, it.queueID, it.offset(u.idx), err))
		it.faulted = true
	case errors.Is(err, ErrNotFound):
		if it.count == 0 {
			it.status = MessageWasRemoving
		}
		it.skipBelow = u.off - u.off%it.segSize + it.segSize
	default: // a unit that does not match the log: damage no read repairs
		it.s.log.Warn("read message for pull", "topic", it.topic, "queue", it.queueID, "offset", it.offset(u.idx), "err", err)
	}
	return false
}

// take counts a message of size bytes into the batch; inDisk is whether it lies beyond
// the memory budget.
func (it *unitIter) take(size int, inDisk bool) {
	it.count++
	it.total += size
	it.inDisk = inDisk
	it.status = Found
}

// reject notes a message the filter turned down: the last reason for an empty batch wins,
// as in RocketMQ.
func (it *unitIter) reject() {
	if it.count == 0 {
		it.status = NoMatchedMessage
	}
}

// stop ends the read at unit idx, with err if it took nothing.
func (it *unitIter) stop(idx int, err error) {
	it.i, it.stopped, it.err, it.faulted = idx, true, err, false
}

// offset is the queue offset of unit idx.
func (it *unitIter) offset(idx int) int64 { return it.base + int64(idx) }

// full is RocketMQ's isTheBatchFull plus the byte cap of a pull request.
func (it *unitIter) full(size int, inDisk bool) bool {
	if it.count == 0 {
		return false
	}
	if it.maxMsgs <= it.count {
		return true
	}
	if it.maxBytes > 0 && it.total+size > it.maxBytes {
		return true
	}
	if inDisk {
		return it.total+size > diskBatchBytes || it.count >= diskBatchCount
	}
	return it.total+size > memBatchBytes || it.count >= memBatchCount
}

// countRoom is how many more messages the batch could take while they are in memory.
func (it *unitIter) countRoom() int { return min(max(it.maxMsgs, 1), memBatchCount) - it.count }

// byteRoom is how many more bytes the batch could take, at the cap for messages in memory
// or on disk (inDisk).
func (it *unitIter) byteRoom(inDisk bool) int {
	c := memBatchBytes
	if inDisk {
		c = diskBatchBytes
	}
	if it.maxBytes > 0 {
		c = min(c, it.maxBytes)
	}
	return c - it.total
}

// end puts the read's status, NextBeginOffset and size into r. It returns the error that
// ended the read instead when the read took nothing; a batch that ends at a message that
// could not be read is delivered, and the failure logged.
func (it *unitIter) end(r *GetResult) error {
	if it.err != nil {
		if it.count == 0 {
			return it.err
		}
		if it.faulted {
			it.s.log.Warn("pull batch ends at a message that could not be read", "err", it.err)
		}
	}
	r.Status, r.NextBeginOffset = it.status, it.offset(it.i)
	r.Count, r.TotalBytes, r.InDisk = it.count, it.total, it.inDisk
	return nil
}
