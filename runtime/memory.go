package runtime

// linearMemory backs a guest's linear memory and enforces Spec.MemoryLimitPages.
//
// # Notes
//
//   - wazero's own limit (RuntimeConfig.WithMemoryLimitPages) refuses a memory.grow past the
//     limit silently: the host cannot tell a guest that ran out of memory from one that
//     trapped for another reason. Growth refused here is recorded, so the fault is reported
//     as [ErrMemory].
//   - The first allocation (the memory's declared minimum) is never refused: Load already
//     refused exported memories whose minimum exceeds the limit, and newInstance checks the
//     size after instantiation.
type linearMemory struct {
	buf     []byte
	limit   uint64
	started bool
	refused *bool
}

// Reallocate grows the memory to size bytes, or returns nil (memory.grow returns -1) past
// the limit.
func (l *linearMemory) Reallocate(size uint64) []byte {
	if l.started && size > l.limit {
		*l.refused = true
		return nil
	}
	l.started = true
	if size <= uint64(cap(l.buf)) {
		// Memory only grows, and bytes past len were never handed out, so they are zero.
		l.buf = l.buf[:size]
		return l.buf
	}
	capacity := max(size, min(2*uint64(cap(l.buf)), l.limit))
	b := make([]byte, size, capacity)
	copy(b, l.buf)
	l.buf = b
	return b
}

// Free drops the memory.
func (l *linearMemory) Free() { l.buf = nil }
