package flowd

import "encoding/binary"

// The encodings of plugins/ABI.md, apart from the exports that move them across the
// boundary: plain functions over byte slices, with no package state and no wasm directive,
// so that they build and are tested natively against the golden vectors the host's tests
// check too (plugins/testdata/abi-golden.json).

// decodeParams adds flowd_init's parameters to into; false for malformed input.
func decodeParams(b []byte, into map[string]string) bool {
	r := reader{b: b}
	count := r.u32()
	for range count {
		k := r.str16()
		v := r.bytes32()
		if r.bad {
			return false
		}
		into[string(k)] = string(v)
	}
	return !r.bad
}

// decodeMessages decodes n records into dst (grown as needed) and returns it; false for
// malformed input. The messages' slices are views into b.
//
// It is written out by hand, without the reader's methods: in Go compiled to Wasm every
// call that is not inlined costs tens of nanoseconds, and a record has nine fields.
func decodeMessages(dst []Message, b []byte, n int32) ([]Message, bool) {
	if n < 0 {
		return dst[:0], false
	}
	if cap(dst) < int(n) {
		dst = make([]Message, n)
	}
	dst = dst[:n]
	le := binary.LittleEndian
	off := 0
	for i := range dst {
		if len(b)-off < 4 {
			return dst, false
		}
		size := int(le.Uint32(b[off:]))
		off += 4
		if size < recordFixed || len(b)-off < size {
			return dst, false
		}
		rec := b[off : off+size : off+size]
		off += size
		m := &dst[i]
		m.QueueID = int32(le.Uint32(rec))
		m.QueueOffset = int64(le.Uint64(rec[4:]))
		m.StoreTimestamp = int64(le.Uint64(rec[12:]))
		p := 20
		var ok bool
		if m.Topic, p, ok = field16(rec, p); !ok {
			return dst, false
		}
		if m.Tags, p, ok = field16(rec, p); !ok {
			return dst, false
		}
		if m.Keys, p, ok = field16(rec, p); !ok {
			return dst, false
		}
		if m.Properties, p, ok = field32(rec, p); !ok {
			return dst, false
		}
		if m.Body, _, ok = field32(rec, p); !ok {
			return dst, false
		}
	}
	return dst, off == len(b)
}

// recordFixed is the size of a record's fixed fields after its length.
const recordFixed = 4 + 8 + 8 + 2 + 2 + 2 + 4 + 4

// field16 reads a u16-prefixed field at b[p:]; small enough to be inlined.
func field16(b []byte, p int) ([]byte, int, bool) {
	if len(b)-p < 2 {
		return nil, p, false
	}
	n := int(b[p]) | int(b[p+1])<<8
	p += 2
	if len(b)-p < n {
		return nil, p, false
	}
	return b[p : p+n : p+n], p + n, true
}

// field32 reads a u32-prefixed field at b[p:].
func field32(b []byte, p int) ([]byte, int, bool) {
	if len(b)-p < 4 {
		return nil, p, false
	}
	n := int(uint32(b[p]) | uint32(b[p+1])<<8 | uint32(b[p+2])<<16 | uint32(b[p+3])<<24)
	p += 4
	if len(b)-p < n {
		return nil, p, false
	}
	return b[p : p+n : p+n], p + n, true
}

// filterBitmap runs keep over msgs and returns the filter's result: ceil(n/8) bytes, bit
// i%8 of byte i/8 set for a kept message, bits past n clear. It reuses buf when it has
// room, and never returns a slice without capacity, whose pointer would be 0.
func filterBitmap(buf []byte, msgs []Message, keep func(Message) bool) []byte {
	size := (len(msgs) + 7) / 8
	if cap(buf) < max(size, 1) {
		buf = make([]byte, max(size, 64))
	}
	bm := buf[:size]
	clear(bm)
	for i := range msgs {
		if keep(msgs[i]) {
			bm[i>>3] |= 1 << (i & 7)
		}
	}
	return bm
}

// appendOutputs appends what a transform made of one message: the count, then each
// output's tags, keys, properties and body.
func appendOutputs(out []byte, outs []Output) []byte {
	le := binary.LittleEndian
	out = le.AppendUint32(out, uint32(len(outs)))
	for _, o := range outs {
		out = le.AppendUint16(out, uint16(len(o.Tags)))
		out = append(out, o.Tags...)
		out = le.AppendUint16(out, uint16(len(o.Keys)))
		out = append(out, o.Keys...)
		out = le.AppendUint32(out, uint32(len(o.Properties)))
		out = append(out, o.Properties...)
		out = le.AppendUint32(out, uint32(len(o.Body)))
		out = append(out, o.Body...)
	}
	return out
}

// appendOwners appends an allocator's result: one i32 member index per queue.
func appendOwners(out []byte, owners []int32) []byte {
	for _, o := range owners {
		out = binary.LittleEndian.AppendUint32(out, uint32(o))
	}
	return out
}

// decodeInput decodes an allocator's input into in, reusing its slices; false for
// malformed input. The slices it sets are views into b.
func decodeInput(in *Input, b []byte) bool {
	r := reader{b: b}
	in.Group = r.str16()
	nq := int(r.u32())
	if r.bad || nq > len(b)/8 {
		return false
	}
	if cap(in.Queues) < nq {
		in.Queues = make([]Queue, nq)
	}
	in.Queues = in.Queues[:nq]
	for i := range in.Queues {
		q := &in.Queues[i]
		q.Topic = r.str16()
		q.Broker = r.str16()
		q.QueueID = int32(r.u32())
	}
	nm := int(r.u32())
	if r.bad || nm > len(b)/12 {
		return false
	}
	if cap(in.Members) < nm {
		in.Members = make([]Member, nm)
	}
	in.Members = in.Members[:nm]
	labels := in.labels[:0]
	for i := range in.Members {
		m := &in.Members[i]
		m.ID = r.str16()
		m.Weight = r.u32()
		m.Room = r.str16()
		nl := int(r.u32())
		if r.bad || nl > len(b)/4 {
			return false
		}
		from := len(labels)
		for range nl {
			k := r.str16()
			v := r.str16()
			labels = append(labels, Label{Key: k, Value: v})
		}
		m.Labels = labels[from:len(labels):len(labels)]
	}
	in.labels = labels
	// labels may have been reallocated while growing: point members at the final array.
	off := 0
	for i := range in.Members {
		nl := len(in.Members[i].Labels)
		in.Members[i].Labels = labels[off : off+nl : off+nl]
		off += nl
	}
	np := int(r.u32())
	if r.bad || (np != 0 && np != nq) {
		return false
	}
	if cap(in.Previous) < np {
		in.Previous = make([]int32, np)
	}
	in.Previous = in.Previous[:np]
	for k := range in.Previous {
		in.Previous[k] = int32(r.u32())
	}
	return !r.bad && r.off == len(b)
}

// reader decodes little-endian fields; bad records the first overrun.
type reader struct {
	b   []byte
	off int
	bad bool
}

func (r *reader) need(n int) bool {
	if r.bad || n < 0 || len(r.b)-r.off < n {
		r.bad = true
		return false
	}
	return true
}

func (r *reader) u32() uint32 {
	if !r.need(4) {
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b[r.off:])
	r.off += 4
	return v
}

func (r *reader) str16() []byte {
	if !r.need(2) {
		return nil
	}
	n := int(binary.LittleEndian.Uint16(r.b[r.off:]))
	r.off += 2
	if !r.need(n) {
		return nil
	}
	r.off += n
	return r.b[r.off-n : r.off : r.off]
}

func (r *reader) bytes32() []byte {
	n := int(r.u32())
	if !r.need(n) {
		return nil
	}
	r.off += n
	return r.b[r.off-n : r.off : r.off]
}
