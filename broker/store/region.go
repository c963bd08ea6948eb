package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
)

// Region is a stretch of one commit-log segment that a pull answers with: the stored bytes
// of one message, or of several that are adjacent in the log. GetRegions hands them out so
// that the transport can send them from the file (sendfile) instead of copying them through
// memory.
type Region struct {
	// File reads the segment; Offset is relative to its start. It stays open, with the same
	// bytes, until the GetResult that holds the region is released, even if retention
	// deletes the segment meanwhile.
	File SegmentFile
	// Offset is where the region starts in File; Length is how many bytes it has.
	Offset, Length int64
}

// SegmentFile is what a Region reads from: a commit-log segment.
//
// ReadAt copies (from the segment's memory mapping while it is the active one, else with
// pread). SyscallConn is the raw descriptor of the segment's file, which sendfile(2) reads
// from; it fails with ErrNoDescriptor when the store's file system does not expose one (the
// fault-injecting vfs), and the caller then copies with ReadAt. Bytes written through the
// active segment's mapping are in the page cache, which is what sendfile reads, so both ways
// give the same bytes.
type SegmentFile interface {
	io.ReaderAt
	syscall.Conn
}

// ErrNoDescriptor is returned by SegmentFile.SyscallConn when the segment's file has no
// operating-system descriptor.
var ErrNoDescriptor = errors.New("segment file has no descriptor")

// ReadAt reads len(p) bytes at off (relative to the segment start). A failed read wraps
// ErrReadFailed and counts in Stats.ReadErrors, as the store's own reads do.
func (seg *segment) ReadAt(p []byte, off int64) (int, error) {
	if err := seg.readAt(p, off); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		err = fmt.Errorf("read segment %s at %d: %w", seg.path, off, err)
		if seg.readErrs != nil && !errors.Is(err, ErrNotFound) {
			err = readFailure(seg.readErrs, err)
		}
		return 0, err
	}
	return len(p), nil
}

// SyscallConn returns the raw descriptor of the segment's file, for sendfile.
func (seg *segment) SyscallConn() (syscall.RawConn, error) {
	sc, ok := seg.f.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("segment %s: %w", seg.path, ErrNoDescriptor)
	}
	return sc.SyscallConn()
}

// segmentPins counts the regions of a segment being sent. A segment that retention (or
// Close) retires while it is pinned keeps its file open until the last pin goes: the file is
// already unlinked, but an open descriptor keeps its bytes, so a send in progress never
// reads another file's bytes or fails half-way through a frame.
type segmentPins struct {
	mu      sync.Mutex
	n       int
	retired bool
}

// pin keeps seg's file open until unpin. It fails once seg is retired.
func (seg *segment) pin() bool {
	seg.pins.mu.Lock()
	defer seg.pins.mu.Unlock()
	if seg.pins.retired {
		return false
	}
	seg.pins.n++
	return true
}

func (seg *segment) unpin() {
	seg.pins.mu.Lock()
	seg.pins.n--
	last := seg.pins.retired && seg.pins.n == 0
	seg.pins.mu.Unlock()
	if last {
		_ = seg.f.Close() // the store is done with it; nobody is left to tell
	}
}

// retire closes seg's file, at once or when its last pin goes. The segment must already be
// out of Store.segs, so that no new reader finds it.
func (seg *segment) retire() error {
	seg.pins.mu.Lock()
	seg.pins.retired = true
	now := seg.pins.n == 0
	seg.pins.mu.Unlock()
	if now {
		return seg.f.Close()
	}
	return nil
}

// GetRegions is GetMessage for a pull answered from the files: when f has no Match (no
// filter on the messages' content: SQL92, Wasm), the result carries Regions of the commit
// log instead of Messages, and nothing is read from the log. Units are selected exactly as
// GetMessage selects them (tag codes, batch caps, NextBeginOffset), so the regions'
// concatenation is byte for byte the body GetMessage would give. With f.Match set it is
// GetMessage: the filter needs the bytes anyway.
//
// The segments of the regions are pinned until Release: call it once the regions were sent.
//
// Unlike GetMessage, a region is not checked against the size and magic at the start of its
// messages (that would mean reading them); the consume queue is trusted, as RocketMQ trusts
// it when it transfers a pull from the file.
func (s *Store) GetRegions(ctx context.Context, topic string, queueID int32, offset int64, maxMsgs, maxBytes int, f *Filter) (*GetResult, error) {
	return s.getMessage(ctx, topic, queueID, offset, maxMsgs, maxBytes, f, true)
}

// readRegions turns every unit it gives into a region of r: the read of GetRegions, which
// reads nothing from the log.
func (it *unitIter) readRegions(r *GetResult) (*GetResult, error) {
	rb := regionBatch{s: it.s, regions: make([]Region, 0, it.countRoom())}
	for u, ok := it.next(); ok; u, ok = it.next() {
		if it.settle(u, rb.add(u.off, u.size)) {
			it.take(u.size, u.inDisk)
		}
	}
	if err := it.end(r); err != nil {
		for _, seg := range rb.pins {
			seg.unpin()
		}
		return nil, err
	}
	r.Regions, r.pins = rb.regions, rb.pins
	return r, nil
}

// regionBatch is a batch of GetRegions: its regions, the segments they pin, and the last
// one pinned.
type regionBatch struct {
	s       *Store
	regions []Region
	pins    []*segment
	seg     *segment
}

// add adds the message at off (size bytes) to the batch as a region, pinning its segment.
func (b *regionBatch) add(off int64, size int) error {
	seg := b.seg
	if seg == nil || off < seg.start || off+int64(size) > seg.start+seg.limit {
		if off < b.s.minOffset.Load() {
			return fmt.Errorf("region at %d: %w", off, ErrNotFound)
		}
		seg = b.s.segmentFor(off)
		if seg == nil || off+int64(size) > seg.start+seg.limit || !seg.pin() {
			return fmt.Errorf("region at %d: %w", off, ErrNotFound)
		}
		b.pins = append(b.pins, seg)
		b.seg = seg
	}
	rel := off - seg.start
	if n := len(b.regions); n > 0 && b.regions[n-1].File == seg && b.regions[n-1].Offset+b.regions[n-1].Length == rel {
		b.regions[n-1].Length += int64(size)
	} else {
		b.regions = append(b.regions, Region{File: seg, Offset: rel, Length: int64(size)})
	}
	return nil
}
