package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/flowd-io/flowd/protocol"
)

// Store is a RocketMQ-style message store: one commit log and a consume queue per
// (topic, queue id). All methods are safe for concurrent use.
//
// # Lock order
//
// A goroutine holding a lock may only take locks further down this list:
//
//	Store.mu          appends: active segment, write position, queue-offset table, closed
//	Store.waitMu      the group commit's waiters (taken under Store.mu by appends)
//	Store.flushRun    serializes commit-log fsyncs
//	Store.cpMu        serializes consume-queue fsyncs and checkpoint writes
//	Store.segMu       the segment list (readers, roll, retention)
//	segment.mu        one segment's memory mapping (readers and the prefaulter share it; unmap)
//	Store.cqMu        the consume-queue registry
//	consumeQueue.mu   one queue's file list
//	Store.notifyMu    the dispatch notification channel (leaf)
//
// The dispatcher takes no lock above segMu, so Store.mu holders may wait for it.
type Store struct {
	dir    string
	opts   Options
	fs     vfs.FS
	log    *slog.Logger
	lockf  io.Closer
	clDir  string
	cqRoot string

	mu      sync.Mutex
	closed  bool
	closedA atomic.Bool // closed, for readers that must not take mu
	wpos    int64       // next append offset, == written under mu
	lastTs  int64       // last store timestamp handed out, keeps them monotonic
	active  *segment
	qoff    map[qkey]*int64 // next queue offset of each queue; see nextQueueOffsetLocked
	dead    tombstones      // deleted topics; see deletedFile

	flushRun sync.Mutex
	cpMu     sync.Mutex
	cp       vfs.File // checkpoint file, under cpMu

	segMu sync.RWMutex
	segs  []*segment // contiguous and ascending; the last is the active one

	cqMu sync.RWMutex
	cqs  map[string]map[int32]*consumeQueue
	// cqMmap: the dispatcher writes consume-queue units through mappings (mapCQFile). Set
	// once recovery is done (recovery writes with pwrite), before the dispatcher starts.
	cqMmap bool
	// cqMaps counts the consume-queue files mapped now; past cqMapCap (maxCQMaps) more go
	// by pwrite. Every queue keeps its current file mapped, and the process shares
	// vm.max_map_count (65530 by default) with the Go runtime's own mappings and the
	// commit-log segments: running out fails the runtime's next mmap, fatally.
	cqMaps   atomic.Int64
	cqMapCap int64

	lastTopic atomic.Pointer[string] // the topic encode last found valid (topicOK)

	notifyMu   sync.Mutex
	dispatchCh chan struct{} // closed and replaced when dispatched advances or the store fails

	written    atomic.Int64 // [minOffset, written) is in the page cache
	flushed    atomic.Int64 // [minOffset, flushed) is durable
	flushedAt  atomic.Int64 // wall time (ms) when the last commit-log fsync started
	dispatched atomic.Int64 // consume queues cover [minOffset, dispatched)
	minOffset  atomic.Int64
	fsyncs     atomic.Int64
	// readErrors counts failed reads of store files (Stats.ReadErrors); segments, queues
	// and the key index count into it.
	readErrors atomic.Int64
	// dispatchHolds counts the dispatcher's holds after a busy pass (dispatchBatchWait), so
	// that the tests can tell a hold from a quick dispatch without timing it.
	dispatchHolds atomic.Int64
	failure       atomic.Pointer[error]
	// onAppend and onFlush are a replica set's hooks (SetAppendHook, SetFlushHook): called
	// after the commit log grew, and after an fsync moved the flushed end.
	onAppend, onFlush atomic.Pointer[func()]

	activeSeg atomic.Pointer[segment] // the active segment, for the prefaulter and AppendReady
	// zeroFrom is the commit-log offset from which the prefaulter is writing zeros into the
	// mapped active segment right now (math.MaxInt64 when it is not), and zeroDone is closed
	// when it has; see zeroMapped.
	zeroFrom atomic.Int64
	zeroDone chan struct{} // set under mu
	// zeroWrites counts zeroMapped's writes, so that the tests can tell it ran.
	zeroWrites  atomic.Int64
	prefaultReq chan struct{} // cap 1: "the write position moved a step"
	flushReq    chan struct{} // cap 1: "a synchronous appender waits"
	commitReq   chan struct{} // cap 1: "flushed moved, the store failed, or the first waiter came"
	dispatchReq chan struct{} // cap 1: "the commit log grew"
	stop        chan struct{}
	wg          sync.WaitGroup

	// The group commit's waiters (FlushSync): appends waiting for the fsync that covers
	// them, in the order of their end offsets. See groupcommit.go.
	waitMu  sync.Mutex
	waiters []flushWaiter // guarded by waitMu

	index *keyIndex // nil with Options.DisableIndex; see index.go

	encPool  sync.Pool // *[]byte encode buffers
	readPool sync.Pool // *[]byte GetMessage buffers
	winPool  sync.Pool // *filterWindow of GetMessage with a batch filter

	recovery RecoveryReport
}

type qkey struct {
	topic string
	qid   int32
}

const (
	commitLogDir     = "commitlog"
	consumeQueueDir  = "consumequeue"
	abortFile        = "abort"
	checkpointFile   = "checkpoint"
	lockFileName     = "lock"
	offsetWidth      = 20
	encBufRetain     = 1 << 20 // larger encode buffers are not pooled
	readBufInitial   = 256 << 10
	readBufRetainMax = 8 << 20
)

// Open opens (creating if needed) the store in dir, recovers it, and starts its background
// loops: dispatch, flush, checkpoint and retention.
//
// Open locks dir: a second Open of the same directory, from this process or another, fails
// with ErrLocked. Recovery (see the package documentation) happens before Open returns; what
// it did is in Stats().Recovery and is logged.
func Open(dir string, opts Options) (*Store, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Store{
		dir:         dir,
		opts:        o,
		fs:          o.FS,
		log:         o.Logger.With("store", dir),
		clDir:       filepath.Join(dir, commitLogDir),
		cqRoot:      filepath.Join(dir, consumeQueueDir),
		qoff:        make(map[qkey]*int64),
		cqs:         make(map[string]map[int32]*consumeQueue),
		dispatchCh:  make(chan struct{}),
		flushReq:    make(chan struct{}, 1),
		commitReq:   make(chan struct{}, 1),
		prefaultReq: make(chan struct{}, 1),
		dispatchReq: make(chan struct{}, 1),
		stop:        make(chan struct{}),
	}
	s.zeroFrom.Store(math.MaxInt64)
	for _, d := range []string{dir, s.clDir, s.cqRoot} {
		if err := s.fs.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
	}
	lk, err := s.fs.Lock(filepath.Join(dir, lockFileName))
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", dir, err)
	}
	s.lockf = lk
	if err := s.recover(); err != nil {
		s.closeFiles()
		lk.Close()
		return nil, fmt.Errorf("open store %s: %w", dir, err)
	}
	s.cqMmap = !o.DisableMmap
	s.cqMapCap = maxCQMaps
	s.wg.Add(5)
	go s.prefaultLoop()
	signal(s.prefaultReq)
	go s.dispatchLoop()
	if o.FlushMode == FlushSync {
		s.wg.Add(1)
		go s.syncFlushLoop()
		go s.commitLoop()
	} else {
		go s.asyncFlushLoop()
	}
	go s.checkpointLoop()
	go s.cleanLoop()
	return s, nil
}

// Close stops the background loops, lets the dispatcher finish, fsyncs the commit log and
// the consume queues, writes the checkpoint and removes the abort marker, so that the next
// Open is a clean start. Concurrent Puts fail with ErrClosed; reads fail once files close.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.closed = true
	s.closedA.Store(true)
	s.mu.Unlock()

	close(s.stop)
	s.wg.Wait() // the dispatcher drains to written before it exits

	var errs []error
	failed := s.writeFailure() != nil
	if !failed {
		if err := s.flushCommitLog(); err != nil {
			errs = append(errs, err)
		}
	}
	// No append can queue a waiter any more (closed is set): the final flush covered them,
	// or they learn that it did not.
	s.completeWaiters(nil, true)
	if !failed {
		if err := s.checkpoint(); err != nil {
			errs = append(errs, err)
		}
		// Before the abort marker goes: a clean Open reads the index's slot table back.
		if err := s.index.writeOut(); err != nil {
			errs = append(errs, err)
		}
	}
	// A store that failed keeps its abort marker: the next Open must validate and cut.
	if !failed && len(errs) == 0 {
		if err := s.fs.Remove(filepath.Join(s.dir, abortFile)); err != nil {
			errs = append(errs, fmt.Errorf("remove abort marker: %w", err))
		} else if err := s.fs.SyncDir(s.dir); err != nil {
			errs = append(errs, fmt.Errorf("sync %s: %w", s.dir, err))
		}
	}
	errs = append(errs, s.closeFiles())
	if err := s.lockf.Close(); err != nil {
		errs = append(errs, fmt.Errorf("release lock: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close store %s: %w", s.dir, err)
	}
	return nil
}

func (s *Store) closeFiles() error {
	var errs []error
	s.segMu.Lock()
	for _, seg := range s.segs {
		errs = append(errs, seg.unmap())
		if err := seg.retire(); err != nil {
			errs = append(errs, err)
		}
	}
	s.segs = nil
	s.segMu.Unlock()
	s.cqMu.Lock()
	for _, qs := range s.cqs {
		for _, q := range qs {
			errs = append(errs, q.close())
		}
	}
	s.cqs = map[string]map[int32]*consumeQueue{}
	s.cqMu.Unlock()
	errs = append(errs, s.index.close())
	s.cpMu.Lock()
	if s.cp != nil {
		errs = append(errs, s.cp.Close())
		s.cp = nil
	}
	s.cpMu.Unlock()
	return errors.Join(errs...)
}

// fail records the first write failure and wakes everyone waiting on flush or dispatch.
// From then on the store takes no writes. It logs loudly: an operator must look at the disk.
func (s *Store) fail(err error) error {
	err = fmt.Errorf("%w: %w", ErrWriteFailed, err)
	if s.failure.CompareAndSwap(nil, &err) {
		s.log.Error("store write failed; refusing further writes until reopened", "err", err)
		if s.opts.OnFailure != nil {
			go s.opts.OnFailure(err)
		}
		s.notifyDispatch()
		signal(s.commitReq)
	}
	return *s.failure.Load()
}

func (s *Store) writeFailure() error {
	if p := s.failure.Load(); p != nil {
		return *p
	}
	return nil
}

func (s *Store) notifyDispatch() {
	s.notifyMu.Lock()
	close(s.dispatchCh)
	s.dispatchCh = make(chan struct{})
	s.notifyMu.Unlock()
}

func (s *Store) dispatchWaitCh() chan struct{} {
	s.notifyMu.Lock()
	defer s.notifyMu.Unlock()
	return s.dispatchCh
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Stats returns a snapshot of the store's positions and counters.
func (s *Store) Stats() Stats {
	s.segMu.RLock()
	nseg := len(s.segs)
	s.segMu.RUnlock()
	s.cqMu.RLock()
	ncq := 0
	for _, qs := range s.cqs {
		ncq += len(qs)
	}
	s.cqMu.RUnlock()
	return Stats{
		CommitLogMinOffset: s.minOffset.Load(),
		CommitLogMaxOffset: s.written.Load(),
		DispatchedOffset:   s.dispatched.Load(),
		FlushedOffset:      s.flushed.Load(),
		Segments:           nseg,
		Fsyncs:             s.fsyncs.Load(),
		ConsumeQueues:      ncq,
		WriteFailure:       s.writeFailure(),
		ReadErrors:         s.readErrors.Load(),
		Recovery:           s.recovery,
	}
}

// Queues lists the (topic, queue ids) that have a consume queue, queue ids ascending.
func (s *Store) Queues() map[string][]int32 {
	s.cqMu.RLock()
	defer s.cqMu.RUnlock()
	out := make(map[string][]int32, len(s.cqs))
	for t, qs := range s.cqs {
		ids := make([]int32, 0, len(qs))
		for id := range qs {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		out[t] = ids
	}
	return out
}

// DeleteTopic removes the topic's consume queues and forgets its queue offsets. The commit
// log keeps the messages until retention removes them. A topic created again with the same
// name starts at queue offset 0.
//
// # Notes
//
// It waits for the dispatcher to catch up first (so no unit of the topic is in flight) and
// writes a checkpoint afterwards, so that a crash recovery does not re-dispatch the deleted
// topic's old messages into its new queues.
func (s *Store) DeleteTopic(topic string) error {
	if !validTopic(topic) {
		return fmt.Errorf("delete topic %q: %w", topic, ErrBadTopic)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if err := s.waitDispatched(context.Background(), s.wpos); err != nil {
		return fmt.Errorf("delete topic %q: %w", topic, err)
	}
	// Record the deletion durably before any file goes: a recovery that re-dispatches the
	// commit log must know that the topic's messages below here are dead.
	dead := maps.Clone(s.dead)
	if dead == nil {
		dead = tombstones{}
	}
	dead[topic] = s.wpos
	dead.prune(s.minOffset.Load()) // retention removed what older records cover
	if err := s.writeTombstones(dead); err != nil {
		return fmt.Errorf("delete topic %q: %w", topic, err)
	}
	s.dead = dead
	for k := range s.qoff {
		if k.topic == topic {
			delete(s.qoff, k)
		}
	}
	s.cqMu.Lock()
	qs := s.cqs[topic]
	delete(s.cqs, topic)
	s.cqMu.Unlock()
	var errs []error
	for _, q := range qs {
		errs = append(errs, q.close())
	}
	if err := s.fs.RemoveAll(filepath.Join(s.cqRoot, topic)); err != nil {
		errs = append(errs, err)
	}
	if err := s.fs.SyncDir(s.cqRoot); err != nil {
		errs = append(errs, err)
	}
	if err := s.flushCommitLog(); err != nil {
		errs = append(errs, err)
	}
	if err := s.checkpoint(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete topic %q: %w", topic, err)
	}
	s.log.Info("topic deleted", "topic", topic, "queues", len(qs))
	return nil
}

// waitDispatched blocks until the dispatcher has covered [.., off).
func (s *Store) waitDispatched(ctx context.Context, off int64) error {
	for {
		ch := s.dispatchWaitCh()
		if s.dispatched.Load() >= off {
			return nil
		}
		if err := s.writeFailure(); err != nil {
			return err
		}
		signal(s.dispatchReq)
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// topicOK is validTopic for encode, with a one-entry memo: a store's appends mostly go to
// a few topics, and checking every character of the name on every append was 0.6-0.8 % of
// a one-producer profile.
func (s *Store) topicOK(t string) bool {
	if p := s.lastTopic.Load(); p != nil && *p == t {
		return true
	}
	if !validTopic(t) {
		return false
	}
	valid := t // declared here, so that only a miss allocates
	s.lastTopic.Store(&valid)
	return true
}

// validTopic is protocol.ValidateTopic's rule, which also keeps "/" and ".." out of the
// directories named after topics.
func validTopic(t string) bool { return protocol.ValidateTopic(t) == nil }

func isNotExist(err error) bool { return errors.Is(err, os.ErrNotExist) }
