package remoting

// The reader: the connection's read goroutine reads one frame at a time. A response goes to
// the call waiting for it, a request to admission; a frame that arrived whole but whose
// header cannot be read is answered where it can be (badHeader) and the stream goes on; any
// other read error ends the loop, and with it the connection (run).
//
// Invariants: only this goroutine touches the read buffer (br); frameStart is non-zero only
// while a frame that was not buffered whole is being read; activity grows by one per frame
// read; a body lent from the read buffer is valid until the next read, so it is copied out
// unless its request is served inline.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// readLoop reads and hands on frames until a read fails, and returns why: run closes the
// connection with it.
func (c *Conn) readLoop() error {
	// spare is decoded into: a response handed to an InvokeAsyncRaw receiver is done with
	// when InvokeDone returns, so the next frame reuses it (one Command per answered send
	// less); any other frame is kept by whoever it went to, and the next gets a new one.
	var spare *protocol.Command
	for {
		// Wait for a frame's first byte with no clock running: between frames, only the idle
		// timeout applies.
		if _, err := c.br.Peek(1); err != nil {
			return fmt.Errorf("read: %w", err)
		}
		started := !c.frameBuffered()
		if started {
			c.frameStart.Store(1 + int64(time.Since(c.cfg.epoch)))
		}
		var cmd *protocol.Command
		var lent bool
		var err error
		// Responses are read with their fields raw: deliver builds the map for the callers
		// that read it, and those of InvokeAsyncRaw skip it.
		if spare == nil {
			spare = new(protocol.Command)
		}
		cmd, lent, err = protocol.ReadFrameWith(c.br, protocol.ReadOptions{
			Max: c.cfg.maxFrame, RawExt: c.cfg.rawExt, RawResponses: true, Lend: c.cfg.lend, Into: spare,
		})
		if cmd == spare {
			spare = nil
		}
		if started {
			c.frameStart.Store(0)
		}
		if err != nil {
			var he *protocol.HeaderError
			if !errors.As(err, &he) {
				return fmt.Errorf("read: %w", err)
			}
			// The frame was whole: the stream is intact, and only this request is lost.
			c.activity.Add(1)
			c.badHeader(he)
			continue
		}
		c.activity.Add(1)
		if cmd.IsResponse() {
			if lent {
				cmd.Body = bytes.Clone(cmd.Body)
			}
			if c.deliver(cmd) {
				spare = cmd
			}
			continue
		}
		c.dispatch(cmd, lent)
	}
}

// frameBuffered reports whether the next frame is in the read buffer whole, so that reading
// it cannot stall. Most frames are: then the frame costs no clock reading.
func (c *Conn) frameBuffered() bool {
	n := c.br.Buffered()
	if n < 4 {
		return false
	}
	p, _ := c.br.Peek(4) // buffered: does not block
	size := int64(int32(binary.BigEndian.Uint32(p)))
	return size >= 0 && size <= int64(n-4)
}

// badHeader answers a frame that arrived whole but whose header could not be read, and keeps
// the connection: other requests on it are fine, and a peer that sent one bad header (a field
// of an unexpected type, say) should get an answer rather than lose every call it has pending.
//
// A request whose opaque is known is answered INVALID_PARAMETER with the decoding error as
// the remark. A response whose opaque is known completes the waiting call with a
// SYSTEM_ERROR response saying why. Without the opaque there is nobody to answer: an answer
// with a guessed opaque could complete some other call, so the frame is only logged.
func (c *Conn) badHeader(he *protocol.HeaderError) {
	switch {
	case !he.OpaqueKnown:
		c.log.Warn("dropping frame with an unreadable header and no opaque", "err", he)
	case he.IsResponse():
		c.log.Warn("response with an unreadable header", "opaque", he.Opaque, "err", he)
		c.deliver(&protocol.Command{
			Code: int32(protocol.SystemError), Language: protocol.LangGo, Version: protocol.Version,
			Opaque: he.Opaque, Flag: protocol.FlagResponse, Serialize: he.Serialize,
			Remark: "unreadable response header: " + he.Error(), ExtFields: map[string]string{},
		})
	case he.IsOneway():
		c.log.Warn("dropping oneway request with an unreadable header", "code", protocol.RequestCode(he.Code), "err", he)
	default:
		c.log.Debug("answering request with an unreadable header", "code", protocol.RequestCode(he.Code), "opaque", he.Opaque, "err", he)
		req := &protocol.Command{Code: he.Code, Opaque: he.Opaque, Serialize: he.Serialize}
		c.respond(req, protocol.NewResponse(req, protocol.InvalidParameter, he.Error()))
	}
}
