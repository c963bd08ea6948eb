// Command replay is a test plugin of every kind that answers with fixed bytes, written
// against the ABI by hand so that nothing of the Go SDK stands between the host and the
// bytes. Its parameter "out" (hex) is the result of every call: the bitmap of a filter, the
// output of a transform or an allocator. With a parameter "in" (hex) it refuses, with
// FLOWD_ERR_INPUT, any input but those bytes. The golden tests of package plugins load it to
// check what the host writes into and reads out of guest memory against the ABI's golden
// vectors.
package main

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"unsafe"
)

func main() {}

const (
	errInput  = -2
	errParams = -4
)

var (
	inbuf []byte // the host's input buffer; kept alive for it
	want  []byte // the only input accepted, when check is set
	check bool
	out   []byte
)

func ptr(b []byte) int32 { return int32(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

// input is the n bytes the host wrote at p, or nil when they are not in the input buffer.
func input(p, n int32) []byte {
	if n < 0 || cap(inbuf) == 0 || p != ptr(inbuf) || int(n) > len(inbuf) {
		return nil
	}
	return inbuf[:n]
}

// expected reports whether the call's input is what the "in" parameter says.
func expected(p, n int32) bool {
	b := input(p, n)
	return b != nil && (!check || bytes.Equal(b, want))
}

func packed(b []byte) int64 { return int64(uint64(uint32(ptr(b)))<<32 | uint64(uint32(len(b)))) }

//go:wasmexport flowd_abi_version
func abiVersion() int32 { return 1 }

//go:wasmexport flowd_alloc
func alloc(size int32) int32 {
	if size < 0 {
		return 0
	}
	if cap(inbuf) < int(size) || cap(inbuf) == 0 {
		inbuf = make([]byte, max(int(size), 16))
	}
	return ptr(inbuf)
}

//go:wasmexport flowd_init
func initParams(p, n int32) int32 {
	b := input(p, n)
	if len(b) < 4 {
		return errInput
	}
	le := binary.LittleEndian
	count, off := le.Uint32(b), 4
	for range count {
		if len(b)-off < 2 {
			return errInput
		}
		kl := int(le.Uint16(b[off:]))
		if len(b)-off-2 < kl+4 {
			return errInput
		}
		key := string(b[off+2 : off+2+kl])
		off += 2 + kl
		vl := int(le.Uint32(b[off:]))
		if len(b)-off-4 < vl {
			return errInput
		}
		v, err := hex.DecodeString(string(b[off+4 : off+4+vl]))
		off += 4 + vl
		if err != nil {
			return errParams
		}
		switch key {
		case "in":
			want, check = v, true
		case "out":
			out = v
		}
	}
	if out == nil {
		return errParams
	}
	return 0
}

//go:wasmexport flowd_filter
func filter(p, n, count int32) int32 {
	if !expected(p, n) {
		return errInput
	}
	return ptr(out)
}

//go:wasmexport flowd_transform
func transform(p, n, count int32) int64 {
	if !expected(p, n) {
		return errInput
	}
	return packed(out)
}

//go:wasmexport flowd_allocate
func allocate(p, n int32) int64 {
	if !expected(p, n) {
		return errInput
	}
	return packed(out)
}
