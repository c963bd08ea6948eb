package replication

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowd-io/flowd/broker/store"
)

// MasterConfig configures the serving side of a replica set.
type MasterConfig struct {
	Store  *store.Store
	Epochs *EpochFile
	// Epoch is this master's term; StartMaster records it in Epochs at the store's end.
	Epoch      int64
	Cluster    string
	BrokerName string
	// Sync makes Await wait for MinInSync members; otherwise Await completes at once.
	Sync bool
	// MinInSync counts the master: 2 is the master and one replica. Default 2.
	MinInSync int
	// A replica is in sync while it is within MaxLagBytes of the master's end and has been
	// so within the last MaxLagTime. Defaults 4 MiB and 5 s.
	MaxLagBytes int64
	MaxLagTime  time.Duration
	// ChunkBytes bounds one data frame. Default 256 KiB.
	ChunkBytes int
	// Heartbeat is how often an idle stream sends an empty data frame. Default 500 ms.
	Heartbeat time.Duration
	// AsyncPace is, in async mode, the least time between two looks of a stream that
	// reached the log's end, so that a trickle of sends costs each replica one frame (and
	// one acknowledgement) per AsyncPace rather than one per send, on cores the master's
	// own sends need; it bounds what async mode adds to a replica's lag. 0: none, every
	// append is sent at once, as in sync mode, where every send waits for it.
	AsyncPace time.Duration
	// Snapshots, if set, is called every SnapshotInterval (default 1 s) and each named
	// snapshot it returns is sent to every replica.
	Snapshots        func() map[string][]byte
	SnapshotInterval time.Duration
	// OnInSyncChange is called (on a goroutine of the master's) with the new in-sync set
	// of replica nodes whenever it changes.
	OnInSyncChange func(nodes []string)
	Logger         *slog.Logger
}

func (c *MasterConfig) defaults() {
	if c.MinInSync == 0 {
		c.MinInSync = 2
	}
	if c.MaxLagBytes == 0 {
		c.MaxLagBytes = 4 << 20
	}
	if c.MaxLagTime == 0 {
		c.MaxLagTime = 5 * time.Second
	}
	if c.ChunkBytes == 0 {
		c.ChunkBytes = 256 << 10
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = 500 * time.Millisecond
	}
	if c.SnapshotInterval == 0 {
		c.SnapshotInterval = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// ReplicaStatus is what the master knows of one connected replica.
type ReplicaStatus struct {
	Node    string `json:"node"`
	Addr    string `json:"addr"`
	Written int64  `json:"written"`
	Flushed int64  `json:"flushed"`
	// LagBytes is the master's end less what the replica acknowledged; LagTime how long
	// ago it was last within MaxLagBytes.
	LagBytes int64         `json:"lag_bytes"`
	LagTime  time.Duration `json:"lag_time"`
	InSync   bool          `json:"in_sync"`
}

// Master serves a replica set's commit log to its replicas.
type Master struct {
	cfg MasterConfig
	ln  net.Listener

	notifyMu sync.Mutex
	notifyCh chan struct{} // closed and replaced when the log grows
	idle     atomic.Int32  // streams waiting on notifyCh: Notify costs nothing while none is

	// chunk is the last chunk of the log a stream read: the other streams, woken by the
	// same append, send it too rather than read and copy it again.
	chunkMu sync.Mutex
	chunk   chunk

	mu      sync.Mutex
	reps    map[*peer]struct{}
	waiters []waiter // by end offset, ascending
	inSync  []string
	closed  bool

	stop chan struct{}
	wg   sync.WaitGroup
}

type peer struct {
	node, addr string
	conn       net.Conn
	// guarded by Master.mu
	written, flushed int64
	caughtUp         time.Time
}

type chunk struct {
	pos, next int64
	limit     int
	b         []byte
}

// readChunk is Store.ReadRaw(pos, limit), or the chunk another stream read there. The
// bytes are shared and never written to.
func (m *Master) readChunk(pos int64, limit int) ([]byte, int64, error) {
	m.chunkMu.Lock()
	c := m.chunk
	m.chunkMu.Unlock()
	if c.b != nil && c.pos == pos && c.limit == limit {
		return c.b, c.next, nil
	}
	b, next, err := m.cfg.Store.ReadRaw(pos, limit)
	if err == nil && len(b) > 0 {
		m.chunkMu.Lock()
		m.chunk = chunk{pos: pos, next: next, limit: limit, b: b}
		m.chunkMu.Unlock()
	}
	return b, next, err
}

type waiter struct {
	end      int64
	deadline time.Time
	done     func(error)
}

// StartMaster records cfg.Epoch in the epoch history and serves replicas on ln until
// Close.
func StartMaster(ln net.Listener, cfg MasterConfig) (*Master, error) {
	cfg.defaults()
	end := cfg.Store.Stats().CommitLogMaxOffset
	if cfg.Epochs.Identity() == 0 {
		// A new set's first master, or a history written before identities: this master
		// chooses the set's identity, which its replicas adopt.
		id := NewSetID()
		if err := cfg.Epochs.SetIdentity(id); err != nil {
			return nil, fmt.Errorf("start master of epoch %d: %w", cfg.Epoch, err)
		}
		cfg.Logger.Info("replica set identity chosen", "broker", cfg.BrokerName, "set", id.String())
	}
	if len(cfg.Epochs.Epochs()) == 0 && end > 0 {
		// A log written before replication was configured: call it epoch 0.
		if err := cfg.Epochs.Add(Epoch{Epoch: 0, Start: 0}); err != nil {
			return nil, err
		}
	}
	if last := cfg.Epochs.Last(); last.Epoch != cfg.Epoch || len(cfg.Epochs.Epochs()) == 0 {
		if err := cfg.Epochs.Add(Epoch{Epoch: cfg.Epoch, Start: end}); err != nil {
			return nil, fmt.Errorf("start master of epoch %d: %w", cfg.Epoch, err)
		}
	}
	m := &Master{cfg: cfg, ln: ln, notifyCh: make(chan struct{}), reps: map[*peer]struct{}{}, stop: make(chan struct{})}
	// Every append wakes an idle stream, in either mode: an async-mode replica too is
	// behind by the stream's latency, not by its heartbeat.
	cfg.Store.SetAppendHook(m.Notify)
	m.wg.Add(2)
	go m.acceptLoop()
	go m.sweepLoop()
	return m, nil
}

// Addr is the listener's address.
func (m *Master) Addr() net.Addr { return m.ln.Addr() }

// Epoch is the master's term.
func (m *Master) Epoch() int64 { return m.cfg.Epoch }

// Close stops serving, drops the replicas' connections and fails pending waiters.
func (m *Master) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.cfg.Store.SetAppendHook(nil)
	for p := range m.reps {
		p.conn.Close()
	}
	ws := m.waiters
	m.waiters = nil
	m.mu.Unlock()
	close(m.stop)
	err := m.ln.Close()
	m.wg.Wait()
	for _, w := range ws {
		w.done(ErrClosed)
	}
	return err
}

// Notify tells the streams that the log grew. The store calls it after every append (the
// hook StartMaster sets); a stream also looks every Heartbeat on its own.
func (m *Master) Notify() {
	if m.idle.Load() == 0 {
		return // every stream is reading, and reads on to the end before it waits
	}
	m.notifyMu.Lock()
	close(m.notifyCh)
	m.notifyCh = make(chan struct{})
	m.notifyMu.Unlock()
}

func (m *Master) notified() chan struct{} {
	m.notifyMu.Lock()
	defer m.notifyMu.Unlock()
	return m.notifyCh
}

// Await calls done once the record ending at end is held by MinInSync members (in sync
// mode; at once in async mode), or with ErrNotEnoughInSync if fewer are in sync now or
// they did not acknowledge it by deadline. done runs on the goroutine that completes it (an
// ack reader or the sweeper): it must not block.
func (m *Master) Await(end int64, deadline time.Time, done func(error)) {
	if !m.cfg.Sync {
		done(nil)
		return
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		done(ErrClosed)
		return
	}
	if n := len(m.inSync) + 1; n < m.cfg.MinInSync {
		m.mu.Unlock()
		done(fmt.Errorf("%d of %d required members in sync: %w", n, m.cfg.MinInSync, ErrNotEnoughInSync))
		return
	}
	if m.quorumLocked() >= end {
		m.mu.Unlock()
		done(nil)
		return
	}
	i, _ := slices.BinarySearchFunc(m.waiters, end, func(w waiter, e int64) int { return cmp.Compare(w.end, e) })
	m.waiters = slices.Insert(m.waiters, i, waiter{end: end, deadline: deadline, done: done})
	m.mu.Unlock()
}

// Wait is Await for a caller that can block: it returns when done would be called, or
// with ctx's error (the record may still be replicated).
func (m *Master) Wait(ctx context.Context, end int64) error {
	ch := make(chan error, 1)
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(time.Minute)
	}
	m.Await(end, deadline, func(err error) { ch <- err })
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// quorumLocked is the highest offset MinInSync members hold: the master's own end, and
// the (MinInSync-1)-th highest acknowledgement among in-sync replicas (fsynced under
// store.flush sync, written otherwise).
func (m *Master) quorumLocked() int64 {
	need := m.cfg.MinInSync - 1
	if need <= 0 {
		end, _ := m.cfg.Store.Positions()
		return end
	}
	acks := make([]int64, 0, 8) // on the stack: this runs on every acknowledgement
	for p := range m.reps {
		if slices.Contains(m.inSync, p.node) {
			acks = append(acks, m.held(p))
		}
	}
	if len(acks) < need {
		return -1
	}
	slices.Sort(acks)
	return acks[len(acks)-need]
}

func (m *Master) held(p *peer) int64 {
	if m.cfg.Store.SyncFlush() {
		return p.flushed
	}
	return p.written
}

// completeLocked takes the waiters the quorum now covers; the caller runs them unlocked.
func (m *Master) completeLocked() []waiter {
	q := m.quorumLocked()
	i := 0
	for i < len(m.waiters) && m.waiters[i].end <= q {
		i++
	}
	if i == 0 {
		return nil
	}
	done := slices.Clone(m.waiters[:i])
	m.waiters = slices.Delete(m.waiters, 0, i)
	return done
}

// InSync is the current in-sync set of replica nodes, sorted.
func (m *Master) InSync() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.inSync)
}

// InSyncCount is len(InSync()) without the copy: the broker asks on every send.
func (m *Master) InSyncCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.inSync)
}

// Replicas reports every connected replica.
func (m *Master) Replicas() []ReplicaStatus {
	end := m.cfg.Store.Stats().CommitLogMaxOffset
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]ReplicaStatus, 0, len(m.reps))
	for p := range m.reps {
		out = append(out, ReplicaStatus{
			Node: p.node, Addr: p.addr, Written: p.written, Flushed: p.flushed,
			LagBytes: max(0, end-p.written), LagTime: now.Sub(p.caughtUp), InSync: slices.Contains(m.inSync, p.node),
		})
	}
	slices.SortFunc(out, func(a, b ReplicaStatus) int { return cmp.Compare(a.Node, b.Node) })
	return out
}

// evaluateLocked recomputes the in-sync set; changed reports whether it moved.
func (m *Master) evaluateLocked(now time.Time) (changed bool) {
	end, _ := m.cfg.Store.Positions()
	set := make([]string, 0, 8) // on the stack: this runs on every acknowledgement
	for p := range m.reps {
		if end-p.written <= m.cfg.MaxLagBytes {
			p.caughtUp = now
		}
		if now.Sub(p.caughtUp) <= m.cfg.MaxLagTime && !slices.Contains(set, p.node) {
			set = append(set, p.node)
		}
	}
	slices.Sort(set)
	if slices.Equal(set, m.inSync) {
		return false
	}
	m.inSync = slices.Clip(slices.Clone(set))
	return true
}

// sweepLoop re-evaluates the in-sync set and fails waiters past their deadline.
func (m *Master) sweepLoop() {
	defer m.wg.Done()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case now := <-t.C:
			m.mu.Lock()
			changed := m.evaluateLocked(now)
			done := m.completeLocked()
			var late []waiter
			keep := m.waiters[:0]
			for _, w := range m.waiters {
				if now.After(w.deadline) {
					late = append(late, w)
				} else {
					keep = append(keep, w)
				}
			}
			m.waiters = keep
			set := slices.Clone(m.inSync)
			m.mu.Unlock()
			for _, w := range done {
				w.done(nil)
			}
			for _, w := range late {
				w.done(fmt.Errorf("record ending at %d not acknowledged by %d members in time: %w", w.end, m.cfg.MinInSync, ErrNotEnoughInSync))
			}
			if changed {
				m.inSyncChanged(set)
			}
		}
	}
}

func (m *Master) inSyncChanged(set []string) {
	m.cfg.Logger.Info("replication in-sync set changed", "broker", m.cfg.BrokerName, "epoch", m.cfg.Epoch, "in_sync", set)
	if m.cfg.OnInSyncChange != nil {
		m.cfg.OnInSyncChange(set)
	}
}

func (m *Master) acceptLoop() {
	defer m.wg.Done()
	for {
		c, err := m.ln.Accept()
		if err != nil {
			select {
			case <-m.stop:
			default:
				m.cfg.Logger.Error("replication listener failed", "err", err)
			}
			return
		}
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			if err := m.serve(c); err != nil && !errors.Is(err, net.ErrClosed) {
				m.cfg.Logger.Warn("replica connection ended", "remote", c.RemoteAddr().String(), "err", err)
			}
		}()
	}
}

// serve runs one replica's connection: handshake, then a sender streaming records and
// snapshots and this goroutine reading acks.
func (m *Master) serve(c net.Conn) error {
	defer c.Close()
	r, w := bufio.NewReaderSize(c, 64<<10), bufio.NewWriterSize(c, 256<<10)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var h hello
	if err := readJSON(r, frameHello, &h); err != nil {
		return fmt.Errorf("read hello: %w", err)
	}
	from, refuse := m.check(h)
	eps := m.cfg.Epochs.Epochs()
	set := m.cfg.Epochs.Identity()
	if refuse != "" {
		_ = writeJSON(w, frameWelcome, welcome{Error: refuse, Epochs: eps, TruncateTo: -1, Epoch: m.cfg.Epoch, Set: set})
		return fmt.Errorf("refused replica %s: %s", h.Node, refuse)
	}
	if from < h.End {
		m.cfg.Logger.Warn("replica log diverged; it must cut it", "node", h.Node, "end", h.End, "truncate_to", from)
		return writeJSON(w, frameWelcome, welcome{Epochs: eps, TruncateTo: from, Epoch: m.cfg.Epoch, Set: set})
	}
	if err := writeJSON(w, frameWelcome, welcome{Epochs: eps, TruncateTo: -1, Epoch: m.cfg.Epoch, Set: set}); err != nil {
		return fmt.Errorf("write welcome: %w", err)
	}
	_ = c.SetDeadline(time.Time{})
	p := &peer{node: h.Node, addr: c.RemoteAddr().String(), conn: c, written: h.End, flushed: h.End}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	m.reps[p] = struct{}{}
	m.mu.Unlock()
	m.cfg.Logger.Info("replica connected", "node", h.Node, "from", h.End, "epoch", m.cfg.Epoch)
	defer m.drop(p)

	sendErr := make(chan error, 1)
	go func() {
		sendErr <- m.stream(c, w, h.End)
		c.Close()
	}()
	err := m.readAcks(r, p) // ends with the connection, closed by either side
	c.Close()
	if serr := <-sendErr; serr != nil && !errors.Is(serr, net.ErrClosed) {
		return errors.Join(err, serr)
	}
	return err
}

// check validates a replica's hello and returns the offset to stream from, or why it is
// refused.
func (m *Master) check(h hello) (int64, string) {
	switch {
	case h.Cluster != m.cfg.Cluster || h.BrokerName != m.cfg.BrokerName:
		return 0, fmt.Sprintf("replica of %s/%s dialed the master of %s/%s", h.Cluster, h.BrokerName, m.cfg.Cluster, m.cfg.BrokerName)
	case h.SegmentSize != m.cfg.Store.SegmentSize():
		return 0, fmt.Sprintf("replica segment size %d, master's %d: they must be equal", h.SegmentSize, m.cfg.Store.SegmentSize())
	case h.Set != 0 && h.Set != m.cfg.Epochs.Identity():
		// Checked before the histories are compared: another set's log may look like a
		// diverged one ("epoch 1 at 0" in both), and nothing of it may be cut.
		return 0, otherSet(h.Set, m.cfg.Epochs.Identity())
	}
	st := m.cfg.Store.Stats()
	from := CommonOffset(m.cfg.Epochs.Epochs(), st.CommitLogMaxOffset, h.Epochs, h.End)
	if from < st.CommitLogMinOffset && h.End > 0 || from == 0 && st.CommitLogMinOffset > 0 {
		return 0, fmt.Sprintf("replica log ends at %d, the master's starts at %d: empty its data directory to copy the master afresh", from, st.CommitLogMinOffset)
	}
	return from, ""
}

// otherSet is why a replica holding the log of another set is refused.
func otherSet(replica, master SetID) string {
	return fmt.Sprintf("the replica's log is of replica set %s, the master's set is %s (%v): nothing of it was cut; give it an empty data directory to copy this set, or start it in its own set",
		replica, master, ErrOtherSet)
}

func (m *Master) drop(p *peer) {
	m.mu.Lock()
	delete(m.reps, p)
	changed := m.evaluateLocked(time.Now())
	set := slices.Clone(m.inSync)
	m.mu.Unlock()
	if changed {
		m.inSyncChanged(set)
	}
}

func (m *Master) readAcks(r *bufio.Reader, p *peer) error {
	var buf []byte
	for {
		typ, b, err := readFrame(r, buf)
		buf = b
		if err != nil {
			return err
		}
		if typ != frameAck {
			return fmt.Errorf("frame type %d from replica: %w", typ, ErrProtocol)
		}
		written, flushed, err := decodeAck(b)
		if err != nil {
			return err
		}
		m.mu.Lock()
		p.written, p.flushed = max(p.written, written), max(p.flushed, flushed)
		changed := m.evaluateLocked(time.Now())
		done := m.completeLocked()
		var set []string
		if changed {
			set = slices.Clone(m.inSync)
		}
		m.mu.Unlock()
		for _, w := range done {
			w.done(nil)
		}
		if changed {
			m.inSyncChanged(set)
		}
	}
}

// stream sends the log from pos, chunk by chunk (never across an epoch's start), waiting
// for appends when it is at the end, and snapshots every SnapshotInterval.
func (m *Master) stream(c net.Conn, w *bufio.Writer, pos int64) error {
	hb := time.NewTicker(m.cfg.Heartbeat)
	defer hb.Stop()
	snapEvery := time.NewTicker(m.cfg.SnapshotInterval)
	defer snapEvery.Stop()
	if err := m.sendSnapshots(w); err != nil {
		return err
	}
	var e Epoch
	beat := func() error { // an empty data frame: the master is alive, its log ends at pos
		h := dataHeader{Epoch: e.Epoch, EpochStart: e.Start, Offset: pos, MasterEnd: pos, MasterTime: time.Now().UnixMilli()}
		return writeFrame(w, frameData, h.encode())
	}
	var looked time.Time // an async stream's last look after a wake
	woke := false
	for {
		if woke {
			if err := m.pace(looked, w, hb.C, snapEvery.C, beat); err != nil {
				return err
			}
			looked, woke = time.Now(), false
		}
		ch := m.notified()
		eps := m.cfg.Epochs.Epochs()
		var epEnd int64
		e, epEnd, _ = EpochAt(eps, pos)
		limit := m.cfg.ChunkBytes
		if epEnd > pos {
			limit = int(min(int64(limit), epEnd-pos))
		}
		b, next, err := m.readChunk(pos, limit)
		if err != nil {
			return fmt.Errorf("stream from %d: %w", pos, err)
		}
		if len(b) > 0 {
			h := dataHeader{Epoch: e.Epoch, EpochStart: e.Start, Offset: pos, MasterEnd: next, MasterTime: time.Now().UnixMilli()}
			if err := writeData(c, w, h, b); err != nil {
				return err
			}
			pos = next
			continue
		}
		if err := w.Flush(); err != nil {
			return err
		}
		// Counted idle before looking again: an append between the read above and this
		// look is seen by the read below, one after it notifies.
		m.idle.Add(1)
		if w, _ := m.cfg.Store.Positions(); w > pos {
			m.idle.Add(-1)
			continue
		}
		select {
		case <-ch:
			woke = !m.cfg.Sync && m.cfg.AsyncPace > 0
		case <-hb.C:
			if err := beat(); err != nil {
				return err
			}
		case <-snapEvery.C:
			if err := m.sendSnapshots(w); err != nil {
				return err
			}
		case <-m.stop:
			m.idle.Add(-1)
			return ErrClosed
		}
		m.idle.Add(-1)
	}
}

// directData is the size from which a data frame's records go to the connection as they
// are (one writev with the frame's header) rather than copied into the buffered writer.
const directData = 32 << 10

// writeData writes one data frame: a large one straight to c, after what w holds.
func writeData(c net.Conn, w *bufio.Writer, h dataHeader, recs []byte) error {
	if len(recs) < directData {
		return writeFrame(w, frameData, h.encode(), recs)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	head := make([]byte, 5, 5+dataHeaderLen)
	binary.BigEndian.PutUint32(head, uint32(1+dataHeaderLen+len(recs)))
	head[4] = frameData
	bufs := net.Buffers{append(head, h.encode()...), recs}
	_, err := bufs.WriteTo(c)
	return err
}

// pace waits, in async mode, until AsyncPace has passed since looked, the stream's last look
// after a wake at the log's end: the appends meanwhile go in one frame. A wake after a
// quiet spell looks at once. Heartbeats and snapshots go on meanwhile.
func (m *Master) pace(looked time.Time, w *bufio.Writer, hb, snap <-chan time.Time, beat func() error) error {
	d := m.cfg.AsyncPace - time.Since(looked)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return nil
		case <-hb:
			if err := beat(); err != nil {
				return err
			}
			if err := w.Flush(); err != nil {
				return err
			}
		case <-snap:
			if err := m.sendSnapshots(w); err != nil {
				return err
			}
		case <-m.stop:
			return ErrClosed
		}
	}
}

func (m *Master) sendSnapshots(w *bufio.Writer) error {
	if m.cfg.Snapshots == nil {
		return nil
	}
	for name, data := range m.cfg.Snapshots() {
		if err := writeFrame(w, frameSnapshot, encodeSnapshot(name, data)...); err != nil {
			return err
		}
	}
	return w.Flush()
}
