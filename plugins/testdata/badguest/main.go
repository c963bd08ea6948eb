// Command badguest is a test plugin of every kind that misbehaves on demand: it behaves
// until a batch mentions "boom" (a filter or transform message) or holds more than one
// queue (an allocator), then does what its "mode" parameter says. Mode "spin" loops on
// every call, the self-test's included.
package main

import (
	"bytes"
	"encoding/binary"
	"unsafe"
)

func main() {}

var (
	in   []byte
	out  []byte
	mode string
	hog  [][]byte
)

func ptr(b []byte) int32 { return int32(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

//go:wasmexport flowd_abi_version
func abiVersion() int32 { return 1 }

//go:wasmexport flowd_alloc
func alloc(size int32) int32 {
	if cap(in) < int(size) || cap(in) == 0 {
		in = make([]byte, max(size, 16))
	}
	return ptr(in)
}

//go:wasmexport flowd_init
func initParams(p, n int32) int32 {
	b := in[:n]
	if binary.LittleEndian.Uint32(b) == 0 {
		return 0
	}
	kl := int(binary.LittleEndian.Uint16(b[4:]))
	vl := int(binary.LittleEndian.Uint32(b[6+kl:]))
	mode = string(b[10+kl : 10+kl+vl])
	if mode == "refuse" {
		return -4
	}
	return 0
}

// misbehave does what mode says for a trap, a loop or a memory hog, and reports whether it
// did nothing (the mode is about output).
func misbehave() {
	switch mode {
	case "trap":
		panic("boom")
	case "loop":
		for {
		}
	case "grow":
		for {
			hog = append(hog, make([]byte, 1<<20))
		}
	}
}

// spin loops forever in mode "spin".
func spin() {
	for mode == "spin" {
	}
}

//go:wasmexport flowd_filter
func filter(p, n, count int32) int32 {
	spin()
	size := (int(count) + 7) / 8
	out = make([]byte, size)
	for i := range out {
		out[i] = 0xff
	}
	if r := count % 8; r != 0 {
		out[size-1] = byte(1)<<r - 1
	}
	if !bytes.Contains(in[:n], []byte("boom")) {
		return ptr(out)
	}
	misbehave()
	switch mode {
	case "bitmap":
		out[size-1] = 0xff
	case "code":
		return -2
	case "pointer":
		return 0x7fff0000
	}
	return ptr(out)
}

//go:wasmexport flowd_allocate
func allocate(p, n int32) int64 {
	spin()
	b := in[:n]
	gl := int(binary.LittleEndian.Uint16(b))
	nq := int(binary.LittleEndian.Uint32(b[2+gl:]))
	out = make([]byte, 4*nq)
	if nq > 1 {
		misbehave()
		switch mode {
		case "index":
			binary.LittleEndian.PutUint32(out[4*(nq-1):], 1000)
		case "short":
			out = out[:4*(nq-1)]
		case "negative":
			binary.LittleEndian.PutUint32(out, 0xffffffff)
		case "code":
			return -5
		}
	}
	return int64(ptr(out))<<32 | int64(len(out))
}

//go:wasmexport flowd_transform
func transform(p, n, count int32) int64 {
	spin()
	out = make([]byte, 4*count)
	if bytes.Contains(in[:n], []byte("boom")) {
		misbehave()
		switch mode {
		case "truncated":
			binary.LittleEndian.PutUint32(out, 5)
		case "trailing":
			out = append(out, 1, 2, 3)
		}
	}
	return int64(ptr(out))<<32 | int64(len(out))
}
