package broker

import (
	"time"

	"github.com/flowd-io/flowd/internal/remoting"
)

// TransportConfig tunes the connections of the broker's listener. The zero value of every
// field means its documented default. The transport itself is internal: these are the
// settings of it an embedding program may choose.
type TransportConfig struct {
	// MaxFrameSize is the largest frame accepted, length prefix excluded. A peer that
	// announces a larger one is disconnected before anything is allocated for it.
	// Default (and upper limit): protocol.MaxFrameSize, 16 MiB.
	MaxFrameSize int

	// MaxInFlightPerConn bounds the requests served at once on one connection. A request
	// beyond it is answered SYSTEM_BUSY ("too many requests in flight on this connection")
	// at once; a oneway request beyond it is dropped and logged. A parked long-polling pull
	// counts against MaxParkedPerConn instead until it is answered.
	// Default: 256.
	MaxInFlightPerConn int

	// MaxParkedPerConn bounds the pulls parked at once on one connection (long polling): a
	// consumer parks one per queue it reads from this broker. A pull beyond it is answered
	// at once instead of waiting for messages.
	// Default: 4096.
	MaxParkedPerConn int

	// MaxConns caps the connections open at once. A connection accepted beyond it is closed
	// at once, with a Warn log line; the others are not affected.
	// Default: 10000. Negative: no cap.
	MaxConns int

	// FrameReadTimeout bounds how long one frame may take to arrive, from its first byte to
	// its last, so that a peer cannot hold a partly received frame (and its buffer) for
	// ever. At the default, a 16 MiB frame must arrive at about 560 KB/s.
	// Default: 30 s. Negative: none.
	FrameReadTimeout time.Duration

	// IdleTimeout closes a connection on which nothing has happened for this long: no frame
	// received, no request being served, no call waiting for its response. RocketMQ clients
	// heartbeat every 30 s, so the default only closes connections whose client is gone
	// without a FIN.
	// Default: 120 s. Negative: never.
	IdleTimeout time.Duration

	// WriteTimeout bounds each write to a connection. A peer that stops reading for this long
	// is disconnected rather than allowed to hold its responses in memory.
	// Default: 10 s. Negative: none.
	WriteTimeout time.Duration

	// SendfileThreshold is the smallest region of a commit-log file sent with sendfile(2) in
	// a zero-copy pull answer (see Config.DisableZeroCopy); shorter regions are copied into
	// the connection's write buffer, which costs less than a system call each. It applies on
	// Linux, to TCP connections.
	// Default: 16 KiB. Negative: always copy.
	SendfileThreshold int64
}

// serverOptions is the transport's form of t; the broker adds its logger and hooks.
func (t TransportConfig) serverOptions() remoting.ServerOptions {
	return remoting.ServerOptions{
		MaxFrameSize:       t.MaxFrameSize,
		MaxInFlightPerConn: t.MaxInFlightPerConn,
		MaxParkedPerConn:   t.MaxParkedPerConn,
		MaxConns:           t.MaxConns,
		FrameReadTimeout:   t.FrameReadTimeout,
		IdleTimeout:        t.IdleTimeout,
		WriteTimeout:       t.WriteTimeout,
		SendfileThreshold:  t.SendfileThreshold,
	}
}
