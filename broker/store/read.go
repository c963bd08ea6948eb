package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/flowd-io/flowd/protocol"
)

// Batch caps of a pull (RocketMQ's maxTransfer{Bytes,Count}OnMessageIn{Memory,Disk}), and the
// consume-queue scan bound.
const (
	memBatchBytes  = 256 << 10
	memBatchCount  = 32
	diskBatchBytes = 64 << 10
	diskBatchCount = 8
	minScanBytes   = 16000
	// maxScanMsgs bounds the consume-queue scan one read may ask for (64 Ki units, 1.25 MiB),
	// so that a hostile maxMsgs cannot size the scan buffer.
	maxScanMsgs = 64 << 10
)

// GetMessage reads up to maxMsgs messages of (topic, queueID) from queue offset offset that
// f accepts (nil accepts all), for a pull.
//
// Status and NextBeginOffset follow RocketMQ's getMessage rules. A batch always takes its first
// message; it then stops at maxMsgs, at maxBytes (≤ 0: no byte cap), or at the residency
// cap: 256 KiB / 32 messages while the data is within Options.MemoryBudget of the log's end,
// 64 KiB / 8 messages beyond. maxMsgs ≤ 0 reads one message. At most
// max(16000 bytes, maxMsgs×20) of consume queue is scanned, within one consume-queue file.
//
// With f.Match set, the units that pass f's tag codes are read ahead in windows and each
// window goes to f.Match as one batch (see Filter). NextBeginOffset stays exact: every
// message below it was evaluated and either returned or rejected, and none at or above it
// was returned. A window may hold more matches than the batch can take (windows grow while
// the filter rejects): the read then stops at the first match it cannot take, which the
// next read evaluates again.
//
// A message whose commit-log segment retention removed is passed over, with the rest of
// that segment (MessageWasRemoving if nothing was taken), as RocketMQ does. A read that races
// with retention can thus take messages on both sides of removed ones, or end its batch
// with removed ones below NextBeginOffset: the batch's messages are then not the Count
// queue offsets below NextBeginOffset, and each carries its own queue offset.
//
// A message (or consume-queue unit) that cannot be read, an I/O error or a short read,
// ends the batch: the messages before it are returned with NextBeginOffset at it, never past
// it. A read that fails before it took any message returns an error wrapping ErrReadFailed,
// so that the caller retries from offset.
//
// The error is non-nil when ctx is done, the store is closed, f.Match failed under
// FailClosed before any message was taken (ErrFilterFailed), or a read failed before any
// was (ErrReadFailed); everything else is a status. Call Release on the result when its
// Messages are no longer needed.
func (s *Store) GetMessage(ctx context.Context, topic string, queueID int32, offset int64, maxMsgs, maxBytes int, f *Filter) (*GetResult, error) {
	return s.getMessage(ctx, topic, queueID, offset, maxMsgs, maxBytes, f, false)
}

// getMessage is GetMessage, or GetRegions when regions is set. It scans the consume queue
// once and hands the units, as a unitIter that keeps GetMessage's rules, to the read that
// fits: windows for a batch filter, regions, or a plain batch.
func (s *Store) getMessage(ctx context.Context, topic string, queueID int32, offset int64, maxMsgs, maxBytes int, f *Filter, regions bool) (*GetResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s.isClosed() {
		return nil, ErrClosed
	}
	r := &GetResult{s: s}
	q := s.queue(topic, queueID)
	if !r.bounds(q, offset) {
		return r, nil
	}

	scan := max(minScanBytes, min(maxMsgs, maxScanMsgs)*cqUnitSize) / cqUnitSize
	up := s.getReadBuf()
	ubuf := slices.Grow((*up)[:0], scan*cqUnitSize)[:scan*cqUnitSize]
	defer s.putReadBuf(up, ubuf)
	units, st, next, err := q.readUnits(ubuf, offset, scan)
	switch {
	case err != nil:
		return nil, fmt.Errorf("read %s/%d at queue offset %d: %w", topic, queueID, offset, err)
	case st == cqNoFile:
		r.Status, r.NextBeginOffset = OffsetFoundNull, next
		return r, nil
	case st == cqNoUnits:
		r.Status, r.NextBeginOffset = OffsetOverflowOne, offset
		return r, nil
	}
	it := s.newUnitIter(topic, queueID, offset, units, maxMsgs, maxBytes, f)
	switch {
	case f != nil && f.Match != nil: // the filter needs the bytes, regions or not
		return it.readFiltered(ctx, r)
	case regions:
		return it.readRegions(r)
	default:
		return it.readBatch(r)
	}
}

// readBatch reads every unit it gives into one pooled buffer, the messages of r.
func (it *unitIter) readBatch(r *GetResult) (*GetResult, error) {
	bp := it.s.getReadBuf()
	rd := batchReader{s: it.s, buf: (*bp)[:0]}
	for u, ok := it.next(); ok; u, ok = it.next() {
		at, err := rd.get(it.units, u, it.countRoom(), it.byteRoom(u.inDisk))
		if it.settle(u, err) {
			rd.accept(at, u.size)
			it.take(u.size, u.inDisk)
		}
	}
	if err := it.end(r); err != nil {
		it.s.putReadBuf(bp, rd.buf)
		return nil, err
	}
	rd.result(r, bp)
	return r, nil
}

// bounds sets r's status for a read of q at offset that finds nothing without reading
// (no such queue, an empty one, an offset outside it) and returns false then; true means
// there are units to read.
func (r *GetResult) bounds(q *consumeQueue, offset int64) bool {
	if q == nil {
		r.Status, r.NextBeginOffset = NoMatchedLogicQueue, 0
		return false
	}
	lo, hi := q.min.Load(), q.max.Load()
	r.MinOffset, r.MaxOffset = lo, hi
	switch {
	case hi == 0:
		r.Status, r.NextBeginOffset = NoMessageInQueue, 0
	case offset < lo:
		r.Status, r.NextBeginOffset = OffsetTooSmall, lo
	case offset == hi:
		r.Status, r.NextBeginOffset = OffsetOverflowOne, offset
	case offset > hi:
		// An offset past the end (a consumer's offset from before the queue was deleted
		// and recreated, say) is corrected to the queue's start while the queue still
		// holds its first message, as RocketMQ 4.x does: re-delivering is safe, skipping
		// what is there is not. Only a queue that already lost its head goes to the end.
		r.Status, r.NextBeginOffset = OffsetOverflowBadly, hi
		if lo == 0 {
			r.NextBeginOffset = 0
		}
	default:
		return true
	}
	return false
}

// result puts the batch's messages into r, in the buffer bp (handed to r when it holds
// any, back to the pool otherwise).
func (rd *batchReader) result(r *GetResult, bp *[]byte) {
	if len(rd.spans) == 0 {
		rd.s.putReadBuf(bp, rd.buf)
		return
	}
	r.Messages = make([][]byte, len(rd.spans))
	for j, sp := range rd.spans {
		r.Messages[j] = rd.buf[sp[0]:sp[1]:sp[1]]
	}
	*bp = rd.buf
	r.buf = bp
}

func (s *Store) getReadBuf() *[]byte {
	if p, ok := s.readPool.Get().(*[]byte); ok {
		return p
	}
	b := make([]byte, 0, readBufInitial)
	return &b
}

func (s *Store) putReadBuf(p *[]byte, b []byte) {
	if cap(b) <= readBufRetainMax {
		*p = b[:0]
		s.readPool.Put(p)
	}
}

func (s *Store) isClosed() bool { return s.closedA.Load() }

// batchReader collects a pull's messages into one buffer, reading runs of messages that are
// adjacent in the commit log with one pread. What the batch may take is unitIter's to say.
type batchReader struct {
	s     *Store
	buf   []byte
	spans [][2]int // the messages taken, as positions in buf
	// window: log bytes [wStart, wEnd) are at buf[wAt:].
	wStart, wEnd int64
	wAt          int
	// singles: a read of a run of messages failed; the rest of the batch is read one
	// message at a time.
	singles bool
}

// get reads the message of u and returns its position in r.buf. A read from the log takes
// along the messages of up to ahead-1 following units when they are adjacent and within
// room bytes, since the batch (or the filter window) may take them too.
func (r *batchReader) get(units []byte, u cqUnit, ahead, room int) (int, error) {
	off, size := u.off, u.size
	if off >= r.wStart && off+int64(size) <= r.wEnd {
		at := r.wAt + int(off-r.wStart)
		return at, r.check(r.buf[at:at+size], off, size)
	}
	if off < r.s.minOffset.Load() {
		return 0, ErrNotFound
	}
	// Extend the read over the following units while they continue the run in the same
	// segment and the batch could still take them.
	budget := max(room, size)
	S := r.s.opts.SegmentSize
	segEnd := off - off%S + S
	end := off + int64(size)
	if r.singles {
		ahead = 0
	}
	for j := u.idx + 1; j < min(len(units)/cqUnitSize, u.idx+ahead); j++ {
		o, sz, _ := decodeUnit(units[j*cqUnitSize:])
		if o != end || sz <= 0 || end+int64(sz) > segEnd || end+int64(sz)-off > int64(budget) {
			break
		}
		end += int64(sz)
	}
	at := len(r.buf)
	r.buf = slices.Grow(r.buf, int(end-off))[:at+int(end-off)]
	err := r.s.readLog(r.buf[at:], off)
	if err != nil && end > off+int64(size) && errors.Is(err, ErrReadFailed) {
		// Somewhere in the run a read fails: read message by message from here on, so that
		// the batch ends at the message that cannot be read, not before readable ones.
		r.singles = true
		end = off + int64(size)
		r.buf = r.buf[:at+size]
		err = r.s.readLog(r.buf[at:], off)
	}
	if err != nil {
		r.buf = r.buf[:at]
		return 0, err
	}
	r.wStart, r.wEnd, r.wAt = off, end, at
	return at, r.check(r.buf[at:at+size], off, size)
}

func (r *batchReader) check(b []byte, off int64, size int) error {
	if int(int32(binary.BigEndian.Uint32(b))) != size || binary.BigEndian.Uint32(b[4:]) != protocol.MagicV1 {
		return fmt.Errorf("consume queue unit (offset %d, size %d) does not match the commit log", off, size)
	}
	return nil
}

// compact drops what the buffer holds past bufStart except the spans from spanStart on
// (the messages a filter window accepted), so that rejected candidates do not pile up in
// the buffer over the windows of one read.
func (r *batchReader) compact(bufStart, spanStart int) {
	w := bufStart
	for k := spanStart; k < len(r.spans); k++ {
		sp := r.spans[k]
		n := copy(r.buf[w:], r.buf[sp[0]:sp[1]])
		r.spans[k] = [2]int{w, w + n}
		w += n
	}
	r.buf = r.buf[:w]
	r.wStart, r.wEnd, r.wAt = 0, 0, 0
}

// accept adds the message at r.buf[at:at+size] to the batch. Positions, not slices, are
// kept because r.buf may move when a later read grows it.
func (r *batchReader) accept(at, size int) {
	r.spans = append(r.spans, [2]int{at, at + size})
}

// InDisk reports whether the message at queue offset offset of (topic, queueID) lies more
// than Options.MemoryBudget behind the end of the commit log, the same test that picks a
// pull's smaller on-disk batch caps. It is RocketMQ's checkInDiskByConsumeOffset: a broker
// lets a group without a stored offset start a queue at 0 only while message 0 is not on
// disk, so that a new group reads a young queue from its start (and never skips what was
// written into queues added after it started) but does not replay a long history. It is
// false when there is no such queue or no unit at offset, as in RocketMQ, and when the unit
// cannot be read (the group then starts at 0: re-delivering, not skipping).
func (s *Store) InDisk(topic string, queueID int32, offset int64) bool {
	q := s.queue(topic, queueID)
	if q == nil || offset < q.min.Load() {
		return false
	}
	off, _, _, err := q.unitAt(offset)
	if err != nil {
		return false
	}
	return s.written.Load()-off > s.opts.MemoryBudget
}

// storeTimeOf reads the store timestamp of the message at off.
func (s *Store) storeTimeOf(off int64, size int32) (int64, error) {
	var hdr [protocol.StoredBornHostAt + 20 + 8]byte
	n := min(int(size), len(hdr))
	if n < protocol.StoredBornHostAt+8+8 {
		return 0, fmt.Errorf("message at %d: size %d: %w", off, size, ErrNotFound)
	}
	if err := s.readLog(hdr[:n], off); err != nil {
		return 0, err
	}
	sysFlag := int32(binary.BigEndian.Uint32(hdr[protocol.StoredSysFlagAt:]))
	at := protocol.StoreTimestampAt(sysFlag)
	if at+8 > n {
		return 0, fmt.Errorf("message at %d: size %d: %w", off, size, ErrNotFound)
	}
	return int64(binary.BigEndian.Uint64(hdr[at:])), nil
}

// StoreTimeAt returns the store timestamp (Unix ms) of the message at queue offset offset.
// It fails with ErrNotFound when there is no such message, and with ErrReadFailed when it
// could not be read.
func (s *Store) StoreTimeAt(topic string, queueID int32, offset int64) (int64, error) {
	q := s.queue(topic, queueID)
	if q == nil || offset < q.min.Load() || offset >= q.max.Load() {
		return 0, fmt.Errorf("store time of %s/%d at %d: %w", topic, queueID, offset, ErrNotFound)
	}
	t, err := s.unitStoreTime(q, offset)
	if err != nil {
		return 0, fmt.Errorf("store time of %s/%d at %d: %w", topic, queueID, offset, err)
	}
	return t, nil
}

// unitStoreTime is the store timestamp of the message of unit idx of q.
func (s *Store) unitStoreTime(q *consumeQueue, idx int64) (int64, error) {
	off, size, _, err := q.unitAt(idx)
	if err != nil {
		return 0, err
	}
	if size <= 0 {
		return 0, fmt.Errorf("unit %d is empty: %w", idx, ErrNotFound)
	}
	return s.storeTimeOf(off, size)
}

// OffsetByTimestamp returns the queue offset of the first message stored at or after ts
// (Unix ms), found by bisection (store timestamps never decrease in a queue). It is clamped
// to [MinOffset, MaxOffset]: MaxOffset when every message is older, 0 for an unknown queue.
// Units whose message was already removed count as older than any ts; a message that
// cannot be read (ErrReadFailed) counts as not older, so that the offset never lies past
// it: a consumer seeking there re-reads rather than skips.
func (s *Store) OffsetByTimestamp(topic string, queueID int32, ts int64) int64 {
	q := s.queue(topic, queueID)
	if q == nil {
		return 0
	}
	lo, hi := q.min.Load(), q.max.Load()
	for lo < hi {
		mid := lo + (hi-lo)/2
		t, err := s.unitStoreTime(q, mid)
		switch {
		case errors.Is(err, ErrReadFailed):
			s.log.Warn("seek by time: message unreadable, counted as not older", "topic", topic, "queue", queueID, "offset", mid, "err", err)
			t = ts
		case err != nil:
			t = -1 << 63
		}
		if t >= ts {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}
