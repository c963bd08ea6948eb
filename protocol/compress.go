package protocol

import (
	"bytes"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
)

// ErrBodyTooLarge is returned when a compressed body inflates past the caller's limit.
var ErrBodyTooLarge = errors.New("decompressed body too large")

// ErrBadCompressedBody wraps zlib's errors for a body that does not inflate.
var ErrBadCompressedBody = errors.New("bad compressed body")

// DefaultCompressLevel is the zlib level RocketMQ clients use by default.
const DefaultCompressLevel = 5

// CompressBody zlib-compresses body, as a producer does before setting MsgFlagCompressed.
// level is a compress/zlib level (zlib.HuffmanOnly … zlib.BestCompression).
//
// Each call builds a zlib writer, which costs about a megabyte of allocation at levels above
// zero; a producer that compresses often should keep a Compressor instead.
func CompressBody(body []byte, level int) ([]byte, error) {
	c, err := NewCompressor(level)
	if err != nil {
		return nil, err
	}
	return c.Compress(nil, body)
}

// DecompressBody inflates a zlib-compressed body. It fails with ErrBodyTooLarge as soon as the
// output would exceed limit bytes. The output buffer grows by doubling and never past limit
// bytes, so a small "zip bomb" cannot make it allocate more. limit <= 0 means MaxFrameSize.
func DecompressBody(b []byte, limit int) ([]byte, error) {
	var d Decompressor
	return d.Decompress(nil, b, limit)
}

// Compressor compresses message bodies, reusing its zlib state between calls. The zero value
// is not usable; make one with NewCompressor. A Compressor is not safe for concurrent use.
type Compressor struct {
	level int
	buf   bytes.Buffer
	w     *zlib.Writer
}

// NewCompressor returns a Compressor at the given zlib level.
func NewCompressor(level int) (*Compressor, error) {
	w, err := zlib.NewWriterLevel(nil, level)
	if err != nil {
		return nil, fmt.Errorf("compress body: level %d: %w", level, err)
	}
	return &Compressor{level: level, w: w}, nil
}

// Compress appends the zlib compression of body to dst.
func (c *Compressor) Compress(dst, body []byte) ([]byte, error) {
	c.buf.Reset()
	c.w.Reset(&c.buf)
	if _, err := c.w.Write(body); err != nil {
		return dst, fmt.Errorf("compress body: %w", err)
	}
	if err := c.w.Close(); err != nil {
		return dst, fmt.Errorf("compress body: %w", err)
	}
	out := append(dst, c.buf.Bytes()...)
	if c.buf.Cap() > 4<<20 {
		c.buf = bytes.Buffer{} // do not pin a buffer sized for one huge body
	}
	return out, nil
}

// Decompressor inflates message bodies, reusing its zlib state between calls. The zero value
// is ready to use. A Decompressor is not safe for concurrent use.
type Decompressor struct {
	src bytes.Reader
	r   io.ReadCloser
}

// Decompress appends the inflation of the zlib stream b to dst; see DecompressBody for limit.
// Bytes after the end of the zlib stream are ignored, as Java's Inflater does. On error it
// returns dst unchanged.
func (d *Decompressor) Decompress(dst, b []byte, limit int) ([]byte, error) {
	if limit <= 0 {
		limit = MaxFrameSize
	}
	d.src.Reset(b)
	var err error
	if d.r == nil {
		d.r, err = zlib.NewReader(&d.src)
	} else {
		err = d.r.(zlib.Resetter).Reset(&d.src, nil)
	}
	if err != nil {
		d.r = nil // a failed NewReader returns nil; a failed Reset leaves the reader unusable
		return dst, fmt.Errorf("%w: %w", ErrBadCompressedBody, err)
	}
	orig, start := dst, len(dst)
	// Start from a guess (bodies compress 2–10×), never above the limit, and grow by
	// doubling up to the limit. Once the output fills the limit, a one-byte probe read tells
	// whether there is more, so the buffer never grows past the limit.
	dst = reserve(dst, min(max(4*len(b), 512), limit))
	for {
		produced := len(dst) - start
		if produced == limit {
			var probe [1]byte
			n, rerr := io.ReadFull(d.r, probe[:])
			switch {
			case n > 0:
				return orig, fmt.Errorf("%w: inflates past the limit of %d bytes (from %d compressed)", ErrBodyTooLarge, limit, len(b))
			case rerr == io.EOF:
				return dst, nil
			default:
				return orig, fmt.Errorf("%w: %w", ErrBadCompressedBody, rerr)
			}
		}
		end := min(cap(dst), start+limit)
		if len(dst) == end {
			grow := max(produced, 512)
			if produced+grow > limit/4*3 {
				grow = limit - produced // the last step goes straight to the limit
			}
			dst = reserve(dst, min(grow, limit-produced))
			end = min(cap(dst), start+limit)
		}
		n, rerr := d.r.Read(dst[len(dst):end])
		dst = dst[:len(dst)+n]
		if rerr == io.EOF {
			return dst, nil
		}
		if rerr != nil {
			return orig, fmt.Errorf("%w: %w", ErrBadCompressedBody, rerr)
		}
	}
}

// reserve returns dst with room for at least n more bytes, allocating exactly that much when
// it must grow (append's growth policy could overshoot a caller's limit).
func reserve(dst []byte, n int) []byte {
	if cap(dst)-len(dst) >= n {
		return dst
	}
	b := make([]byte, len(dst), len(dst)+n)
	copy(b, dst)
	return b
}

// UncompressedBody returns m's body, inflated when MsgFlagCompressed is set in SysFlag; see
// DecompressBody for limit. m is not modified.
func (m *MessageExt) UncompressedBody(limit int) ([]byte, error) {
	if m.SysFlag&MsgFlagCompressed == 0 {
		return m.Body, nil
	}
	return DecompressBody(m.Body, limit)
}
