//go:build wasip1

//lint:file-ignore U1000 the go:wasmexport functions are called by the host, never from Go

package flowd

import (
	"errors"
	"unsafe"
)

// The ABI's exports: they move input and output across the boundary and leave the
// encodings to codec.go. Only a wasip1 build has them; the rest of the package builds
// anywhere, so plugins type-check (go vet ./...) and the encodings are tested on the host.

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
	if !decodeParams(view(p, n), params) {
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
	var ok bool
	if msgs, ok = decodeMessages(msgs, view(p, n), count); !ok {
		return int32(CodeInput)
	}
	outbuf = filterBitmap(outbuf, msgs, filterFn)
	return ptrOf(outbuf)
}

//go:wasmexport flowd_transform
func exportTransform(p, n, count int32) int64 {
	if transformFn == nil {
		return int64(CodeUnsupported)
	}
	var ok bool
	if msgs, ok = decodeMessages(msgs, view(p, n), count); !ok {
		return int64(CodeInput)
	}
	out := outbuf[:0]
	for i := range msgs {
		out = appendOutputs(out, transformFn(msgs[i]))
	}
	outbuf = out
	return packed(out)
}

//go:wasmexport flowd_allocate
func exportAllocate(p, n int32) int64 {
	if allocFn == nil {
		return int64(CodeUnsupported)
	}
	if !decodeInput(&in, view(p, n)) {
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
	outbuf = appendOwners(outbuf[:0], owners)
	return packed(outbuf)
}
