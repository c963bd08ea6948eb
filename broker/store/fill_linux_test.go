//go:build linux

package store

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// BenchmarkSegmentFill compares ways of getting 1 KiB appends into fresh pages of a commit-log
// file, all in one goroutine, by the process's CPU per KiB appended (cpu-ns/op, one op = one
// KiB): the store's way (fallocate, map, populate 1 MiB writable ahead of the copies), the
// same on a sparse file, zeros written with pwrite ahead of the copies instead of (or before)
// the populate, pwrite appends of each KiB, pwrite of whole 1 MiB blocks (what a writer that
// buffers in user space pays, nats-server's file store for one), and the store's way into a
// file whose pages are already in the page cache (the kernel then allocates nothing).
//
// # Notes
//
// The point is where the page zeroing in the broker's profiles comes from: every method that
// puts bytes into fresh page-cache pages pays for the first touch of the memory, in memset or
// in the copy from user space, and only pages already cached avoid it. See docs/PERFORMANCE.md
// ("The commit log's fresh pages").
func BenchmarkSegmentFill(b *testing.B) {
	const size = 64 << 20
	const msg = 1 << 10
	const step = 1 << 20
	fills := []struct {
		name string
		fill func(b *testing.B, f *os.File)
	}{
		{"mapped-populate", func(b *testing.B, f *os.File) { fillMapped(b, f, true, false, true) }},
		{"mapped-sparse-populate", func(b *testing.B, f *os.File) { fillMapped(b, f, false, false, true) }},
		{"mapped-zeros-populate", func(b *testing.B, f *os.File) { fillMapped(b, f, true, true, true) }},
		{"mapped-zeros", func(b *testing.B, f *os.File) { fillMapped(b, f, true, true, false) }},
		{"pwrite-1KiB", func(b *testing.B, f *os.File) {
			p := make([]byte, msg)
			for off := int64(0); off < size; off += msg {
				if _, err := f.WriteAt(p, off); err != nil {
					b.Fatal(err)
				}
			}
		}},
		{"pwrite-1MiB", func(b *testing.B, f *os.File) {
			p := make([]byte, step)
			for off := int64(0); off < size; off += step {
				if _, err := f.WriteAt(p, off); err != nil {
					b.Fatal(err)
				}
			}
		}},
	}
	for _, fc := range fills {
		b.Run(fc.name, func(b *testing.B) {
			dir := b.TempDir()
			b.SetBytes(msg)
			var cpu int64
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				f, err := os.OpenFile(filepath.Join(dir, "seg"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				c0 := processCPU()
				fc.fill(b, f)
				cpu += int64(processCPU() - c0)
				b.StopTimer()
				f.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(cpu)/float64(b.N)/(size/msg), "cpu-ns/KiB")
		})
	}
	b.Run("mapped-populate-cached", func(b *testing.B) {
		f, err := os.OpenFile(filepath.Join(b.TempDir(), "seg"), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		b.SetBytes(msg)
		fillMapped(b, f, true, false, true) // the pages are cached from here on
		var cpu int64
		for b.Loop() {
			c0 := processCPU()
			fillMapped(b, f, true, false, true)
			cpu += int64(processCPU() - c0)
		}
		b.ReportMetric(float64(cpu)/float64(b.N)/(size/msg), "cpu-ns/KiB")
	})
}

// fillMapped appends 1 KiB copies to a 64 MiB mapping of f, the way the store's active
// segment is written: falloc reserves the blocks first (else the file is sparse); every
// MiB, zeros writes the next MiB with pwrite and populate has the kernel fault it in
// writable (MADV_POPULATE_WRITE), before the copies reach it.
func fillMapped(b *testing.B, f *os.File, falloc, zeros, populate bool) {
	const size = 64 << 20
	const step = 1 << 20
	if err := f.Truncate(size); err != nil {
		b.Fatal(err)
	}
	if falloc {
		if err := syscall.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
			b.Skipf("fallocate: %v", err)
		}
	}
	m, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		b.Fatal(err)
	}
	defer syscall.Munmap(m)
	p := make([]byte, 1<<10)
	for i := range p {
		p[i] = byte(i)
	}
	var z []byte
	if zeros {
		z = make([]byte, step)
	}
	for off := 0; off < size; off += len(p) {
		if off%step == 0 {
			if zeros {
				if _, err := f.WriteAt(z, int64(off)); err != nil {
					b.Fatal(err)
				}
			}
			if populate {
				_ = prefault(m[off : off+step])
			}
		}
		copy(m[off:], p)
	}
}
