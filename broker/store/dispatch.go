package store

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"runtime"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// minStoredSize is the smallest possible stored message: every fixed field, IPv4 hosts, an
// empty body, a one-byte topic and no properties.
const minStoredSize = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + 1 + 1 + 2

// msgInfo is what dispatch needs from a stored message. topic and props alias the log bytes.
type msgInfo struct {
	size        int32
	queueID     int32
	queueOffset int64
	phys        int64
	storeTs     int64
	topic       []byte
	props       []byte
}

// parseStored walks one stored message b (exactly TOTALSIZE bytes) expected at commit-log
// offset pos. It checks what a torn or stale write would break: the magic code, that the
// fields add up to TOTALSIZE, that PHYSICALOFFSET is pos, and (if checkCRC) the body CRC.
// It does not allocate.
func parseStored(b []byte, pos int64, checkCRC bool) (msgInfo, error) {
	var m msgInfo
	if len(b) < minStoredSize {
		return m, fmt.Errorf("%d bytes is shorter than any message", len(b))
	}
	total := int32(binary.BigEndian.Uint32(b))
	if int(total) != len(b) {
		return m, fmt.Errorf("TOTALSIZE %d, expected %d", total, len(b))
	}
	if magic := binary.BigEndian.Uint32(b[4:]); magic != protocol.MagicV1 {
		return m, fmt.Errorf("bad magic code 0x%08X", magic)
	}
	m.size = total
	crc := binary.BigEndian.Uint32(b[protocol.StoredBodyCRCAt:])
	m.queueID = int32(binary.BigEndian.Uint32(b[protocol.StoredQueueIDAt:]))
	m.queueOffset = int64(binary.BigEndian.Uint64(b[protocol.StoredQueueOffsetAt:]))
	m.phys = int64(binary.BigEndian.Uint64(b[protocol.StoredPhysicalOffsetAt:]))
	if m.phys != pos {
		return m, fmt.Errorf("PHYSICALOFFSET %d, expected %d (stale data)", m.phys, pos)
	}
	sysFlag := int32(binary.BigEndian.Uint32(b[protocol.StoredSysFlagAt:]))
	p := protocol.StoredBornHostAt + hostLen(sysFlag, protocol.MsgFlagBornHostV6)
	m.storeTs = int64(binary.BigEndian.Uint64(b[p:]))
	p += 8 + hostLen(sysFlag, protocol.MsgFlagStoreHostV6) + 4 + 8
	if p+4 > len(b) {
		return m, fmt.Errorf("truncated before BODYLEN")
	}
	bodyLen := int(int32(binary.BigEndian.Uint32(b[p:])))
	p += 4
	if bodyLen < 0 || p+bodyLen+1 > len(b) {
		return m, fmt.Errorf("BODYLEN %d overruns TOTALSIZE %d", bodyLen, total)
	}
	body := b[p : p+bodyLen]
	p += bodyLen
	topicLen := int(b[p])
	p++
	if topicLen == 0 || p+topicLen+2 > len(b) {
		return m, fmt.Errorf("TOPICLEN %d overruns TOTALSIZE %d", topicLen, total)
	}
	m.topic = b[p : p+topicLen]
	p += topicLen
	propLen := int(binary.BigEndian.Uint16(b[p:]))
	p += 2
	if p+propLen != len(b) {
		return m, fmt.Errorf("fields end at %d, TOTALSIZE is %d", p+propLen, total)
	}
	m.props = b[p:]
	if checkCRC {
		if c := crc32.ChecksumIEEE(body) & 0x7FFFFFFF; c != crc {
			return m, fmt.Errorf("body CRC 0x%08X, stored 0x%08X", c, crc)
		}
	}
	return m, nil
}

func hostLen(sysFlag, v6 int32) int {
	if sysFlag&v6 != 0 {
		return 20
	}
	return 8
}

// StoredProperties returns the raw property block (key\x01value\x02…) of a stored message,
// aliasing stored, for filters that look at a property or two without decoding the message.
func StoredProperties(stored []byte) ([]byte, error) {
	if len(stored) < 8 {
		return nil, fmt.Errorf("stored message of %d bytes: %w", len(stored), protocol.ErrMalformedMessage)
	}
	m, err := parseStored(stored, int64(binary.BigEndian.Uint64(stored[protocol.StoredPhysicalOffsetAt:min(len(stored), protocol.StoredPhysicalOffsetAt+8)])), false)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", protocol.ErrMalformedMessage, err)
	}
	return m.props, nil
}

// pendingUnits are consume-queue units for one queue, contiguous from first.
type pendingUnits struct {
	q     *consumeQueue
	first int64
	buf   []byte
}

// dispatcher turns parsed messages into consume-queue units, batching the writes per queue.
// It is used by the dispatch loop and by recovery; it is not safe for concurrent use.
type dispatcher struct {
	s      *Store
	notify bool // call Options.OnDispatch (not during recovery)
	buf    []byte
	pend   map[*consumeQueue]*pendingUnits
	order  []*pendingUnits
	free   []*pendingUnits
	events []DispatchEvent
	count  int64
}

func newDispatcher(s *Store, notify bool) *dispatcher {
	return &dispatcher{s: s, notify: notify && s.opts.OnDispatch != nil, buf: make([]byte, 1<<20), pend: make(map[*consumeQueue]*pendingUnits)}
}

func (d *dispatcher) add(m *msgInfo) error {
	q, err := d.s.queueOrCreate(m.topic, m.queueID)
	if err != nil {
		return err
	}
	var tc int64
	tags, hasTags := protocol.FindProperty(m.props, protocol.PropertyTags)
	if hasTags {
		tc = protocol.TagsCode(string(tags))
	}
	p := d.pend[q]
	if p != nil && p.first+int64(len(p.buf)/cqUnitSize) != m.queueOffset {
		if err := d.s.index.commit(); err != nil { // keys before units, as in commit
			return err
		}
		if err := d.writeOne(p); err != nil {
			return err
		}
	}
	if p == nil || len(p.buf) == 0 {
		if p == nil {
			if n := len(d.free); n > 0 {
				p, d.free = d.free[n-1], d.free[:n-1]
			} else {
				p = &pendingUnits{}
			}
			p.q = q
			d.pend[q] = p
			d.order = append(d.order, p)
		}
		p.first = m.queueOffset
	}
	p.buf = appendUnit(p.buf, m.phys, m.size, tc)
	d.s.index.add(m)
	d.count++
	if d.notify {
		d.events = append(d.events, DispatchEvent{
			Topic: q.topic, QueueID: q.qid, QueueOffset: m.queueOffset, CommitLogOffset: m.phys,
			Size: m.size, TagsCode: tc, StoreTimestamp: m.storeTs,
		})
	}
	return nil
}

func (d *dispatcher) writeOne(p *pendingUnits) error {
	if len(p.buf) == 0 {
		return nil
	}
	err := d.s.writeUnits(p.q, p.first, p.buf)
	p.first += int64(len(p.buf) / cqUnitSize)
	p.buf = p.buf[:0]
	return err
}

// commit writes the pending units, publishes dispatched = upTo and notifies.
func (d *dispatcher) commit(upTo int64) error {
	// Index first: whoever sees a queue's new max offset can also look its messages up by key.
	if err := d.s.index.commit(); err != nil {
		return err
	}
	for _, p := range d.order {
		if err := d.writeOne(p); err != nil {
			return err
		}
		delete(d.pend, p.q)
		p.q = nil
		d.free = append(d.free, p)
	}
	d.order = d.order[:0]
	// Units are readable now (writeUnits published each queue's max). The callbacks run
	// before dispatched moves, so that whoever waits for dispatched (Close, DeleteTopic,
	// tests) also knows the callbacks for it have run.
	if d.notify {
		for i := range d.events {
			d.s.opts.OnDispatch(d.events[i])
			d.events[i] = DispatchEvent{}
		}
	}
	d.events = d.events[:0]
	d.s.dispatched.Store(upTo)
	d.s.notifyDispatch()
	return nil
}

// dispatchBatchWait is how long the dispatcher waits after a pass that found at least
// dispatchBatchBytes before it looks again, so that under load it dispatches batches instead
// of one message per wake-up (RocketMQ's reput service sleeps 1 ms per loop, whatever the
// load). A smaller pass means the writer is not busy: the dispatcher goes back to waiting
// for the next append and dispatches it at once, so a lone message is not held for the
// batch wait. Nor is any message while a reader waits for one (Options.DispatchAwaited):
// a busy pass is most often a burst, and holding back then delayed the rest of the burst
// by the wait (1 ms, 2 ms and more once the timer's wake-up was late on a loaded machine),
// which fell on the send-to-poll tail (flowd bench at 10 000 msg/s: up to 118 holds of
// about 3 ms in a 2-second run).
const (
	dispatchBatchWait  = time.Millisecond
	dispatchBatchBytes = 64 << 10
)

// dispatchLoop builds consume queues behind the writer until Close.
func (s *Store) dispatchLoop() {
	defer s.wg.Done()
	d := newDispatcher(s, true)
	broken := false
	run := func() bool {
		if broken {
			return false
		}
		from := s.dispatched.Load()
		if err := s.dispatchAvailable(d); err != nil {
			broken = true
			s.fail(fmt.Errorf("dispatch: %w", err))
		}
		return s.dispatched.Load()-from >= dispatchBatchBytes
	}
	t := time.NewTimer(0)
	<-t.C
	for {
		select {
		case <-s.dispatchReq:
			// Let the appenders that are ready to run append first. Woken by every append,
			// the dispatcher would otherwise pass over one or two messages at a time under
			// load, and each pass costs a write per queue and two to the key index (1.5
			// messages a pass in BenchmarkSendAsync; about 14 with the yield). A lone
			// message is not delayed: with nothing else to run, the yield returns at once.
			runtime.Gosched()
			if !run() {
				continue
			}
			if awaited := s.opts.DispatchAwaited; awaited != nil && awaited() {
				continue
			}
			s.dispatchHolds.Add(1)
			t.Reset(dispatchBatchWait)
			select {
			case <-t.C:
				signal(s.dispatchReq) // look again even if nothing signaled
			case <-s.stop:
				run()
				return
			}
		case <-s.stop:
			run() // Close set closed under s.mu first, so written is final
			return
		}
	}
}

// dispatchAvailable dispatches everything in [dispatched, written).
func (s *Store) dispatchAvailable(d *dispatcher) error {
	S := s.opts.SegmentSize
	for {
		from, to := s.dispatched.Load(), s.written.Load()
		if from >= to {
			return nil
		}
		segEnd := from - from%S + S
		n := min(to, segEnd) - from
		n = min(n, int64(len(d.buf)))
		b := d.buf[:n]
		if err := s.readLog(b, from); err != nil {
			return err
		}
		p, stop, reason, err := walkMessages(b, from, segEnd, false, d.add)
		switch {
		case err != nil:
			return err
		case stop == walkBad || stop == walkZero:
			// Everything below written was written whole: this is not a torn tail.
			if reason == "" {
				reason = "zeros where a message should start"
			}
			return fmt.Errorf("commit log at %d: %s", from+p, reason)
		case stop == walkNeedMore && p == 0:
			if n == min(to, segEnd)-from {
				return fmt.Errorf("commit log at %d: a message runs past the written end %d", from, to)
			}
			// One message larger than the buffer: read it again with a bigger one.
			d.buf = make([]byte, int32(binary.BigEndian.Uint32(b)))
			continue
		}
		next := from + p
		if stop == walkBlank {
			next = segEnd
		}
		if err := d.commit(next); err != nil {
			return err
		}
	}
}
