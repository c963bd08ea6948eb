// Package store is flowd's message store: a RocketMQ-compatible commit log with one consume
// queue per (topic, queue id), a dispatcher that builds the queues behind the writer,
// asynchronous or group-commit flushing, crash recovery and retention, as RocketMQ's store has them.
//
// # Layout
//
//	<dir>/lock                       flock: one Store per directory
//	<dir>/abort                      exists while a Store has the directory open
//	<dir>/checkpoint                 durable commit-log and consume-queue positions (CRC'd)
//	<dir>/deleted                    deleted topics, each with the log offset below which its
//	                                 messages are dead (recovery does not re-dispatch them)
//	<dir>/commitlog/<offset:020d>    segments of Options.SegmentSize bytes
//	<dir>/consumequeue/<topic>/<queueId>/<firstUnit×20:020d>
//	                                 files of Options.ConsumeQueueUnits 20-byte units
//	<dir>/index/<firstOffset:020d>   key index files (RocketMQ's IndexFile layout; see index.go),
//	                                 named after the commit-log offset of their first message
//	<dir>/index/checkpoint           how many entries of the last index file are durable
//
// Messages are stored in the v1 stored layout of package protocol, which is also the body of
// a pull response: reads hand back the stored bytes untouched. A message never spans
// segments; when the next one does not fit, the segment's tail gets the blank marker
// (TOTALSIZE = what remains, MAGIC = 0xCBD43194) and the log rolls. Store timestamps, queue
// offsets and commit-log offsets are assigned at append time: a message is encoded outside
// the append lock and patched (protocol.PatchStored) inside it.
//
// # Dispatch
//
// One goroutine reads the commit log between the dispatched and the written offsets, parses
// each message, adds its keys to the key index and appends a unit (commit-log offset, size,
// tags code) to its consume queue, then calls Options.OnDispatch. A batch's keys are written
// before its units, so a message a reader can pull can also be found by key. A unit is only ever written after its message's bytes are
// in the page cache, and a queue's max offset is published only after its units are written,
// so a reader never sees a unit whose message it cannot read. Queue offsets are handed out by
// the writer; the dispatcher writes each unit at the queue offset stamped in its message,
// which makes re-dispatch during recovery idempotent.
//
// # Durability
//
// "Acknowledged" means Put returned nil.
//
//	                        process crash (kill -9, panic)   power cut / kernel crash
//	FlushAsync              nothing acknowledged is lost     up to FlushInterval of acknowledged
//	                                                         appends (FullFlushInterval if fewer
//	                                                         than FlushMinPages pages were dirty)
//	FlushSync               nothing acknowledged is lost     nothing acknowledged is lost
//
// A process crash loses nothing in either mode because an append is acknowledged only once
// its bytes were written to the file (the page cache), which survives the process. In both
// modes a message can be stored yet unacknowledged (the process died, or ErrFlushTimeout or
// a canceled ctx in FlushSync mode): it will be delivered, as in RocketMQ. Consume queues are
// always rebuilt from the commit log, so they never lose what the log kept.
//
// # Recovery
//
// Open finds the abort marker when the previous run did not Close. After a clean stop it
// validates the last three segments. After a crash it starts from the segment holding the
// checkpoint's durable offsets (or the last segment whose first message is older than the
// checkpoint's timestamps less 3 s, whichever is earlier; the first segment without a
// checkpoint), validates every message (magic, TOTALSIZE against the fields, body CRC,
// PHYSICALOFFSET equal to its position) and re-dispatches every one at or after the
// checkpoint's consume-queue offset (units below it are durable; re-dispatching them would
// resurrect a topic deleted since, as DeleteTopic checkpoints; and without a checkpoint,
// the messages of topics recorded in the deleted file are skipped). The log is cut at the first
// bad message: the rest of that segment is zeroed and later segments are deleted. Consume
// queue units that point past the recovered end, and zero-filled unit tails, are removed.
// Stats().Recovery and the log say what was cut and why.
//
// Recovery cuts only what it read and found bad. A read that fails (an I/O error, or a read
// of a file that comes back short) fails Open with an error wrapping ErrReadFailed and
// naming the file and offset, whichever file it was (commit log, consume queue, key index,
// checkpoints, deleted-topic records): taken for damage, the unit or message could be good
// data, cut; taken for a missing checkpoint, a crash recovery would drop the key index. The
// store stays closed until the disk reads again (or the file is moved away). Nothing is
// ever cut on account of a read that failed, and the abort marker, if there was one, stays,
// so the next Open recovers from the same point.
//
// # Failures
//
// A failed write or fsync (short write, EIO, ENOSPC) fails the store: Put returns an error
// wrapping ErrWriteFailed and its cause, and keeps refusing, so that no acknowledged message
// ever follows a hole. After an fsync error nothing is retried: the kernel may already have
// dropped the dirty pages ("fsyncgate"). Reads keep working. Reopen to recover; recovery
// cuts whatever the failed write left behind.
//
// A failed read (EIO, a short read, a fault on a mapped page) fails that read only, with an
// error wrapping ErrReadFailed, and counts in Stats().ReadErrors; the store keeps working.
// No offset ever moves past a message that was not read: a pull's batch ends at the first
// message it cannot read (NextBeginOffset is that message's offset) and a pull that would
// start there fails, so the consumer retries it until the disk gives it back; a consume
// queue that cannot be read fails the pull instead of being taken for a removed file;
// OffsetByTimestamp counts an unreadable message as recent enough, so a seek lands at or
// before it; lookups by offset and by key fail rather than answer "not found". Retention
// leaves a consume queue it cannot read as it is. GetRegions reads nothing: a fault
// while the transport sends a region closes that connection (the frame cannot be
// finished), and the client pulls again from the same offset. The dispatcher is the
// exception: a read failure there fails the store, as a write failure does, since no
// later message can be dispatched past it.
//
// # Retention
//
// Every CleanInterval the oldest segments (never the active one, nor one not yet flushed and
// dispatched) are deleted when their last write is older than Retention, or while the volume
// is fuller than MaxDiskUsage. Consume-queue files whose units all point into deleted
// segments follow, and so do key-index files whose last message lies below the log's first
// segment; queue min offsets move forward. Pulls of removed data answer
// OFFSET_TOO_SMALL or MESSAGE_WAS_REMOVING.
//
// # Rationale
//
//   - In FlushAsync mode the active segment is written through a shared memory mapping
//     (Linux, OS file system; Options.DisableMmap or any other vfs.FS uses pwrite). An append
//     is then a copy into the page cache, not a syscall: measured here ~2x pwrite's
//     throughput at 128 B (1.1-1.3x raw write(2)); at 1 KiB the two paths are on par,
//     between 0.55x and 1.4x raw depending on how busy the disk is with the periodic
//     fdatasync's writeback (page faults on a file under writeback are the cost). FlushSync
//     uses pwrite: its constant fdatasyncs write-protect the pages just written, and the next
//     mapped append into such a page faults and waits for its writeback (measured: half of pwrite's
//     throughput with 16 appenders). The mapping's known hazards are handled: the segment is
//     fallocated when it becomes active, so a full disk is an error at the roll instead of a
//     SIGBUS on a page fault; every copy to or from the mapping runs under
//     debug.SetPanicOnFault, so an I/O error on a mapped page fails the store instead of
//     crashing the daemon; and only the active segment is mapped (older ones are read with
//     pread), behind a per-segment lock that keeps it mapped while a reader copies.
//     A prefaulter goroutine keeps the next 4 MiB of the mapping populated (writable; see
//     prefaultLoop for why), taking page allocation, zeroing and faults off the append path;
//     it writes each step's zeros with pwrite first, which is cheaper than having the
//     populate zero-fill the pages through readahead, and appenders that would reach a range
//     being zeroed wait for it (zeroMapped).
//     Durability is unchanged: a store into a shared mapping is in the page cache at once
//     (nothing is lost when the process dies), and fdatasync writes mapped dirty pages like
//     written ones.
//   - pwrite remains the path for the fault-injecting file system, so short writes, ENOSPC
//     and fsync errors are tested through it; the mapped path shares everything else.
//     Measured again with CPU time (flowd bench, one unbatched producer at 1 KiB, and
//     BenchmarkAppend's cpu-ns/op): pwrite appends cost more per message than mapped ones
//     (about 5 us against 4 us in the benchmark, 23 us against 17 us for the whole bench
//     process), though the mapping pays the kernel's zeroing of each fresh page: a 1 KiB
//     pwrite into a fresh page zeroes the rest of that page too, and adds a system call.
//   - Consume-queue units are written through a shared mapping of their file as well
//     (mapCQFile; pwrite with DisableMmap and on the fault-injecting file system, whose
//     faults then still reach the dispatcher). A file being written is extended to its full
//     size (sparse) and mapped; a clean Close cuts it back to its units, and recovery drops
//     the zeros after the last unit of a file a crash left at full size. The dispatcher
//     then makes one system call per pass (the key index's entries) instead of one per
//     queue touched plus two. Reads of units keep using pread. At most 16384 files are
//     mapped at once (maxCQMaps), the queue's current one each: the process shares
//     vm.max_map_count with the Go runtime, whose failed mmap is fatal; queues past the
//     cap write with pwrite.
//   - Reads copy into pooled buffers (from the mapping, or by pread): a pull's messages are
//     usually adjacent in the log (one queue's messages arrive together), so runs of adjacent
//     units are read with one copy. Result buffers come from a pool and go back on
//     GetResult.Release; handing out slices of the mapping itself would tie the segment's
//     lifetime to network writes.
//   - GetRegions, the broker's path for pulls without a content filter, reads nothing: it
//     hands out (segment, offset, length) regions and the transport sends them from the file
//     (sendfile for large regions, a copy into its write buffer for small ones). Each region
//     pins its segment until GetResult.Release: retention unlinks a pinned segment at once
//     but closes its file at the last release, so a send in progress keeps the right bytes
//     (an unlinked file's data lives while a descriptor is open) and is never cut short.
//     Regions lie below the dispatched offset (units exist only for dispatched messages), so
//     they are always whole messages; a region of the mapped active segment is read by
//     sendfile through the page cache, which holds what the mapping wrote.
//   - Segments that are not active are sparse files (created by truncation), fallocated
//     only when they become active.
//   - fdatasync (vfs.File.Sync) instead of fsync: segment sizes never change after creation,
//     so file metadata need not be flushed with the data.
//   - Group commit: a FlushSync append queues a waiter (its end offset and whom to tell)
//     under the append lock, so the queue is in offset order, and signals the flusher. The
//     flusher fsyncs everything written by then and, as soon as that finished, again if
//     more was written meanwhile (no tick), so appends arriving during one fsync share the
//     next. A completion goroutine then completes every waiter the fsync covered in one
//     sweep, in order, while the next fsync runs, and fails those whose SyncFlushTimeout
//     passed (one timer, for the oldest). PutAsync's callers hold no goroutine while they
//     wait (the broker answers SYNC_FLUSH sends from the completion); Put waits on a
//     channel the completion fills.
//   - In FlushSync mode the prefaulter writes zeros (and fdatasyncs them) up to 4 MiB ahead
//     of the write position instead of populating a mapping: the group commit's fdatasyncs
//     then overwrite blocks already allocated and written, and do not also commit the
//     allocation with every group (see zeroAhead for the measurements).
//   - The dispatcher re-reads the log instead of being handed parsed messages by the writer:
//     the same code then serves recovery, and the writer's critical section stays short.
//     After a pass that found work it waits 1 ms before the next, so that under load it
//     writes consume-queue units in batches instead of waking (and writing) per message; an
//     idle dispatcher reacts at once. Under load, a unit (and the long-polling
//     wake-up) therefore trails its append by at most about 1 ms.
//   - The checkpoint stores exact offsets besides RocketMQ's timestamps; offsets decide where
//     recovery starts, timestamps can only move it earlier.
package store
