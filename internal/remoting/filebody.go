package remoting

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"syscall"

	"github.com/flowd-io/flowd/protocol"
)

// FileRegion is part of a file that a response body is sent from.
type FileRegion struct {
	// File is where the bytes are. When it also implements syscall.Conn (an *os.File does)
	// and the connection is TCP on Linux, regions of at least ServerOptions.SendfileThreshold
	// bytes go from the file to the socket with sendfile(2): from the page cache, without
	// passing through this process. Otherwise, or when SyscallConn fails, they are read with
	// ReadAt into the connection's write buffer.
	File io.ReaderAt
	// Offset is where the region starts in File; Length is how many bytes it has.
	Offset, Length int64
}

// DefaultSendfileThreshold is the default ServerOptions.SendfileThreshold.
//
// A sendfile(2) call costs more than copying a few kilobytes: each is a system call that
// splices the pages into the socket and, TCP_NODELAY being set, pushes a segment. A region of
// one small message is cheaper to copy into the batch's one write. See docs/PERFORMANCE.md
// for the measurements behind the figure.
const DefaultSendfileThreshold = 16 << 10

// RespondWithFiles makes resp, which the Handler serving ctx is about to return, go out with
// regions as its body: the frame is resp's header followed by the regions' bytes in order,
// written in turn with the other frames of the connection. resp.Body must be empty. release
// (which may be nil) is called exactly once, when the regions are no longer needed: after
// the frame was written, when the connection closed first, or when the Handler returns
// another response (a panic's SYSTEM_ERROR, say).
//
// It returns false, and keeps nothing, when ctx is not a Handler's context of this package
// (a test calling the Handler directly), resp has a body, or the request was deferred (use
// Deferred.RespondFiles): the caller must then put the bytes in resp.Body itself, and release
// is not called.
//
// A region that cannot be read completely when it is written (the file shrank, an I/O error)
// leaves the peer a truncated frame: the connection is closed, as for a failed write. The
// caller must therefore keep the regions' bytes stable until release.
func RespondWithFiles(ctx context.Context, resp *protocol.Command, regions []FileRegion, release func()) bool {
	rc, ok := ctx.Value(requestCtxKey{}).(*requestCtx)
	if !ok || len(resp.Body) != 0 || rc.deferred || rc.state.Load() == reqFinished {
		return false
	}
	if rc.fileResp != nil && rc.fileRelease != nil {
		rc.fileRelease() // replaced by this one
	}
	rc.fileResp, rc.fileRegions, rc.fileRelease = resp, regions, release
	return true
}

// appendRegionsLength makes frame, encoded without a body, announce the regions as its body.
func appendRegionsLength(frame []byte, regions []FileRegion) error {
	total := int64(binary.BigEndian.Uint32(frame))
	for _, r := range regions {
		if r.Length < 0 || r.Offset < 0 {
			return fmt.Errorf("file region [%d, +%d) is invalid", r.Offset, r.Length)
		}
		total += r.Length
	}
	if total > protocol.MaxFrameSize {
		return fmt.Errorf("frame of %d bytes exceeds %d: %w", total, protocol.MaxFrameSize, protocol.ErrFrameTooLarge)
	}
	binary.BigEndian.PutUint32(frame, uint32(total))
	return nil
}

// regionWriter writes a batch of frames some of which have file regions, in order: bytes are
// gathered into the connection's write buffer and written when a region is sent from its
// file, when the buffer is full, and at the end.
type regionWriter struct {
	c   *Conn
	buf []byte
}

func (w *regionWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	_, err := w.c.nc.Write(w.buf)
	w.buf = w.buf[:0]
	return err
}

// bytes appends b, writing large ones straight from where they are.
func (w *regionWriter) bytes(b []byte) error {
	if len(b) > maxGatheredWrite {
		if err := w.flush(); err != nil {
			return err
		}
		_, err := w.c.nc.Write(b)
		return err
	}
	if len(w.buf)+len(b) > maxGatheredWrite {
		if err := w.flush(); err != nil {
			return err
		}
	}
	w.buf = append(w.buf, b...)
	return nil
}

func (w *regionWriter) region(r FileRegion) error {
	if w.c.raw != nil && w.c.cfg.sendfileMin >= 0 && r.Length >= w.c.cfg.sendfileMin {
		if sc, ok := r.File.(syscall.Conn); ok {
			if src, err := sc.SyscallConn(); err == nil {
				if err := w.flush(); err != nil {
					return err
				}
				handled, err := sendFile(w.c.raw, src, r.Offset, r.Length)
				if handled || err != nil {
					return err
				}
			}
		}
	}
	// Copy through the buffer, a buffer's worth at a time.
	off, left := r.Offset, r.Length
	for left > 0 {
		room := maxGatheredWrite - len(w.buf)
		if room <= 0 {
			if err := w.flush(); err != nil {
				return err
			}
			room = maxGatheredWrite
		}
		n := int(min(left, int64(room)))
		at := len(w.buf)
		w.buf = slices.Grow(w.buf, n)[:at+n]
		if _, err := r.File.ReadAt(w.buf[at:], off); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("read file region at %d: %w", off, err)
		}
		off += int64(n)
		left -= int64(n)
	}
	return nil
}

// writeWithRegions is writeFrames for a batch in which some frames have file regions.
func (c *Conn) writeWithRegions(frames []queuedFrame) error {
	w := regionWriter{c: c, buf: c.wbuf[:0]}
	var err error
	for _, f := range frames {
		if err = w.bytes(f.frame); err != nil {
			break
		}
		for _, r := range f.regions {
			if err = w.region(r); err != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	if err == nil {
		err = w.flush()
	}
	if cap(w.buf) <= 2*maxGatheredWrite {
		c.wbuf = w.buf[:0]
	}
	return err
}
