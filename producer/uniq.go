package producer

import (
	"crypto/rand"
	"encoding/binary"
	"net/netip"
	"os"
	"sync/atomic"
	"time"
)

// uniqGen makes message ids in RocketMQ's UNIQ_KEY shape: 32 upper-case hex digits of 16
// bytes, a fixed prefix of the client IPv4 address (4 bytes), the process id (2) and a random
// number drawn per producer (4; RocketMQ uses a class loader's hash), then the milliseconds
// since the start of the month (4) and a counter (2).
type uniqGen struct {
	prefix  [20]byte // hex of the fixed 10 bytes
	counter atomic.Uint32
	// month is the current month's span, so that an id costs no calendar arithmetic
	// (time.Date per id was about 1 % of a producer's CPU); replaced when a send falls out
	// of it.
	month atomic.Pointer[monthSpan]
}

// monthSpan is [start, end) of one month in local time.
type monthSpan struct{ start, end time.Time }

const hexDigits = "0123456789ABCDEF"

func newUniqGen(ip string) *uniqGen {
	var raw [10]byte
	if a, err := netip.ParseAddr(ip); err == nil && a.Unmap().Is4() {
		b := a.Unmap().As4()
		copy(raw[:4], b[:])
	}
	binary.BigEndian.PutUint16(raw[4:], uint16(os.Getpid()))
	_, _ = rand.Read(raw[6:])
	g := &uniqGen{}
	for i, c := range raw {
		g.prefix[2*i] = hexDigits[c>>4]
		g.prefix[2*i+1] = hexDigits[c&0xF]
	}
	return g
}

func (g *uniqGen) next() string {
	now := time.Now()
	m := g.month.Load()
	if m == nil || now.Before(m.start) || !now.Before(m.end) {
		start := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, now.Location())
		m = &monthSpan{start: start, end: start.AddDate(0, 1, 0)}
		g.month.Store(m)
	}
	var raw [6]byte
	binary.BigEndian.PutUint32(raw[:], uint32(now.Sub(m.start).Milliseconds()))
	binary.BigEndian.PutUint16(raw[4:], uint16(g.counter.Add(1)))
	var out [32]byte
	copy(out[:], g.prefix[:])
	for i, c := range raw {
		out[20+2*i] = hexDigits[c>>4]
		out[20+2*i+1] = hexDigits[c&0xF]
	}
	return string(out[:])
}
