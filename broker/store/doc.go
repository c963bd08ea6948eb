// Package store is flowd's message store: a RocketMQ-compatible commit log with one consume
// queue per (topic, queue id), a dispatcher that builds the queues behind the writer,
// asynchronous or group-commit flushing, crash recovery and retention (SPEC §2).
//
// # Layout
//
//	<dir>/lock                       flock: one Store per directory
//	<dir>/abort                      exists while a Store has the directory open
//	<dir>/checkpoint                 durable commit-log and consume-queue positions (CRC'd)
//	<dir>/commitlog/<offset:020d>    segments of Options.SegmentSize bytes
//	<dir>/consumequeue/<topic>/<queueId>/<firstUnit×20:020d>
//	                                 files of Options.ConsumeQueueUnits 20-byte units
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
// each message and appends a unit (commit-log offset, size, tags code) to its consume queue,
// then calls Options.OnDispatch. A unit is only ever written after its message's bytes are
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
// PHYSICALOFFSET equal to its position) and re-dispatches it. The log is cut at the first
// bad message: the rest of that segment is zeroed and later segments are deleted. Consume
// queue units that point past the recovered end, and zero-filled unit tails, are removed.
// Stats().Recovery and the log say what was cut and why.
//
// # Failures
//
// A failed write or fsync (short write, EIO, ENOSPC) fails the store: Put returns an error
// wrapping ErrWriteFailed and its cause, and keeps refusing, so that no acknowledged message
// ever follows a hole. After an fsync error nothing is retried: the kernel may already have
// dropped the dirty pages ("fsyncgate"). Reads keep working. Reopen to recover; recovery
// cuts whatever the failed write left behind.
//
// # Retention
//
// Every CleanInterval the oldest segments (never the active one, nor one not yet flushed and
// dispatched) are deleted when their last write is older than Retention, or while the volume
// is fuller than MaxDiskUsage. Consume-queue files whose units all point into deleted
// segments follow, and queue min offsets move forward. Pulls of removed data answer
// OFFSET_TOO_SMALL or MESSAGE_WAS_REMOVING.
//
// # Rationale
//
//   - pwrite, not mmap, for appends. With mmap a full disk or an I/O error arrives as SIGBUS
//     and kills the daemon; with pwrite it is an error we can refuse writes on, and the
//     fault-injecting vfs can simulate it. The write happens under the append lock from the
//     caller's buffer, which was encoded outside it, so an append costs one copy into the
//     page cache and one syscall (a batch, one for all its messages); benchmarks put this
//     within reach of raw sequential write(2) throughput. Segments are preallocated by
//     truncation (sparse): no zero-filling pass, and no SIGBUS concern.
//   - pread into pooled buffers for reads. A pull's messages are usually adjacent in the log
//     (one queue's messages arrive together), so runs of adjacent units are read with one
//     pread. Result buffers come from a pool and go back on GetResult.Release.
//   - fdatasync (vfs.File.Sync) instead of fsync: segment sizes never change after creation,
//     so file metadata need not be flushed with the data.
//   - Group commit needs no queue: a FlushSync appender signals the flusher and waits for
//     the flushed offset to pass its end. Each fsync covers everything written when it
//     started, so appends that arrive during one fsync share the next.
//   - The dispatcher re-reads the log instead of being handed parsed messages by the writer:
//     the same code then serves recovery, and the writer's critical section stays short.
//     After a pass that found work it waits 1 ms before the next, so that under load it
//     writes consume-queue units in batches instead of waking (and issuing a pwrite) per
//     message; an idle dispatcher reacts at once. Under load, a unit (and the long-polling
//     wake-up) therefore trails its append by at most about 1 ms.
//   - The checkpoint stores exact offsets besides RocketMQ's timestamps; offsets decide where
//     recovery starts, timestamps can only move it earlier.
package store
