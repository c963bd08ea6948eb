package remoting

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
)

// maxSendfileChunk bounds one sendfile(2) call (Linux transfers at most 0x7ffff000 bytes).
const maxSendfileChunk = 1 << 30

// socketRaw is the raw connection sendfile writes to: nc's, if nc is a TCP connection.
func socketRaw(nc net.Conn) syscall.RawConn {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nil
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	return raw
}

// sendFile sends n bytes of the file src from off to the socket dst with sendfile(2), waiting
// (under the connection's write deadline) whenever the socket buffer is full. The file's own
// offset is not used, so that concurrent sends from one file do not interfere.
//
// handled is false, with nothing sent, when the kernel cannot sendfile from this file (its
// file system does not support it): the caller then copies.
func sendFile(dst, src syscall.RawConn, off, n int64) (handled bool, err error) {
	var written int64
	var serr error
	// Control holds a reference on the file's descriptor for the whole send: a Close racing
	// with it is deferred, and the descriptor number cannot be reused meanwhile.
	cerr := src.Control(func(sfd uintptr) {
		werr := dst.Write(func(dfd uintptr) bool {
			for written < n {
				o := off + written
				m, err := syscall.Sendfile(int(dfd), int(sfd), &o, int(min(n-written, maxSendfileChunk)))
				if m > 0 {
					written += int64(m)
				}
				switch {
				case err == syscall.EINTR:
				case err == syscall.EAGAIN:
					return false // the socket buffer is full: wait until it drains
				case err != nil:
					serr = os.NewSyscallError("sendfile", err)
					return true
				case m == 0:
					serr = io.ErrUnexpectedEOF // the file ends before the region does
					return true
				}
			}
			return true
		})
		if serr == nil {
			serr = werr
		}
	})
	if cerr != nil {
		return written > 0, cerr
	}
	if written == 0 && (errors.Is(serr, syscall.EINVAL) || errors.Is(serr, syscall.ENOSYS) || errors.Is(serr, syscall.EOPNOTSUPP)) {
		return false, nil
	}
	return true, serr
}
