package store

import (
	"bufio"
	"bytes"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/flowd-io/flowd/broker/store/vfs"
)

// FlushMode says when an append is acknowledged relative to fsync.
type FlushMode int

const (
	// FlushAsync acknowledges an append once it is in the operating system's page cache; a
	// background loop fsyncs on a timer. See the package documentation for what a power cut
	// loses.
	FlushAsync FlushMode = iota
	// FlushSync acknowledges an append only after an fsync covers it. Concurrent appends share
	// one fsync (group commit).
	FlushSync
)

func (m FlushMode) String() string {
	switch m {
	case FlushAsync:
		return "ASYNC_FLUSH"
	case FlushSync:
		return "SYNC_FLUSH"
	}
	return "FlushMode(" + strconv.Itoa(int(m)) + ")"
}

// Options configure a Store. The zero value of every field means its default, so
// Options{} is a valid configuration.
type Options struct {
	// FS is the file system the store lives on. Default: vfs.Default(), the operating system's.
	FS vfs.FS

	// SegmentSize is the size of one commit-log segment file, in bytes. Default: 1 GiB. A
	// message never spans two segments, so it bounds MaxMessageSize.
	SegmentSize int64

	// DisableMmap makes appends and reads of the active segment use pwrite and pread in
	// FlushAsync mode too. By default, in FlushAsync mode on Linux with a file system whose
	// files expose a descriptor (the OS one does), the active segment is fallocated and
	// mapped, and appends copy into the mapping. FlushSync always uses pwrite.
	DisableMmap bool

	// ConsumeQueueUnits is the number of 20-byte units in one consume-queue file.
	// Default: 300 000 (a 5.72 MiB file).
	ConsumeQueueUnits int

	// IndexSlots is the number of hash slots of one key-index file (4 bytes each).
	// Default: 5 000 000, RocketMQ's maxHashSlotNum. The active file's slot table is also
	// held in memory (20 MB by default).
	IndexSlots int

	// IndexEntries is the number of 20-byte entries of one key-index file; entry 0 is never
	// used, so a file indexes IndexEntries-1 keys before the next one starts. Default:
	// 20 000 000, RocketMQ's maxIndexNum (with the default slots, a 420 MB sparse file).
	IndexEntries int

	// DisableIndex turns the key index off: no index files, and QueryMessages finds nothing.
	// Default: false (indexed).
	DisableIndex bool

	// FlushMode chooses asynchronous or synchronous (group-commit) flushing. Default:
	// FlushAsync.
	FlushMode FlushMode

	// FlushInterval is how often the asynchronous flusher wakes. Default: 500ms.
	FlushInterval time.Duration

	// FlushMinPages is the number of dirty 4 KiB pages the asynchronous flusher waits for
	// before it fsyncs, unless FullFlushInterval has passed. Default: 4.
	FlushMinPages int

	// FullFlushInterval bounds how long written data can stay unsynced in FlushAsync mode,
	// however little of it there is. Default: 10s.
	FullFlushInterval time.Duration

	// SyncFlushTimeout is how long Put waits for the fsync covering its message in FlushSync
	// mode before it returns ErrFlushTimeout (the message is stored, but not known durable).
	// Default: 5s.
	SyncFlushTimeout time.Duration

	// CheckpointInterval is how often consume queues are fsynced and the checkpoint is
	// written. It bounds how much of the commit log a crash recovery re-reads. Default: 1s.
	CheckpointInterval time.Duration

	// Retention is how long a commit-log segment is kept after its last write. Default: 72h.
	Retention time.Duration

	// MaxDiskUsage is the used fraction of the volume above which the oldest segments are
	// deleted regardless of Retention. Default: 0.75. A negative value disables the rule.
	MaxDiskUsage float64

	// CleanInterval is how often retention runs. Default: 10s.
	CleanInterval time.Duration

	// MaxMessageSize is the largest stored message accepted, in bytes; larger ones fail with
	// ErrMessageTooLarge. Default: 4 MiB, lowered to SegmentSize-8 for small segments.
	MaxMessageSize int

	// StoreHost is stamped into every message's STOREHOST field and into its offsetMsgId.
	// Default: the zero address (0.0.0.0:0).
	StoreHost netip.AddrPort

	// MemoryBudget is how far behind the commit log's end, in bytes, data still counts as
	// "in memory" for the read batch caps and the replica suggestion. Default:
	// InMemoryMaxRatio percent of Memory.
	MemoryBudget int64

	// Memory is the memory, in bytes, that InMemoryMaxRatio applies to when MemoryBudget is
	// not set. Default: the machine's RAM (from /proc/meminfo; 20 GiB if that cannot be
	// read, so that the budget is the 8 GiB it always fell back to).
	Memory int64

	// InMemoryMaxRatio is the percentage of Memory that counts as in memory (RocketMQ's
	// accessMessageInMemoryMaxRatio). Default: 40.
	InMemoryMaxRatio int

	// OnDispatch, if set, is called by the dispatcher after each consume-queue unit is
	// appended and readable (long polling hangs on it). It runs on the dispatch goroutine and
	// must not block; Properties is freshly allocated and may be kept.
	OnDispatch func(DispatchEvent)

	// DispatchAwaited, if set, reports whether a reader waits for the next dispatched message
	// (the broker: a pull is parked). While one does, the dispatcher never holds back after a
	// busy pass (see dispatchBatchWait): the hold saves passes when nobody waits, and would
	// otherwise add a millisecond or more to every message appended during it, the messages
	// of a burst. It is called on the dispatch goroutine and must be quick.
	DispatchAwaited func() bool

	// OnFlush, if set, is called after every flush of the commit log that had something to
	// flush (the flusher's, a FlushSync group commit, Sync): how long its fsyncs took, how
	// many bytes became durable, and the error that failed the store, if one did. It runs on
	// the flushing goroutine, which appends in FlushSync mode wait for, so it must be quick
	// and must not block. It is how the embedding program measures flush latency.
	OnFlush func(d time.Duration, bytes int, err error)

	// OnFailure, if set, is called once, on its own goroutine, when the store stops accepting
	// writes (a failed write or flush, a full disk); err says why. The store serves reads on.
	OnFailure func(err error)

	// Logger receives recovery reports, retention deletions and write failures.
	// Default: slog.Default().
	Logger *slog.Logger

	// Now is the clock used for store timestamps and retention. Default: time.Now.
	Now func() time.Time
}

const (
	defaultSegmentSize      = 1 << 30
	defaultCQUnits          = 300_000
	defaultMaxMessageSize   = 4 << 20
	defaultMemoryFallback   = 20 << 30
	defaultInMemoryMaxRatio = 40
	pageSize                = 4096
	// blankMin is the space every segment keeps free for the blank marker
	// (TOTALSIZE + MAGIC) that ends it.
	blankMin = 8
	// minSegmentSize keeps tests with tiny segments meaningful.
	minSegmentSize = 4096
	// maxIndexCount keeps slot values and entry indexes within int32, as the file stores them.
	maxIndexCount = 1<<31 - 1
)

// withDefaults returns o with every zero field replaced by its default, or an error for a
// value that cannot work.
func (o Options) withDefaults() (Options, error) {
	if o.FS == nil {
		o.FS = vfs.Default()
	}
	if o.SegmentSize == 0 {
		o.SegmentSize = defaultSegmentSize
	}
	if o.SegmentSize < minSegmentSize {
		return o, fmt.Errorf("store options: SegmentSize %d is below %d", o.SegmentSize, minSegmentSize)
	}
	if o.ConsumeQueueUnits == 0 {
		o.ConsumeQueueUnits = defaultCQUnits
	}
	if o.ConsumeQueueUnits < 1 {
		return o, fmt.Errorf("store options: ConsumeQueueUnits %d is below 1", o.ConsumeQueueUnits)
	}
	if o.IndexSlots == 0 {
		o.IndexSlots = defaultIndexSlots
	}
	if o.IndexEntries == 0 {
		o.IndexEntries = defaultIndexEntries
	}
	if o.IndexSlots < 1 || o.IndexSlots > maxIndexCount {
		return o, fmt.Errorf("store options: IndexSlots %d is not within 1..%d", o.IndexSlots, maxIndexCount)
	}
	if o.IndexEntries < 2 || o.IndexEntries > maxIndexCount {
		return o, fmt.Errorf("store options: IndexEntries %d is not within 2..%d", o.IndexEntries, maxIndexCount)
	}
	if o.FlushMode != FlushAsync && o.FlushMode != FlushSync {
		return o, fmt.Errorf("store options: unknown %v", o.FlushMode)
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = 500 * time.Millisecond
	}
	if o.FlushMinPages <= 0 {
		o.FlushMinPages = 4
	}
	if o.FullFlushInterval <= 0 {
		o.FullFlushInterval = 10 * time.Second
	}
	if o.SyncFlushTimeout <= 0 {
		o.SyncFlushTimeout = 5 * time.Second
	}
	if o.CheckpointInterval <= 0 {
		o.CheckpointInterval = time.Second
	}
	if o.Retention <= 0 {
		o.Retention = 72 * time.Hour
	}
	if o.MaxDiskUsage == 0 {
		o.MaxDiskUsage = 0.75
	}
	if o.CleanInterval <= 0 {
		o.CleanInterval = 10 * time.Second
	}
	if o.MaxMessageSize == 0 {
		o.MaxMessageSize = int(min(defaultMaxMessageSize, o.SegmentSize-blankMin))
	}
	if int64(o.MaxMessageSize) > o.SegmentSize-blankMin {
		return o, fmt.Errorf("store options: MaxMessageSize %d does not fit a segment of %d bytes", o.MaxMessageSize, o.SegmentSize)
	}
	if o.InMemoryMaxRatio <= 0 {
		o.InMemoryMaxRatio = defaultInMemoryMaxRatio
	}
	if o.InMemoryMaxRatio > 100 {
		return o, fmt.Errorf("store options: InMemoryMaxRatio %d is above 100", o.InMemoryMaxRatio)
	}
	if o.MemoryBudget <= 0 {
		if o.Memory <= 0 {
			o.Memory = machineMemory()
		}
		o.MemoryBudget = max(o.Memory*int64(o.InMemoryMaxRatio)/100, 1)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o, nil
}

// machineMemory is MemTotal, the memory RocketMQ's accessMessageInMemoryMaxRatio applies to.
func machineMemory() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return defaultMemoryFallback
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) >= 2 && string(f[0]) == "MemTotal:" {
			kb, err := strconv.ParseInt(string(f[1]), 10, 64)
			if err != nil || kb <= 0 {
				break
			}
			return kb * 1024
		}
	}
	return defaultMemoryFallback
}
