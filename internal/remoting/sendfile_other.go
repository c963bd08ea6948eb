//go:build !linux

package remoting

import (
	"net"
	"syscall"
)

// socketRaw returns nil: sendfile is used on Linux only, file regions are copied elsewhere.
func socketRaw(net.Conn) syscall.RawConn { return nil }

func sendFile(dst, src syscall.RawConn, off, n int64) (handled bool, err error) {
	return false, nil
}
