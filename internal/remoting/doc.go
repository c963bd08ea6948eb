// Package remoting is flowd's TCP transport for RocketMQ's remoting protocol: the connection
// policy shared by the broker (Server) and flowd's clients (Dial, Client). It frames and
// unframes commands with package protocol and knows nothing about what they mean; the broker
// and the clients bring that as a Handler.
//
// Every connection is symmetric once open. Either side may send requests (Conn.Invoke,
// Conn.InvokeOneway) and either side serves the requests it receives with its Handler: the
// broker answers clients, and clients answer the broker's NOTIFY_CONSUMER_IDS_CHANGED and
// GET_CONSUMER_RUNNING_INFO. A frame with the response flag is matched to the waiting Invoke
// by its opaque; any other frame is a request for the Handler.
//
// # Notes
//
//   - Requests are pipelined. Each request is served on its own goroutine (unless inline,
//     below) and its response is written whenever it is ready, so a long-polling pull parked
//     for 20 s does not hold up the heartbeat sent after it on the same connection. Responses
//     are matched by opaque, never by order, exactly as RocketMQ clients expect.
//   - Inline requests. A Handler that implements InlineHandler is asked, per request, whether
//     serving it never blocks; such a request is served on the connection's read goroutine,
//     before the next frame is read, with no goroutine hand-off. The broker says so for
//     sends to an existing topic whose message fits the active segment: an append to the
//     page cache costs less than waking a goroutine and growing its stack. With a SYNC_FLUSH
//     store such a send is inline too: it appends, and its answer waits for the fsync
//     deferred (DeferInFlight, below), not on the read goroutine. Anything that would wait
//     on the goroutine serving it (a pull that may park, a lock, a disk sync, a network call) is
//     not inline, so that it cannot hold up the requests behind it. An inline request is
//     admitted and counted in flight like any other, keeps the connection from closing idle
//     while it runs, has its panic recovered and answered SYSTEM_ERROR, and its response
//     queued for the flusher; Defer refuses it. A Handler that also implements
//     LendingInlineHandler gets an inline request's body straight from the read buffer
//     (valid until it returns), saving a copy and an allocation per request; everything
//     else gets a body of its own.
//   - The number of requests served at once on one connection is bounded
//     (MaxInFlightPerConn). Beyond it a request is answered SYSTEM_BUSY at once without running
//     the Handler, as RocketMQ's broker does when its executor queue is full: the client backs
//     off or retries elsewhere, and one greedy connection cannot take every goroutine.
//     A request deferred to wait for an event (Defer, below: a long-polling pull) counts
//     against a bound of its own instead (MaxParkedPerConn), so that a consumer with a
//     parked pull per queue still gets its heartbeats and commits through.
//   - Deferred answers. A Handler that waits for an event (a long-polling pull) calls Defer
//     and returns: the request keeps a parked slot, but no goroutine, until its Deferred is
//     answered, once, from any goroutine (Respond, or RespondFiles for a body of file
//     regions), through the same writer as every frame. A connection that closes first drops
//     its deferred requests and tells their owners (Defer's onDrop); a later answer is
//     refused and releases its regions. A goroutine's stack (4 KiB or more) is then no part
//     of what a waiting request costs. DeferInFlight does the same for an answer that waits
//     for work already under way (a SYNC_FLUSH send's fsync): the request keeps its
//     in-flight slot instead, and may be served inline.
//   - One writer per connection. Frames are queued and written by one writer at a time. A
//     caller that waits for its write (Invoke, InvokeOneway, a response of file regions) and
//     finds no write under way writes its frame at once; responses and InvokeAsync requests
//     are queued for the connection's flusher goroutine (below), so the goroutine that made
//     them is free at once. Frames queued during a write leave together in the next one (one
//     write(2), or writev for large batches), written by one of their callers or the
//     flusher. Nothing waits for more frames: a lone request or response pays one write, and
//     frames that arrive together share one. A failed write fails every frame of its batch
//     and closes the connection.
//   - A response body may be regions of files (RespondWithFiles): the frame's header goes
//     into the batch like any frame, then each region is sent with sendfile(2) from the
//     file (Linux, TCP, regions of at least SendfileThreshold bytes) or copied into the
//     batch's buffer, before the next frame of the batch, so frames never mix. Small regions
//     are copied because a sendfile per kilobyte costs more than the copy it saves
//     (BenchmarkFileRegions). A region that cannot be read whole once its header is out
//     closes the connection, like a failed write.
//   - Conn.InvokeAsync (and Client.InvokeAsync) sends a request without a goroutine waiting
//     for it: the frame is queued, the connection's flusher goroutine (started on demand,
//     ended after 5 s without work) writes whatever is queued whenever no write is under
//     way, and the response runs the caller's callback on the read goroutine; its deadline
//     or the context ends the call otherwise. Deadlines are kept per timeout in a queue with
//     one timer (calls made with one timeout expire in the order they were made), not a
//     timer per call; a connection keeps four such queues, and a call with a fifth timeout
//     gets a timer. Likewise the calls pending with one context share one context.AfterFunc
//     (ctxWatch), stopped when the last of them ends. InvokeAsyncRaw hands the outcome to an AsyncReceiver (no closure per
//     call) and a binary response without its ExtFields map: responses are read with their
//     fields raw, and the map is built only for the callers that read it. Such a receiver
//     keeps nothing of the response's Command, so the read goroutine decodes the next frame
//     into it (protocol.ReadOptions.Into); finished calls go back to a pool of the
//     connection, and a deadline queue tells its entry of a call from the call's later use
//     by a generation number. A caller sending
//     many requests in a row thus only encodes and queues them, and they leave in few writes
//     while the kernel takes the previous one. A writer that finds only such frames queued
//     behind its own hands them to the flusher; one that finds a caller waiting hands them
//     to that caller. Frames without file regions are encoded in
//     place, one after another, into the connection's queue buffer, which is written as it
//     is: no buffer per frame, no copy to gather a batch. They are encoded under the queue's
//     lock (a microsecond for a 1 KiB send), so that they lie in the buffer in queue order.
//   - A frame that fits the read buffer (16 KiB) is decoded in place and its body copied out
//     (unless lent, above):
//     a response without a body costs no buffer of its own. A Handler that implements
//     RawExtHandler gets the binary-header requests it names without their ExtFields map
//     (protocol.Command.RawExt, read with Command.Ext or the typed decoders): the broker
//     decodes a send's header straight from it, which spares the map and its hashing.
//   - A request stops counting against MaxInFlightPerConn when its Handler returns, before
//     its response is written, so that a client pipelining at the bound is not refused; it
//     still keeps the connection from closing as idle until the response is out. Goroutines
//     that served a request wait for the connection's next one (up to 16 per connection)
//     rather than exit, keeping the stack they grew. On a Server, a connection on which
//     nothing happened since the sweeper's last look and nothing is in flight lets them
//     go, with its queue and gathered write buffers, also when deferred requests wait on it
//     (a consumer's, its long-polling pulls parked): a quiet connection keeps only its read
//     goroutine and read buffer (about 32 KiB, BenchmarkIdleConnMemory in the broker).
//   - A broken frame (a length prefix out of range, a header length beyond the frame, a
//     stream that ends mid-frame) closes that connection alone: the stream can no longer be
//     trusted to be in step. The reason is logged and is the cause in Conn.Err. A frame that
//     arrived whole but whose header cannot be read (invalid JSON, a field of the wrong type,
//     an unknown serialize type) leaves the stream in step: the request is answered
//     INVALID_PARAMETER when its opaque could be read (a response completes its call with
//     SYSTEM_ERROR), and the connection goes on.
//   - A frame's buffer grows as its bytes arrive, and on a Server a frame must arrive within
//     FrameReadTimeout of its first byte; the Server also caps its connections (MaxConns).
//     A peer that announces large frames and stalls holds little, and not for long.
//   - A Server's OnConnClose runs after every Handler call for that connection has returned,
//     so a consumer manager that unregisters a client there cannot be overtaken by a heartbeat
//     still being served on the dead connection.
//
// # Lock order
//
// Server.mu and Client.mu are leaves: neither is held while another lock is taken, and no
// callback runs under them. Within a Conn the write lock (wmu) may be taken before the
// pending-call lock (pmu), never the other way round; the write queue's lock (qmu) and the
// deferred list's (dmu) are leaves. conn.go says why.
package remoting
