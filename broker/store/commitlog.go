package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/flowd-io/flowd/protocol"
)

// segment is one commit-log file. Its size is always Options.SegmentSize; the bytes past the
// write position read as zeros (the file is created sparse by truncation).
//
// The active segment is normally also mapped into memory (m): appends are then a copy into
// the page cache instead of a pwrite, and reads of recent messages a copy out of it. Older
// segments are read with pread.
type segment struct {
	start int64
	path  string
	f     vfs.File

	// mu guards m against being unmapped under a reader. The writer (holding Store.mu) is
	// the only one who maps, unmaps and writes, so it writes without mu.
	mu    sync.RWMutex
	m     []byte
	limit int64 // Options.SegmentSize

	// pins keeps f open while regions of it are being sent (see region.go).
	pins segmentPins
	// readErrs is the store's count of failed reads (Stats.ReadErrors), for the reads of
	// regions the transport makes.
	readErrs *atomic.Int64
}

// writeAt stores b at off (relative to the segment start).
func (seg *segment) writeAt(b []byte, off int64) error {
	if seg.m != nil {
		return guardedCopy(seg.m[off:off+int64(len(b))], b)
	}
	_, err := seg.f.WriteAt(b, off)
	return err
}

// readAt fills p from off (relative to the segment start).
func (seg *segment) readAt(p []byte, off int64) error {
	if off < 0 || off+int64(len(p)) > seg.size() {
		return fmt.Errorf("read segment %s: [%d, %d) is outside it: %w", seg.path, off, off+int64(len(p)), ErrNotFound)
	}
	seg.mu.RLock()
	if m := seg.m; m != nil {
		err := guardedCopy(p, m[off:off+int64(len(p))])
		seg.mu.RUnlock()
		return err
	}
	seg.mu.RUnlock()
	_, err := seg.f.ReadAt(p, off)
	return err
}

func (seg *segment) size() int64 { return seg.limit }

// unmap drops the mapping, waiting for readers that use it.
func (seg *segment) unmap() error {
	seg.mu.Lock()
	defer seg.mu.Unlock()
	if seg.m == nil {
		return nil
	}
	err := unmapSegment(seg.m)
	seg.m = nil
	if err != nil {
		return fmt.Errorf("unmap segment %s: %w", seg.path, err)
	}
	return nil
}

// guardedCopy copies between a mapping and memory, turning the SIGBUS an I/O error on a
// mapped page raises into an error (debug.SetPanicOnFault) instead of a crash.
func guardedCopy(dst, src []byte) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			err = fmt.Errorf("memory-mapped I/O fault: %v", r)
		}
	}()
	copy(dst, src)
	return nil
}

// activate makes seg the segment appends go to. In FlushAsync mode it is mapped, unless
// Options.DisableMmap.
//
// # Notes
//
// FlushSync keeps pwrite: there an fdatasync runs every few hundred microseconds, and each
// one write-protects the pages it wrote back, so the next append into the same page takes
// a write fault that waits for that page's writeback. Measured on ext4 with 1 KiB messages
// and 16-64 appenders, mapped appends reached only 50-70 % of pwrite's throughput.
func (s *Store) activate(seg *segment) error {
	if s.opts.FlushMode == FlushAsync && !s.opts.DisableMmap && seg.m == nil {
		m, err := mapSegment(seg.f, s.opts.SegmentSize)
		if err != nil {
			return fmt.Errorf("map segment %s: %w", seg.path, err)
		}
		seg.mu.Lock()
		seg.m = m
		seg.mu.Unlock()
	}
	s.active = seg
	s.activeSeg.Store(seg)
	signal(s.prefaultReq)
	return nil
}

func offsetName(off int64) string {
	s := strconv.FormatInt(off, 10)
	if len(s) >= offsetWidth {
		return s
	}
	var b [offsetWidth]byte
	for i := range b {
		b[i] = '0'
	}
	copy(b[offsetWidth-len(s):], s)
	return string(b[:])
}

func parseOffsetName(name string) (int64, bool) {
	if len(name) != offsetWidth {
		return 0, false
	}
	v, err := strconv.ParseInt(name, 10, 64)
	return v, err == nil && v >= 0
}

// createSegment creates the segment starting at start, sized and with its directory entry
// durable, so that a power cut cannot lose the file under data already fsynced into it.
func (s *Store) createSegment(start int64) (*segment, error) {
	path := filepath.Join(s.clDir, offsetName(start))
	f, err := s.fs.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create segment %s: %w", path, err)
	}
	if err := f.Truncate(s.opts.SegmentSize); err != nil {
		f.Close()
		return nil, fmt.Errorf("size segment %s: %w", path, err)
	}
	if err := s.fs.SyncDir(s.clDir); err != nil {
		f.Close()
		return nil, fmt.Errorf("create segment %s: sync dir: %w", path, err)
	}
	return &segment{start: start, path: path, f: f, limit: s.opts.SegmentSize, readErrs: &s.readErrors}, nil
}

// segmentFor returns the segment holding off, or nil if it was removed or not created yet.
func (s *Store) segmentFor(off int64) *segment {
	s.segMu.RLock()
	defer s.segMu.RUnlock()
	if len(s.segs) == 0 || off < s.segs[0].start {
		return nil
	}
	i := (off - s.segs[0].start) / s.opts.SegmentSize
	if i >= int64(len(s.segs)) {
		return nil
	}
	return s.segs[i]
}

func (s *Store) getEncBuf() *[]byte {
	if p, ok := s.encPool.Get().(*[]byte); ok {
		return p
	}
	b := make([]byte, 0, 4096)
	return &b
}

func (s *Store) putEncBuf(p *[]byte) {
	if cap(*p) <= encBufRetain {
		*p = (*p)[:0]
		s.encPool.Put(p)
	}
}

// encode appends m's stored form to dst with the store-assigned fields zero; PatchStored
// fills them in under the append lock.
func (s *Store) encode(dst []byte, m *protocol.MessageExt) ([]byte, error) {
	if !s.topicOK(m.Topic) || m.QueueID < 0 {
		return dst, fmt.Errorf("put to %q queue %d: %w", m.Topic, m.QueueID, ErrBadTopic)
	}
	if t := m.SysFlag & protocol.MsgTransactionMask; t == protocol.MsgTransactionPrepared || t == protocol.MsgTransactionRollback {
		return dst, fmt.Errorf("put to %q: sysFlag %#x: %w", m.Topic, m.SysFlag, ErrHalfMessage)
	}
	m.StoreHost = s.opts.StoreHost
	m.QueueOffset, m.CommitLogOffset, m.StoreTimestamp = 0, 0, 0
	start := len(dst)
	out, err := protocol.AppendStored(dst, m)
	if err != nil {
		return dst, fmt.Errorf("put to %q: %w: %w", m.Topic, ErrMessageTooLarge, err)
	}
	if n := len(out) - start; n > s.opts.MaxMessageSize {
		return dst, fmt.Errorf("put to %q: stored size %d exceeds %d: %w", m.Topic, n, s.opts.MaxMessageSize, ErrMessageTooLarge)
	}
	return out, nil
}

// Put appends one message to the commit log and returns where it went. The caller sets
// Topic, QueueID, Body, Properties, Flag, SysFlag, Born*, ReconsumeTimes and
// PreparedTransactionOffset; Put sets StoreHost, StoreTimestamp, QueueOffset,
// CommitLogOffset, StoreSize and BodyCRC in m.
//
// In FlushAsync mode Put returns once the message is in the page cache; in FlushSync mode
// only after an fsync covers it (group commit), or ErrFlushTimeout after
// Options.SyncFlushTimeout. ctx only cancels that wait: a message whose Put was canceled may
// still be stored and delivered. PutAsync is the same without a goroutine waiting.
func (s *Store) Put(ctx context.Context, m *protocol.MessageExt) (PutResult, error) {
	res, err := s.PutUnnamed(ctx, m)
	if res.Size > 0 {
		res.MsgID = protocol.OffsetMsgID(s.opts.StoreHost, res.CommitLogOffset)
	}
	return res, err
}

// PutUnnamed is Put without PutResult.MsgID, which it leaves empty; a result with Size > 0
// is a stored message (Put's result then carries a MsgID). A caller that only writes the id
// out (the broker's answer to a send) appends it with protocol.AppendOffsetMsgID from
// StoreHost and CommitLogOffset instead of building a string per message (about 6 % of
// Put's CPU in a one-producer profile, half of it the allocation).
func (s *Store) PutUnnamed(ctx context.Context, m *protocol.MessageExt) (PutResult, error) {
	bp := s.getEncBuf()
	defer s.putEncBuf(bp)
	b, err := s.encode((*bp)[:0], m)
	*bp = b
	if err != nil {
		return PutResult{}, err
	}
	ms := [1]*protocol.MessageExt{m}
	var res [1]PutResult
	if s.opts.FlushMode != FlushSync {
		// No waiter: its channel (and the waiter, which escapes through the queue) were
		// 3 % of the broker's CPU samples during async produce, for nothing to wait for.
		_, err := s.append(ms[:], b, res[:], nil)
		return res[0], err
	}
	w := flushWaiter{ch: make(chan error, 1)}
	waiting, err := s.appendWait(ms[:], b, res[:], &w)
	if err != nil {
		return PutResult{}, err
	}
	if waiting {
		err = s.awaitDurable(ctx, w.ch)
	}
	return res[0], err
}

// PutBatch appends ms contiguously, in order, within one segment, with one write and (in
// FlushSync mode) one fsync wait. Either every message is stored or none is. The messages may
// belong to different queues; each gets the next offset of its own queue.
func (s *Store) PutBatch(ctx context.Context, ms []*protocol.MessageExt) ([]PutResult, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	b, bp, err := s.encodeBatch(ms)
	if bp != nil {
		defer s.putEncBuf(bp)
	}
	if err != nil {
		return nil, err
	}
	res := make([]PutResult, len(ms))
	var w flushWaiter
	if s.opts.FlushMode == FlushSync {
		w.ch = make(chan error, 1)
	}
	waiting, err := s.appendWait(ms, b, res, &w)
	if err != nil {
		return nil, err
	}
	for i := range res {
		res[i].MsgID = protocol.OffsetMsgID(s.opts.StoreHost, res[i].CommitLogOffset)
	}
	if waiting {
		err = s.awaitDurable(ctx, w.ch)
	}
	return res, err
}

// encodeBatch encodes ms one after the other into a pooled buffer, which the caller hands
// back (putEncBuf) when bp is not nil.
func (s *Store) encodeBatch(ms []*protocol.MessageExt) (b []byte, bp *[]byte, err error) {
	bp = s.getEncBuf()
	b = (*bp)[:0]
	for _, m := range ms {
		if b, err = s.encode(b, m); err != nil {
			*bp = b
			return nil, bp, err
		}
	}
	*bp = b
	if int64(len(b)) > s.opts.SegmentSize-blankMin {
		return nil, bp, fmt.Errorf("put batch of %d messages: %d bytes do not fit one segment: %w", len(ms), len(b), ErrMessageTooLarge)
	}
	return b, bp, nil
}

// AppendReady reports whether appending size bytes (a stored message's size, or a bound
// on it) would most likely return without waiting for the disk: the store flushes
// asynchronously (a Put does not wait for an fsync), no write has failed, and the active
// segment has room for it (no roll, which creates and syncs a file). The broker serves such
// sends on the connection's read goroutine. It is a hint read without the append lock: a
// concurrent append may still make this one roll the segment.
func (s *Store) AppendReady(size int) bool {
	return s.opts.FlushMode == FlushAsync && s.PutAsyncReady(size)
}

// PutAsyncReady is AppendReady for PutAsync and PutBatchAsync: it reports whether one of
// them appending size bytes would most likely return without waiting for the disk, in
// either flush mode (in FlushSync mode PutAsync does not wait for the fsync either): no
// write has failed and the active segment has room for it (no roll). The broker serves
// such SYNC_FLUSH sends on the connection's read goroutine. A hint, like AppendReady.
func (s *Store) PutAsyncReady(size int) bool {
	if s.failure.Load() != nil {
		return false
	}
	seg := s.activeSeg.Load()
	return seg != nil && s.written.Load()+int64(size)+blankMin <= seg.start+s.opts.SegmentSize
}

// StoreHost is the address stamped into every stored message and its offsetMsgId
// (Options.StoreHost).
func (s *Store) StoreHost() netip.AddrPort { return s.opts.StoreHost }

// SyncFlush reports whether the store acknowledges an append only after an fsync covers it
// (FlushSync).
func (s *Store) SyncFlush() bool { return s.opts.FlushMode == FlushSync }

// append writes the encoded messages b (ms[i].StoreSize bytes each) at the end of the commit
// log and returns the new end. A non-nil w is queued for the group commit (FlushSync mode)
// with the results.
//
// # Notes
//
// The write happens under s.mu: positions must be handed out in file order, and the
// dispatcher reads [dispatched, written) assuming no holes. Encoding (the expensive part)
// happened before the lock, so concurrent appenders overlap their encoding with this write.
//
// Everything that need not be under s.mu is kept out of it (the clock is read before it,
// the other goroutines are woken after it): with several producers the lock is what they
// queue on, and on a busy machine a holder the kernel preempts stalls all of them for a
// scheduling slice, so the chance of that grows with the time the lock is held.
func (s *Store) append(ms []*protocol.MessageExt, b []byte, res []PutResult, w *flushWaiter) (int64, error) {
	end, crossed, err := s.appendLocked(ms, b, res, w, s.opts.Now().UnixMilli())
	if err != nil {
		return 0, err
	}
	signal(s.dispatchReq)
	if crossed {
		signal(s.prefaultReq)
	}
	s.appended()
	return end, nil
}

// appendLocked is append's part under s.mu; now is the store timestamp to give (raised to
// the last one given if the clock went back). crossed reports that the write position
// passed a multiple of prefaultStep, where the prefaulter is to be woken.
func (s *Store) appendLocked(ms []*protocol.MessageExt, b []byte, res []PutResult, w *flushWaiter, now int64) (end int64, crossed bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, false, ErrClosed
	}
	if err := s.writeFailure(); err != nil {
		return 0, false, err
	}
	if s.wpos+int64(len(b))+blankMin > s.active.start+s.opts.SegmentSize {
		if err := s.rollLocked(); err != nil {
			return 0, false, s.fail(err)
		}
	}
	if now < s.lastTs {
		now = s.lastTs // store timestamps never go backwards: OffsetByTimestamp bisects on them
	}
	s.lastTs = now
	pos := s.wpos
	off := 0
	for i, m := range ms {
		q := s.nextQueueOffsetLocked(qkey{m.Topic, m.QueueID})
		size := int(m.StoreSize)
		protocol.PatchStored(b[off:off+size], q, pos+int64(off), now)
		m.QueueOffset, m.CommitLogOffset, m.StoreTimestamp = q, pos+int64(off), now
		res[i] = PutResult{CommitLogOffset: pos + int64(off), QueueOffset: q, Size: m.StoreSize, StoreTimestamp: now}
		off += size
	}
	s.awaitZeroingLocked(pos + int64(len(b)))
	if err := s.active.writeAt(b, pos-s.active.start); err != nil {
		return 0, false, s.fail(fmt.Errorf("write segment %s at %d: %w", s.active.path, pos-s.active.start, err))
	}
	s.wpos = pos + int64(len(b))
	if w != nil {
		s.enqueueWaiterLocked(w, s.wpos, res)
	}
	s.written.Store(s.wpos)
	return s.wpos, pos/prefaultStep != s.wpos/prefaultStep, nil
}

// nextQueueOffsetLocked hands out k's next queue offset. A failed write fails the store, so
// an offset is never given back. The counters are pointers so that handing one out is one
// map lookup (hashing the topic), not a lookup and an assignment.
func (s *Store) nextQueueOffsetLocked(k qkey) int64 {
	p := s.qoff[k]
	if p == nil {
		p = new(int64)
		s.qoff[k] = p
	}
	q := *p
	*p = q + 1
	return q
}

// queueOffsetLocked is k's next queue offset (0 for a queue never appended to).
func (s *Store) queueOffsetLocked(k qkey) int64 {
	if p := s.qoff[k]; p != nil {
		return *p
	}
	return 0
}

// setQueueOffsetLocked sets k's next queue offset.
func (s *Store) setQueueOffsetLocked(k qkey, next int64) {
	if p := s.qoff[k]; p != nil {
		*p = next
		return
	}
	s.qoff[k] = &next
}

// rollLocked ends the active segment with the blank marker and starts the next one.
func (s *Store) rollLocked() error {
	seg := s.active
	end := seg.start + s.opts.SegmentSize
	var blank [blankMin]byte
	binary.BigEndian.PutUint32(blank[0:], uint32(end-s.wpos))
	binary.BigEndian.PutUint32(blank[4:], protocol.MagicBlank)
	s.awaitZeroingLocked(s.wpos + blankMin)
	if err := seg.writeAt(blank[:], s.wpos-seg.start); err != nil {
		return fmt.Errorf("write blank tail of segment %s: %w", seg.path, err)
	}
	next, err := s.createSegment(end)
	if err != nil {
		return err
	}
	if err := s.activate(next); err != nil {
		next.f.Close()
		return err
	}
	s.segMu.Lock()
	s.segs = append(s.segs, next)
	s.segMu.Unlock()
	s.wpos = end
	s.written.Store(end)
	// Readers of the old segment fall back to pread; its dirty pages stay in the page
	// cache for the flusher's fdatasync.
	if err := seg.unmap(); err != nil {
		s.log.Warn("unmap segment", "err", err)
	}
	return nil
}

// readLog reads len(p) bytes of the commit log at off; the range must lie within one segment
// and below written. It returns ErrNotFound if the segment is gone, and an error wrapping
// ErrReadFailed (counted in Stats.ReadErrors) if the file could not be read.
func (s *Store) readLog(p []byte, off int64) error {
	seg := s.segmentFor(off)
	if seg == nil {
		return fmt.Errorf("read commit log at %d: %w", off, ErrNotFound)
	}
	if err := seg.readAt(p, off-seg.start); err != nil {
		if s.segmentFor(off) == nil || errors.Is(err, ErrNotFound) { // removed under us, or outside it
			return fmt.Errorf("read commit log at %d: %w", off, ErrNotFound)
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return readFailure(&s.readErrors, fmt.Errorf("read segment %s at %d: %w", seg.path, off-seg.start, err))
	}
	return nil
}

// MessageAt returns a copy of the stored message that starts at commitLogOffset (from an
// offsetMsgId). It fails with ErrNotFound if there is no message starting exactly there.
func (s *Store) MessageAt(commitLogOffset int64) ([]byte, error) {
	off := commitLogOffset
	if off < s.minOffset.Load() || off+blankMin > s.written.Load() {
		return nil, fmt.Errorf("message at %d: %w", off, ErrNotFound)
	}
	var hdr [protocol.StoredPhysicalOffsetAt + 8]byte
	if off+int64(len(hdr)) > s.written.Load() {
		return nil, fmt.Errorf("message at %d: %w", off, ErrNotFound)
	}
	if err := s.readLog(hdr[:], off); err != nil {
		return nil, err
	}
	size := int64(int32(binary.BigEndian.Uint32(hdr[protocol.StoredTotalSizeAt:])))
	magic := binary.BigEndian.Uint32(hdr[protocol.StoredMagicAt:])
	phys := int64(binary.BigEndian.Uint64(hdr[protocol.StoredPhysicalOffsetAt:]))
	segEnd := off - off%s.opts.SegmentSize + s.opts.SegmentSize // segments start at multiples of SegmentSize
	if magic != protocol.MagicV1 || phys != off || size < int64(len(hdr)) || off+size > segEnd || off+size > s.written.Load() {
		return nil, fmt.Errorf("message at %d: no message starts there: %w", off, ErrNotFound)
	}
	b := make([]byte, size)
	if err := s.readLog(b, off); err != nil {
		return nil, err
	}
	return b, nil
}
