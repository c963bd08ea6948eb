// Command badguest is a test plugin of every kind that misbehaves on demand: it behaves
// until a batch mentions its "trigger" parameter ("boom" by default; a filter or transform
// message) or holds more than one queue (an allocator), then does what its "mode" parameter
// says. A batch mentioning "panic" traps whatever the mode. Mode "poison" keeps what it did
// in memory: after a batch with the trigger it returns an error code, and from then on keeps
// nothing, as a guest whose state a fault corrupted would. Mode "spin" loops on every call,
// the self-test's included.
package main

import (
	"bytes"
	"encoding/binary"
	"unsafe"
)

func main() {}

var (
	in       []byte
	out      []byte
	mode     string
	trigger  = []byte("boom")
	hog      [][]byte
	poisoned bool
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
	count := int(binary.LittleEndian.Uint32(b))
	b = b[4:]
	for range count {
		kl := int(binary.LittleEndian.Uint16(b))
		key := string(b[2 : 2+kl])
		vl := int(binary.LittleEndian.Uint32(b[2+kl:]))
		value := string(b[6+kl : 6+kl+vl])
		b = b[6+kl+vl:]
		switch key {
		case "mode":
			mode = value
		case "trigger":
			trigger = []byte(value)
		}
	}
	if mode == "refuse" {
		return -4
	}
	return 0
}

// misbehave does what mode says for a trap, a loop, a load out of bounds or a memory hog;
// it does nothing for the modes about output.
func misbehave() {
	switch mode {
	case "trap":
		panic("boom")
	case "loop":
		for {
		}
	case "oob":
		// A load far past the end of memory: a WebAssembly trap, with wazero's stack trace.
		var b byte
		hog = append(hog, []byte{*(*byte)(unsafe.Add(unsafe.Pointer(&b), 0x7ffffff0))})
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
	if poisoned {
		clear(out)
		return ptr(out)
	}
	if bytes.Contains(in[:n], []byte("panic")) {
		panic("panic")
	}
	if !bytes.Contains(in[:n], trigger) {
		return ptr(out)
	}
	misbehave()
	switch mode {
	case "poison":
		poisoned = true
		return -2
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
	if bytes.Contains(in[:n], trigger) {
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
