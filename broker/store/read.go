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

// getMessage is GetMessage, or GetRegions when regions is set.
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
	// units alias ubuf; messages go to a second pooled buffer.
	bp := s.getReadBuf()
	rd := batchReader{s: s, buf: (*bp)[:0], maxMsgs: maxMsgs, maxBytes: maxBytes}
	maxPhy := s.written.Load()
	budget := s.opts.MemoryBudget
	S := s.opts.SegmentSize
	status := NoMatchedMessage
	skipBelow := int64(-1) // units in a removed segment are skipped without reading
	var win *filterWindow  // with a batch filter (f.Match)
	if f != nil && f.Match != nil {
		win = s.getWindow()
		defer s.putWindow(win)
	}
	zeroCopy := regions && win == nil // units become regions: nothing is read from the log
	if zeroCopy {
		rd.regions = make([]Region, 0, min(max(maxMsgs, 1), memBatchCount))
	}
	var ferr error // why the read stopped early without a message, if it did
	var rerr error // a message that could not be read: the batch ends at its unit
	n := len(units) / cqUnitSize
	i := 0 // units below i are decided
scan:
	for i < n {
		if win != nil {
			win.start(&rd)
		}
		for ; i < n; i++ {
			off, size, tc := decodeUnit(units[i*cqUnitSize:])
			if size <= 0 || int64(size) > S || off < skipBelow {
				continue // a hole (zero unit), a damaged unit, or a removed segment
			}
			inDisk := maxPhy-off > budget
			if rd.full(int(size), inDisk) {
				if win == nil || len(win.ents) == 0 {
					break scan
				}
				break // decide the window first: it may leave room for nothing more
			}
			if !f.MatchTagsCode(tc) {
				if rd.count == 0 {
					status = NoMatchedMessage // the last reason for an empty batch wins, as in RocketMQ
				}
				continue
			}
			if win != nil && win.full(int(size)) {
				break
			}
			at, err := rd.read(units, i, off, int(size), inDisk, win, zeroCopy)
			if errors.Is(err, ErrReadFailed) {
				// Passing over it would move NextBeginOffset past a message nobody read: the
				// batch ends here, and the next read starts with it.
				rerr = fmt.Errorf("read %s/%d at queue offset %d: %w", topic, queueID, offset+int64(i), err)
				break
			}
			if errors.Is(err, ErrNotFound) {
				if rd.count == 0 {
					status = MessageWasRemoving
				}
				skipBelow = off - off%S + S
				continue
			}
			if err != nil { // a unit that does not match the log: damage no read repairs
				s.log.Warn("read message for pull", "topic", topic, "queue", queueID, "offset", offset+int64(i), "err", err)
				continue
			}
			if win == nil { // no batch filter: the message is in the batch
				if !zeroCopy {
					rd.accept(at, int(size))
				}
				status = Found
				continue
			}
			win.add(windowEntry{unit: i, at: at, size: int(size), offset: offset + int64(i), tagCode: tc, inDisk: inDisk})
		}
		if win != nil && len(win.ents) > 0 {
			if at, err := s.decideWindow(ctx, f, win, &rd, &status, topic, queueID); at >= 0 {
				i, ferr = at, err
				break scan
			}
		}
		if rerr != nil {
			break
		}
	}
	return rd.finish(r, bp, status, offset+int64(i), ferr, rerr, zeroCopy)
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

// decideWindow hands the window to f.Match and takes what it keeps into the batch. It
// returns the unit at which the read stops (-1: go on), with the read's error when a
// FailClosed filter failed.
func (s *Store) decideWindow(ctx context.Context, f *Filter, win *filterWindow, rd *batchReader, status *GetStatus, topic string, queueID int32) (int, error) {
	keep, err := win.decide(ctx, f.Match, rd, topic, queueID)
	if err != nil {
		first := win.ents[0]
		if ctx.Err() == nil && f.OnError == FailOpen {
			s.log.Warn("message filter failed; delivering its batch (fail-open)", "topic", topic, "queue", queueID, "offset", first.offset, "messages", len(win.ents), "err", err)
			for k := range keep {
				keep[k] = true
			}
		} else {
			// Hold the queue at the window's first message: nothing of it was decided.
			if ctx.Err() != nil {
				return first.unit, ctx.Err()
			}
			return first.unit, fmt.Errorf("%w: %s/%d at %d: %w", ErrFilterFailed, topic, queueID, first.offset, err)
		}
	}
	rejected := false
	for k, ok := range keep {
		if !ok {
			rejected = true
			if rd.count == 0 {
				*status = NoMatchedMessage
			}
			continue
		}
		e := win.ents[k]
		if rd.full(e.size, e.inDisk) {
			return e.unit, nil // evaluated but not taken: the next read starts here
		}
		rd.accept(e.at, e.size)
		*status = Found
	}
	if rejected {
		rd.compact(win.bufStart, win.spanStart)
	}
	win.grow++
	return -1, nil
}

// finish ends a read that stopped at next: with ferr if it took nothing (and failed), else
// with the batch in r. rerr is a read that failed at next: the error when nothing was
// taken, else only logged, since the batch before it is delivered.
func (rd *batchReader) finish(r *GetResult, bp *[]byte, status GetStatus, next int64, ferr, rerr error, zeroCopy bool) (*GetResult, error) {
	if rerr != nil && ferr == nil {
		if rd.count == 0 {
			ferr = rerr
		} else {
			rd.s.log.Warn("pull batch ends at a message that could not be read", "err", rerr)
		}
	}
	if ferr != nil && rd.count == 0 {
		rd.s.putReadBuf(bp, rd.buf)
		return nil, ferr
	}
	r.Status, r.NextBeginOffset = status, next
	rd.result(r, bp, zeroCopy)
	return r, nil
}

// result puts the batch into r: its regions, or its messages in the buffer bp (handed to r
// when it holds any, back to the pool otherwise).
func (rd *batchReader) result(r *GetResult, bp *[]byte, zeroCopy bool) {
	r.Count = rd.count
	r.TotalBytes = rd.total
	if zeroCopy {
		rd.s.putReadBuf(bp, rd.buf)
		r.pins = rd.pins
		r.Regions = rd.regions
		return
	}
	if rd.count == 0 {
		rd.s.putReadBuf(bp, rd.buf)
		return
	}
	r.Messages = make([][]byte, rd.count)
	for j, sp := range rd.spans {
		r.Messages[j] = rd.buf[sp[0]:sp[1]:sp[1]]
	}
	*bp = rd.buf
	r.buf = bp
}

// maxWindowGrowth bounds how far a filter window grows past the room left in the batch
// (×2 per window that left room): a filter that rejects most messages is then called a few
// times per read instead of once per batch-sized window, and at most 8 × 256 KiB is read
// ahead.
const maxWindowGrowth = 3

// filterWindow is one batch of candidates for Filter.Match. Its slices are reused across
// the windows of a read and, through Store.winPool, across reads.
type filterWindow struct {
	ents  []windowEntry
	bytes int
	// limits of this window, from the batch's remaining room and grow
	maxCount, maxBytes int
	grow               int
	// where the batch reader's buffer and spans stood when the window started
	bufStart, spanStart int

	cands []Candidate
	keep  []bool
}

// windowEntry is a candidate: its unit index, queue offset, tag code, and position in the
// batch reader's buffer.
type windowEntry struct {
	unit, at, size  int
	offset, tagCode int64
	inDisk          bool
}

func (s *Store) getWindow() *filterWindow {
	if w, ok := s.winPool.Get().(*filterWindow); ok {
		return w
	}
	return &filterWindow{}
}

func (s *Store) putWindow(w *filterWindow) {
	if cap(w.ents) > memBatchCount<<maxWindowGrowth {
		return // a read with a huge maxMsgs: let it go
	}
	w.ents, w.grow = w.ents[:0], 0
	s.winPool.Put(w)
}

// start empties the window and sizes it from the room the batch has left.
func (w *filterWindow) start(rd *batchReader) {
	w.ents = w.ents[:0]
	w.bytes = 0
	count := min(max(rd.maxMsgs, 1), memBatchCount) - rd.count
	bytes := memBatchBytes - rd.total
	if rd.maxBytes > 0 {
		bytes = min(bytes, rd.maxBytes-rd.total)
	}
	g := min(w.grow, maxWindowGrowth)
	w.maxCount, w.maxBytes = max(count, 1)<<g, max(bytes, 1)<<g
	w.bufStart, w.spanStart = len(rd.buf), len(rd.spans)
}

// full reports whether a candidate of size bytes would overfill the window (never when it
// is empty, so that a message larger than the window is still evaluated).
func (w *filterWindow) full(size int) bool {
	return len(w.ents) > 0 && (len(w.ents) >= w.maxCount || w.bytes+size > w.maxBytes)
}

func (w *filterWindow) add(e windowEntry) {
	w.ents = append(w.ents, e)
	w.bytes += e.size
}

// decide hands the window to m as one batch. A panic in m is an error of the batch, so a
// faulty filter fails its reads instead of the broker.
func (w *filterWindow) decide(ctx context.Context, m BatchFilter, rd *batchReader, topic string, queueID int32) (keep []bool, err error) {
	n := len(w.ents)
	w.cands = slices.Grow(w.cands[:0], n)[:n]
	w.keep = slices.Grow(w.keep[:0], n)[:n]
	for k, e := range w.ents {
		w.cands[k] = Candidate{
			Topic: topic, QueueID: queueID, QueueOffset: e.offset, TagsCode: e.tagCode,
			Stored: rd.buf[e.at : e.at+e.size : e.at+e.size],
		}
		w.keep[k] = false
	}
	defer func() {
		if p := recover(); p != nil {
			keep, err = w.keep, fmt.Errorf("message filter panicked: %v", p)
		}
		clear(w.cands) // drop the references to the buffer
	}()
	if err := m.MatchBatch(ctx, w.cands, w.keep); err != nil {
		return w.keep, err
	}
	return w.keep, nil
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
// adjacent in the commit log with one pread.
type batchReader struct {
	s                 *Store
	buf               []byte
	spans             [][2]int
	count, total      int
	maxMsgs, maxBytes int
	// window: log bytes [wStart, wEnd) are at buf[wAt:].
	wStart, wEnd int64
	wAt          int
	// singles: a read of a run of messages failed; the rest of the batch is read one
	// message at a time.
	singles bool

	// GetRegions: the batch as regions, the segments they pin, and the last one pinned.
	regions []Region
	pins    []*segment
	seg     *segment
}

// full is RocketMQ's isTheBatchFull plus the byte cap of a pull request.
func (r *batchReader) full(size int, inDisk bool) bool {
	if r.count == 0 {
		return false
	}
	if r.maxMsgs <= r.count {
		return true
	}
	if r.maxBytes > 0 && r.total+size > r.maxBytes {
		return true
	}
	if inDisk {
		return r.total+size > diskBatchBytes || r.count >= diskBatchCount
	}
	return r.total+size > memBatchBytes || r.count >= memBatchCount
}

// read adds the message of unit i (at off, size bytes) to the batch as a region
// (zeroCopy), or reads it with get, the run ahead as long as the batch (or the filter
// window) could take it, and returns where it is in r.buf.
func (r *batchReader) read(units []byte, i int, off int64, size int, inDisk bool, win *filterWindow, zeroCopy bool) (int, error) {
	if zeroCopy {
		return 0, r.region(off, size)
	}
	ahead := min(max(r.maxMsgs, 1), memBatchCount) - r.count
	if win != nil {
		ahead = win.maxCount - len(win.ents)
	}
	return r.get(units, i, off, size, inDisk, ahead)
}

// get reads the message of unit i (at off, size bytes) and returns its position in r.buf.
// A read from the log takes along the messages of up to ahead-1 following units when they
// are adjacent, since the batch (or the filter window) may take them too.
func (r *batchReader) get(units []byte, i int, off int64, size int, inDisk bool, ahead int) (int, error) {
	if off >= r.wStart && off+int64(size) <= r.wEnd {
		at := r.wAt + int(off-r.wStart)
		return at, r.check(r.buf[at:at+size], off, size)
	}
	if off < r.s.minOffset.Load() {
		return 0, ErrNotFound
	}
	// Extend the read over the following units while they continue the run in the same
	// segment and the batch could still take them.
	capBytes := memBatchBytes
	if inDisk {
		capBytes = diskBatchBytes
	}
	if r.maxBytes > 0 {
		capBytes = min(capBytes, r.maxBytes)
	}
	budget := max(capBytes-r.total, size)
	S := r.s.opts.SegmentSize
	segEnd := off - off%S + S
	end := off + int64(size)
	if r.singles {
		ahead = 0
	}
	for j := i + 1; j < min(len(units)/cqUnitSize, i+ahead); j++ {
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
	r.count++
	r.total += size
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
