package store

import (
	"context"
	"fmt"
	"slices"
)

// readFiltered reads the units it gives in windows and hands each window to f.Match as one
// batch, taking what it keeps (see GetMessage): the read with a batch filter.
func (it *unitIter) readFiltered(ctx context.Context, r *GetResult) (*GetResult, error) {
	bp := it.s.getReadBuf()
	rd := batchReader{s: it.s, buf: (*bp)[:0]}
	win := it.s.getWindow()
	defer it.s.putWindow(win)
	for {
		win.start(it, &rd)
		u, ok := it.next()
		for ok && !win.full(u.size) {
			at, err := rd.get(it.units, u, win.maxCount-len(win.ents), it.byteRoom(u.inDisk))
			if it.settle(u, err) {
				win.add(windowEntry{cqUnit: u, at: at})
			}
			u, ok = it.next()
		}
		if ok {
			it.back(u) // the window is full: u opens the next one
		}
		if len(win.ents) == 0 || it.decide(ctx, win, &rd) {
			break
		}
	}
	if err := it.end(r); err != nil {
		it.s.putReadBuf(bp, rd.buf)
		return nil, err
	}
	rd.result(r, bp)
	return r, nil
}

// decide hands the window to f.Match and takes what it keeps into the batch. It reports
// whether the read stops: at a match the batch cannot take, or at the window's first
// candidate when a FailClosed filter failed.
func (it *unitIter) decide(ctx context.Context, win *filterWindow, rd *batchReader) bool {
	keep, err := win.decide(ctx, it, rd)
	if err != nil {
		first := it.offset(win.ents[0].idx)
		if ctx.Err() == nil && it.f.OnError == FailOpen {
			it.s.log.Warn("message filter failed; delivering its batch (fail-open)", "topic", it.topic, "queue", it.queueID, "offset", first, "messages", len(win.ents), "err", err)
			for k := range keep {
				keep[k] = true
			}
		} else {
			// Hold the queue at the window's first message: nothing of it was decided.
			if ctx.Err() != nil {
				err = ctx.Err()
			} else {
				err = fmt.Errorf("%w: %s/%d at %d: %w", ErrFilterFailed, it.topic, it.queueID, first, err)
			}
			it.stop(win.ents[0].idx, err)
			return true
		}
	}
	rejected := false
	for k, ok := range keep {
		if !ok {
			rejected = true
			it.reject()
			continue
		}
		e := win.ents[k]
		if it.full(e.size, e.inDisk) {
			it.stop(e.idx, nil) // evaluated but not taken: the next read starts here
			return true
		}
		rd.accept(e.at, e.size)
		it.take(e.size, e.inDisk)
	}
	if rejected {
		rd.compact(win.bufStart, win.spanStart)
	}
	win.grow++
	return false
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

// windowEntry is a candidate: its unit, and where its message is in the batch reader's
// buffer.
type windowEntry struct {
	cqUnit
	at int
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
func (w *filterWindow) start(it *unitIter, rd *batchReader) {
	w.ents = w.ents[:0]
	w.bytes = 0
	g := min(w.grow, maxWindowGrowth)
	w.maxCount, w.maxBytes = max(it.countRoom(), 1)<<g, max(it.byteRoom(false), 1)<<g
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

// decide hands the window to it's f.Match as one batch. A panic in it is an error of the
// batch, so a faulty filter fails its reads instead of the broker.
func (w *filterWindow) decide(ctx context.Context, it *unitIter, rd *batchReader) (keep []bool, err error) {
	n := len(w.ents)
	w.cands = slices.Grow(w.cands[:0], n)[:n]
	w.keep = slices.Grow(w.keep[:0], n)[:n]
	for k, e := range w.ents {
		w.cands[k] = Candidate{
			Topic: it.topic, QueueID: it.queueID, QueueOffset: it.offset(e.idx), TagsCode: e.tagCode,
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
	if err := it.f.Match.MatchBatch(ctx, w.cands, w.keep); err != nil {
		return w.keep, err
	}
	return w.keep, nil
}
