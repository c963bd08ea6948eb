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
	month   atomic.Pointer[monthSpan] // the current month, computed once a month, not per id
}

// monthSpan is a month of local time, in Unix milliseconds: [start, end).
type monthSpan struct{ start, end int64 }

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

// uniqLen is the length of a message id.
const uniqLen = 32

func (g *uniqGen) next() string {
	var out [uniqLen]byte
	g.fill(&out)
	return string(out[:])
}

// fill writes the next id into out.
func (g *uniqGen) fill(out *[uniqLen]byte) {
	now := time.Now()
	ms := now.UnixMilli()
	m := g.month.Load()
	if m == nil || ms < m.start || ms >= m.end {
		start := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, now.Location())
		m = &monthSpan{start: start.UnixMilli(), end: start.AddDate(0, 1, 0).UnixMilli()}
		g.month.Store(m)
	}
	var raw [6]byte
	binary.BigEndian.PutUint32(raw[:], uint32(ms-m.start))
	binary.BigEndian.PutUint16(raw[4:], uint16(g.counter.Add(1)))
	copy(out[:], g.prefix[:])
	for i, c := range raw {
		out[20+2*i] = hexDigits[c>>4]
		out[20+2*i+1] = hexDigits[c&0xF]
	}
}
