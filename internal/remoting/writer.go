package remoting

// The writer hand-off. Frames are queued under qmu. The writer is a caller of writeFrame
// that found no write under way, a caller handed its batch's lead token, or the flusher
// handed the kick token (by queueCommand, whose callers wait for no write, or by a writer
// that finds only such frames queued). It takes every frame queued by then, writes them as
// one batch under wmu, and then clears writing (nothing was queued meanwhile), goes on (the
// flusher), or hands the queue on: to a caller waiting for the next batch (lead), else to
// the flusher (kick).
//
// Invariants: there is one writer at a time (writing is set, under qmu, from the moment one
// is chosen until it finds the queue empty); kick and lead hold one token each, so handing
// on never blocks; a queued frame leaves in exactly one batch, whose done is closed once it
// is written or has failed, unless the connection closed first; qmu is never held during a
// write; the flusher is only started under qmu on an open connection.

import (
	"fmt"
	"net"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// Buffer sizes of the writer.
const (
	// maxGatheredWrite is the most a batch of frames is copied into one buffer for a single
	// write; a larger batch is written with writev, frame by frame.
	maxGatheredWrite = 256 << 10
	// maxPooledFrame is the largest encode buffer kept for reuse: one large pull response must
	// not pin megabytes per connection for its lifetime. It holds a producer's batch of
	// 256 KiB (WithAsyncBatching's usual bound) with its header.
	maxPooledFrame = 260 << 10
	// maxKeptQueueBuffer is the largest buffer of queued frames kept for the next batch. It
	// holds what a producer's 256 sends of 1 KiB in flight queue at once (about 300 KiB):
	// below that, every such batch grew a new buffer by doubling, copying its frames again at
	// each step. An idle connection of the server sheds both buffers (shed).
	maxKeptQueueBuffer = 1 << 20
	// minWritevFrame: a batch holding a frame this large is written with writev rather than
	// copied into one buffer, whatever its total.
	minWritevFrame = 32 << 10
)

// queuedFrame is an encoded frame waiting to be written, with the pooled buffer it lives in.
// A frame with regions is only its header in frame (with the regions counted in its length);
// release is then called once it has been written or has failed.
type queuedFrame struct {
	bp      *[]byte
	frame   []byte
	regions []FileRegion
	release func()
	// inBuf: the frame is qbuf[lo:hi] of its batch (bp and frame are nil until the writer
	// takes the batch and slices frame out of it).
	inBuf  bool
	lo, hi int
}

// writeBatch is the outcome of one write, shared by the callers whose frames it carried.
type writeBatch struct {
	// done is closed once the batch has been written or has failed; err and written are set
	// before.
	done    chan struct{}
	err     error
	written bool
	// lead hands the batch to one of its callers, who writes it: the writer before it sends
	// one token when it finishes and finds this batch queued.
	lead chan struct{}
}

// writeCommand encodes cmd and writes it. written is false only when nothing of cmd reached
// the socket because the connection was already closed; an encoding error is returned as is
// and leaves the connection open; any other error closes the connection and wraps
// ErrConnClosed.
func (c *Conn) writeCommand(cmd *protocol.Command) (written bool, err error) {
	return c.writeFrame(cmd, nil, nil)
}

// writeFrame is writeCommand for a command whose body is regions of files (none: cmd.Body).
// release, if not nil, is called once whatever happens.
func (c *Conn) writeFrame(cmd *protocol.Command, regions []FileRegion, release func()) (written bool, err error) {
	var qf queuedFrame
	if len(regions) > 0 {
		bp := c.cfg.getFrame()
		frame, err := cmd.AppendFrame((*bp)[:0])
		if err == nil {
			if err = appendRegionsLength(frame, regions); err != nil {
				err = fmt.Errorf("encode %s: %w", cmd, err)
			}
		}
		if err != nil {
			c.cfg.putFrame(bp, frame)
			if release != nil {
				release()
			}
			return false, err
		}
		qf = queuedFrame{bp: bp, frame: frame, regions: regions, release: release}
		c.qmu.Lock()
		select {
		case <-c.done:
			c.qmu.Unlock()
			c.cfg.putFrame(bp, frame)
			if release != nil {
				release()
			}
			return false, c.err
		default:
		}
	} else {
		c.qmu.Lock()
		select {
		case <-c.done:
			c.qmu.Unlock()
			if release != nil {
				release()
			}
			return false, c.err
		default:
		}
		if qf, err = c.encodeQueuedLocked(cmd); err != nil {
			c.qmu.Unlock()
			if release != nil {
				release()
			}
			return false, err
		}
		qf.release = release
	}
	c.queue = append(c.queue, qf)
	b := c.qbatch
	if b == nil {
		b = &writeBatch{done: make(chan struct{}), lead: make(chan struct{}, 1)}
		c.qbatch = b
	}
	if c.writing {
		// Whoever writes now (a caller or the flusher) writes our frame next or hands its
		// batch to one of us.
		c.qmu.Unlock()
		// A write is under way: ours leaves with the next one, written by whichever caller
		// of this batch is handed it.
		select {
		case <-b.done:
			return b.written, b.err
		case <-b.lead:
		}
	} else {
		c.writing = true
		c.qmu.Unlock()
	}
	c.writeQueued(false)
	<-b.done // closed by writeQueued: our frame was in the batch it wrote
	return b.written, b.err
}

// queueCommand encodes cmd and queues it for the flusher, without waiting for the write. An
// encoding error is returned as is; a closed connection returns its error and queues nothing.
// A failing write later closes the connection, which fails the calls pending on it.
func (c *Conn) queueCommand(cmd *protocol.Command) error {
	c.qmu.Lock()
	select {
	case <-c.done:
		c.qmu.Unlock()
		return c.err
	default:
	}
	qf, err := c.encodeQueuedLocked(cmd)
	if err != nil {
		c.qmu.Unlock()
		return err
	}
	c.queue = append(c.queue, qf)
	if !c.writing {
		c.writing = true
		c.kickFlusherLocked()
	}
	c.qmu.Unlock()
	return nil
}

// encodeQueuedLocked encodes cmd at the end of qbuf and returns its queue entry, or the
// encoding error, leaving qbuf as it was; qmu must be held. Encoding under the lock holds
// up others queueing on the connection for the encoding's time, a microsecond for a 1 KiB
// send; their frames leave in the same write anyway.
func (c *Conn) encodeQueuedLocked(cmd *protocol.Command) (queuedFrame, error) {
	if c.qbuf == nil {
		c.qbuf, c.qspare = c.qspare[:0], nil
	}
	lo := len(c.qbuf)
	buf, err := cmd.AppendFrame(c.qbuf) // on error, c.qbuf[:lo]
	if err != nil {
		return queuedFrame{}, err
	}
	c.qbuf = buf
	return queuedFrame{inBuf: true, lo: lo, hi: len(buf)}, nil
}

// flusherIdle is how long a flusher without work waits before it ends; the next queued frame
// starts another. A busy connection keeps its flusher, an idle one (most of a broker's) costs
// no goroutine.
const flusherIdle = 5 * time.Second

// kickFlusherLocked hands the queue to the flusher, which becomes the writer, starting it if
// it is not running. qmu must be held, and the caller must be the writer (or have just set
// writing). On a closed connection nobody writes any more: the queue is dropped (the close
// fails the calls whose frames they were).
func (c *Conn) kickFlusherLocked() {
	select {
	case <-c.done:
		for i := range c.queue {
			if f := c.queue[i]; f.bp != nil {
				c.cfg.putFrame(f.bp, f.frame)
			}
			c.queue[i] = queuedFrame{}
		}
		c.queue = c.queue[:0]
		c.qbuf = c.qbuf[:0]
		c.writing = false
		return
	default:
	}
	if !c.flusher {
		// Only here, under qmu on an open connection: run's barrier relies on it.
		c.flusher = true
		c.flushing.Add(1)
		go c.flushLoop()
	}
	c.kick <- struct{}{} // buffered, one token: there is one writer
}

// flushLoop is the flusher: each token on kick makes it the writer until the queue is empty.
// It ends after flusherIdle without a token, or when the connection closes.
func (c *Conn) flushLoop() {
	defer c.flushing.Done()
	idle := time.NewTimer(flusherIdle)
	defer idle.Stop()
	for {
		select {
		case <-c.kick:
		case <-c.done:
			select {
			case <-c.kick: // handed the queue as the connection closed: release its callers
			default:
				return
			}
		case <-idle.C:
			c.qmu.Lock()
			if len(c.kick) == 0 { // tokens are only sent under qmu: none can come now
				c.flusher = false
				c.qmu.Unlock()
				return
			}
			c.qmu.Unlock()
			<-c.kick
		}
		for c.writeQueued(true) {
		}
		idle.Reset(flusherIdle)
	}
}

// queuedFrames is how many frames wait for the next write.
func (c *Conn) queuedFrames() int {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	return len(c.queue)
}

// writeQueued writes every frame queued now as one batch. If frames were queued meanwhile,
// the flusher (flusher true) reports that it goes on writing them; a calling writer hands
// them on to a caller waiting for the next batch, or, when none waits (only InvokeAsync
// frames), to the flusher. The caller must be the writer (it set writing, received the
// batch's lead token, or is the flusher handed the kick token).
func (c *Conn) writeQueued(flusher bool) (again bool) {
	c.qmu.Lock()
	frames, b, buf := c.queue, c.qbatch, c.qbuf
	c.queue, c.qbatch = c.spare[:0], nil
	c.spare = nil
	c.qbuf = nil // the next frame takes qspare, or a new buffer
	c.qmu.Unlock()

	written, err := c.writeFrames(frames, buf)
	for i := range frames {
		if f := frames[i]; f.bp != nil {
			c.cfg.putFrame(f.bp, f.frame)
		}
		if frames[i].release != nil {
			frames[i].release()
		}
		frames[i] = queuedFrame{}
	}

	c.qmu.Lock()
	c.spare = frames[:0]
	// Both buffers are kept (but not a large one): a buffer dropped is grown again, by
	// doubling, with the next frames.
	switch {
	case cap(buf) > maxKeptQueueBuffer:
	case c.qbuf == nil:
		c.qbuf = buf[:0]
	case cap(buf) > cap(c.qspare):
		c.qspare = buf[:0]
	}
	switch {
	case len(c.queue) == 0:
		c.writing = false
	case flusher:
		again = true
	case c.qbatch != nil:
		c.qbatch.lead <- struct{}{} // buffered, one token per batch: we stay the writer until it is taken
	default:
		c.kickFlusherLocked() // only frames nobody waits for: the flusher takes them
	}
	c.qmu.Unlock()
	if b != nil {
		b.written, b.err = written, err
		close(b.done)
	}
	return again
}

// writeFrames writes frames to the socket with one system call where it can (large batches
// may take more), under the write lock.
func (c *Conn) writeFrames(frames []queuedFrame, buf []byte) (written bool, err error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	select {
	case <-c.done:
		return false, c.err
	default:
	}
	if wt := c.cfg.writeTimeout; wt > 0 {
		// Re-arming the deadline costs a runtime timer update; doing it only when less than
		// 7/8 of the timeout is left keeps it off the path of back-to-back writes.
		if now := time.Now(); c.wdeadline.Sub(now) < wt-wt/8 {
			c.wdeadline = now.Add(wt)
			_ = c.nc.SetWriteDeadline(c.wdeadline)
		}
	}
	total, largest := 0, 0
	regions, inBuf := false, 0
	for i := range frames {
		f := &frames[i]
		if f.inBuf {
			f.frame = buf[f.lo:f.hi]
			inBuf++
		}
		total += len(f.frame)
		largest = max(largest, len(f.frame))
		regions = regions || len(f.regions) > 0
	}
	switch {
	case inBuf == len(frames):
		// All encoded in place, in order: buf is the batch, written as it is.
		_, err = c.nc.Write(buf)
	case regions:
		err = c.writeWithRegions(frames)
	case len(frames) == 1:
		_, err = c.nc.Write(frames[0].frame)
	case total <= maxGatheredWrite && largest < minWritevFrame:
		// Gathered into one buffer: one write on any net.Conn, and small frames cost less to
		// copy than to describe to writev one by one.
		buf := c.wbuf[:0]
		for _, f := range frames {
			buf = append(buf, f.frame...)
		}
		_, err = c.nc.Write(buf)
		if cap(buf) <= maxGatheredWrite {
			c.wbuf = buf[:0]
		}
	default:
		bufs := make(net.Buffers, len(frames))
		for i, f := range frames {
			bufs[i] = f.frame
		}
		_, err = bufs.WriteTo(c.nc) // writev on a TCP connection
	}
	if err != nil {
		c.closeWithErr(fmt.Errorf("write: %w", err))
		return true, c.err
	}
	return true, nil
}
