//go:build wasip1

package flowd

import (
	"encoding/binary"
	"errors"
	"unsafe"
)

// The ABI's exports. Only a wasip1 build has them; the rest of the package builds anywhere,
// so plugins type-check (go vet ./...) on the host too.

func ptrOf(b []byte) int32 {
	if cap(b) == 0 {
		return 0
	}
	return int32(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}

// view returns the input the host wrote at p: always within the buffer flowd_alloc
// returned. Anything else is bad input (nil).
func view(p, n int32) []byte {
	if n <= 0 || p != ptrOf(inbuf) || int(n) > len(inbuf) {
		return nil
	}
	return inbuf[:n]
}

func packed(b []byte) int64 {
	return int64(uint64(uint32(ptrOf(b)))<<32 | uint64(uint32(len(b))))
}

//go:wasmexport flowd_abi_version
func exportABIVersion() int32 { return ABIVersion }

//go:wasmexport flowd_alloc
func exportAlloc(size int32) int32 {
	if size < 0 {
		return 0
	}
	if cap(inbuf) < int(size) || cap(inbuf) == 0 {
		inbuf = make([]byte, max(int(size), 16))
	}
	return ptrOf(inbuf)
}

//go:wasmexport flowd_init
func exportInit(p, n int32) int32 {
	r := reader{b: view(p, n)}
	count := r.u32()
	for range count {
		k := r.str16()
		v := r.bytes32()
		if r.bad {
			return int32(CodeInput)
		}
		params[string(k)] = string(v)
	}
	if r.bad {
		return int32(CodeInput)
	}
	if initFn != nil {
		if err := initFn(); err != nil {
			var c Code
			if errors.As(err, &c) {
				return int32(c)
			}
			return int32(CodeParams)
		}
	}
	return 0
}

//go:wasmexport flowd_filter
func exportFilter(p, n, count int32) int32 {
	if filterFn == nil {
		return int32(CodeUnsupported)
	}
	if !decodeMessages(view(p, n), count) {
		return int32(CodeInput)
	}
	size := (int(count) + 7) / 8
	if cap(outbuf) < max(size, 1) {
		outbuf = make([]byte, max(size, 64))
	}
	bm := outbuf[:size]
	clear(bm)
	for i := range msgs {
		if filterFn(msgs[i]) {
			bm[i>>3] |= 1 << (i & 7)
		}
	}
	return ptrOf(outbuf)
}

//go:wasmexport flowd_transform
func exportTransform(p, n, count int32) int64 {
	if transformFn == nil {
		return int64(CodeUnsupported)
	}
	if !decodeMessages(view(p, n), count) {
		return int64(CodeInput)
	}
	out := outbuf[:0]
	le := binary.LittleEndian
	for i := range msgs {
		outs := transformFn(msgs[i])
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
	}
	outbuf = out
	return packed(out)
}

//go:wasmexport flowd_allocate
func exportAllocate(p, n int32) int64 {
	if allocFn == nil {
		return int64(CodeUnsupported)
	}
	if !decodeInput(view(p, n)) {
		return int64(CodeInput)
	}
	owners, err := allocFn(in)
	if err != nil {
		var c Code
		if errors.As(err, &c) && c < 0 {
			return int64(c)
		}
		return int64(CodeGeneric)
	}
	out := outbuf[:0]
	for _, o := range owners {
		out = binary.LittleEndian.AppendUint32(out, uint32(o))
	}
	outbuf = out
	return packed(out)
}
