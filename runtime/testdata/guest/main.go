// Command guest is a test module for package runtime: a Go wasip1 reactor built with
// -buildmode=c-shared, exporting one function per behaviour the tests need.
package main

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"time"
)

func main() {}

// buffers keeps memory handed to the host alive: the Go GC does not see the host's
// references.
var buffers = map[uint32][]byte{}

// initialized proves _initialize ran before any export: only package initialisation sets
// it.
var initialized uint32

func init() { initialized = 7 }

//go:wasmexport flowd_abi_version
func abiVersion() uint32 { return 1 }

//go:wasmexport initialized
func initializedExport() uint32 { return initialized }

//go:wasmexport noop
func noop() {}

//go:wasmexport add
func add(a, b uint32) uint32 { return a + b }

//go:wasmexport flowd_alloc
func alloc(size uint32) uint32 {
	b := make([]byte, size)
	p := ptr(b)
	buffers[p] = b
	return p
}

// sum adds the bytes at [p, p+n) of a buffer from flowd_alloc.
//
//go:wasmexport sum
func sum(p, n uint32) uint32 {
	b := buffers[p]
	var s uint32
	for _, c := range b[:n] {
		s += uint32(c)
	}
	return s
}

// heads adds the first byte of each of n records of stride bytes at p, the way a filter
// reads each message's header and not its body.
//
//go:wasmexport heads
func heads(p, n, stride uint32) uint32 {
	b := buffers[p]
	var s uint32
	for i := range n {
		s += uint32(b[i*stride])
	}
	return s
}

//go:wasmexport boom
func boom() { panic("boom") }

//go:wasmexport spin
func spin(n uint32) uint32 {
	for {
		n = n*1664525 + 1013904223
	}
}

// hog allocates mib MiB and keeps it.
//
//go:wasmexport hog
func hog(mib uint32) uint32 {
	b := make([]byte, mib<<20)
	for i := range b {
		b[i] = 1
	}
	buffers[ptr(b)] = b
	return uint32(len(b) >> 20)
}

//go:wasmexport say
func say(n uint32) {
	for i := range n {
		fmt.Printf("line %d\n", i)
	}
	fmt.Fprint(os.Stderr, "partial")
}

// now returns the wall clock seconds the guest sees.
//
//go:wasmexport now
func now() uint64 { return uint64(time.Now().Unix()) }

// files returns 1 if the guest can open a file of the host.
//
//go:wasmexport files
func files() uint32 {
	if f, err := os.Open("/etc/hostname"); err == nil {
		f.Close()
		return 1
	}
	return 0
}

// random returns 8 bytes from the guest's random source.
//
//go:wasmexport random
func random() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}
