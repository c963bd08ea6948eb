package replication

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowd-io/flowd/broker/store"
)

// ReplicaConfig configures the following side of a replica set.
type ReplicaConfig struct {
	Store      *store.Store
	Epochs     *EpochFile
	Cluster    string
	BrokerName string
	Node       string
	// Master returns the current master's HA address ("" while none is known); it is asked
	// again before every connection attempt.
	Master func() string
	// OnSnapshot receives each named snapshot the master sends (offsets, tables). It runs
	// on the stream's goroutine.
	OnSnapshot func(name string, data []byte)
	// RetryInterval is the wait between connection attempts. Default 200 ms.
	RetryInterval time.Duration
	// AckInterval bounds how long a written or fsynced offset waits to be acknowledged:
	// a backstop, since a replica acknowledges after each write and each fsync the store
	// reports. Default 20 ms.
	AckInterval time.Duration
	// SilenceTimeout: a master that sent nothing (not even its heartbeat, every 500 ms by
	// default) for this long is taken for gone, and the replica dials the master the lease
	// names then. Default 2 s.
	SilenceTimeout time.Duration
	Logger         *slog.Logger
}

// Follower is a replica's view of its stream, for status and metrics.
type Follower struct {
	cfg       ReplicaConfig
	masterEnd atomic.Int64
	lagMs     atomic.Int64
	connected atomic.Bool
	epoch     atomic.Int64
}

// NewFollower prepares a replica; Run streams.
func NewFollower(cfg ReplicaConfig) *Follower {
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = 200 * time.Millisecond
	}
	if cfg.AckInterval == 0 {
		cfg.AckInterval = 20 * time.Millisecond
	}
	if cfg.SilenceTimeout == 0 {
		cfg.SilenceTimeout = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Follower{cfg: cfg}
}

// LagBytes is how far the replica's log is behind the master's end as last reported.
func (f *Follower) LagBytes() int64 {
	written, _ := f.cfg.Store.Positions()
	return max(0, f.masterEnd.Load()-written)
}

// Connected reports whether the replica is following a master now.
func (f *Follower) Connected() bool { return f.connected.Load() }

// Run follows the master until ctx is done, reconnecting after errors. It returns a
// *DivergedError when the log must be cut first, and an error wrapping ErrRefused when the
// master will not have it; ctx's error otherwise.
func (f *Follower) Run(ctx context.Context) error {
	for {
		err := f.once(ctx)
		var div *DivergedError
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.As(err, &div), errors.Is(err, ErrRefused):
			return err
		case err != nil:
			f.cfg.Logger.Debug("replication stream ended; retrying", "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(f.cfg.RetryInterval):
		}
	}
}

// once runs one connection to the master.
func (f *Follower) once(ctx context.Context) error {
	addr := ""
	if f.cfg.Master != nil {
		addr = f.cfg.Master()
	}
	if addr == "" {
		return errors.New("no master known")
	}
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	c, err := d.DialContext(dctx, "tcp", addr)
	cancel()
	if err != nil {
		return fmt.Errorf("dial master %s: %w", addr, err)
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	defer c.Close()
	r, w := bufio.NewReaderSize(c, 256<<10), bufio.NewWriterSize(c, 4<<10)
	end := f.cfg.Store.Stats().CommitLogMaxOffset
	// A paused master accepts the connection (its kernel does) and never answers: the
	// handshake's deadline bounds that, and watchMaster ends it as soon as the lease names
	// another master.
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if f.cfg.Master != nil {
		moved := f.watchMaster(ctx, addr, c)
		defer moved()
	}
	if err := writeJSON(w, frameHello, hello{
		Cluster: f.cfg.Cluster, BrokerName: f.cfg.BrokerName, Node: f.cfg.Node,
		SegmentSize: f.cfg.Store.SegmentSize(), End: end, Epochs: f.cfg.Epochs.Epochs(), Set: f.cfg.Epochs.Identity(),
	}); err != nil {
		return fmt.Errorf("send hello to %s: %w", addr, err)
	}
	var wl welcome
	if err := readJSON(r, frameWelcome, &wl); err != nil {
		return fmt.Errorf("read welcome from %s: %w", addr, err)
	}
	mine := f.cfg.Epochs.Identity()
	switch {
	case wl.Error != "":
		return fmt.Errorf("master %s: %s: %w", addr, wl.Error, ErrRefused)
	case wl.Set != 0 && mine != 0 && wl.Set != mine:
		// A master that did not check (an older version): the replica refuses it itself.
		return fmt.Errorf("master %s: %s: %w", addr, otherSet(mine, wl.Set), ErrRefused)
	case wl.Epoch < f.cfg.Epochs.Last().Epoch:
		return fmt.Errorf("master %s has epoch %d, the replica %d: %w", addr, wl.Epoch, f.cfg.Epochs.Last().Epoch, ErrStaleMaster)
	case wl.TruncateTo >= 0 && wl.TruncateTo < end:
		return &DivergedError{TruncateTo: wl.TruncateTo, End: end}
	}
	if mine == 0 && wl.Set != 0 {
		// An empty history, or one written before identities: it is the master's set's.
		if err := f.cfg.Epochs.SetIdentity(wl.Set); err != nil {
			return fmt.Errorf("adopt the replica set identity of master %s: %w", addr, err)
		}
		f.cfg.Logger.Info("replica set identity adopted from the master", "master", addr, "set", wl.Set.String())
	}
	if err := f.recordEmptyTerms(end, wl.Epochs); err != nil {
		return fmt.Errorf("record the terms of master %s: %w", addr, err)
	}
	_ = c.SetDeadline(time.Time{})
	f.connected.Store(true)
	defer f.connected.Store(false)
	f.cfg.Logger.Info("following master", "master", addr, "epoch", wl.Epoch, "from", end)
	return f.follow(ctx, c, r, w)
}

// recordEmptyTerms writes, into an empty member's empty history, the master's terms that
// start at offset 0 (terms that wrote nothing yet, or the first of the log): true of this
// member's log too, which ends there. It is what keeps an adopted identity on disk before
// any message came (an empty history is never written), so that a whole set restarted
// before its first message still has one identity, whichever member is elected then. The
// frames that follow add those terms again, a no-op.
func (f *Follower) recordEmptyTerms(end int64, master []Epoch) error {
	if end != 0 || len(f.cfg.Epochs.Epochs()) != 0 {
		return nil
	}
	for _, e := range master {
		if e.Start != 0 {
			break
		}
		if err := f.cfg.Epochs.Add(e); err != nil {
			return err
		}
	}
	return nil
}

// watchMaster closes c once the lease names a master other than addr (a new one, never
// "none"), so that a replica following a master that was deposed without closing its
// stream (paused, cut off) dials the new one at once rather than after its silence.
func (f *Follower) watchMaster(ctx context.Context, addr string, c net.Conn) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(f.cfg.RetryInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-done:
				return
			case <-t.C:
				if m := f.cfg.Master(); m != "" && m != addr {
					f.cfg.Logger.Info("the lease names another master: leaving this one", "master", addr, "next", m)
					c.Close()
					return
				}
			}
		}
	}()
	return func() { close(done) }
}

// follow appends the master's records and acknowledges them. The reader acknowledges what
// it wrote itself once it has read all the master sent (no hand-off on the path of a sync
// send); while more is buffered it leaves the acknowledgement to the ack loop, woken by the
// append, by every fsync the store reports and every AckInterval, so that reading the next
// frame never waits for an ack to be written and a burst is acknowledged in few frames.
func (f *Follower) follow(ctx context.Context, c net.Conn, r *bufio.Reader, w *bufio.Writer) error {
	kick := make(chan struct{}, 1)
	wake := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	a := &acker{w: w, st: f.cfg.Store, sentW: -1, sentF: -1}
	f.cfg.Store.SetFlushHook(wake)
	defer f.cfg.Store.SetFlushHook(nil)
	ackErr := make(chan error, 1)
	done := make(chan struct{}) // the read side ended: the ack loop ends too
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ackErr <- f.ackLoop(ctx, a, kick, done)
		c.Close()
	}()
	defer wg.Wait()
	defer close(done)
	defer c.Close()
	var buf []byte
	for {
		// A silent master (no heartbeat) is gone: read with a deadline.
		_ = c.SetReadDeadline(time.Now().Add(f.cfg.SilenceTimeout))
		typ, b, err := readFrame(r, buf)
		buf = b
		if err != nil {
			select {
			case aerr := <-ackErr:
				if aerr != nil {
					return aerr
				}
			default:
			}
			return err
		}
		switch typ {
		case frameData:
			if err := f.apply(b); err != nil {
				return err
			}
			if r.Buffered() > 0 {
				wake()
			} else if err := a.ack(); err != nil {
				return err
			}
		case frameSnapshot:
			name, data, err := decodeSnapshot(b)
			if err != nil {
				return err
			}
			if f.cfg.OnSnapshot != nil {
				f.cfg.OnSnapshot(name, data)
			}
		default:
			return fmt.Errorf("frame type %d from master: %w", typ, ErrProtocol)
		}
	}
}

// acker writes a replica's acknowledgements, from the reader or the ack loop.
type acker struct {
	mu           sync.Mutex
	w            *bufio.Writer
	st           *store.Store
	sentW, sentF int64
}

// ack sends the store's written and flushed ends unless the master has them already.
func (a *acker) ack() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	written, flushed := a.st.Positions()
	if written == a.sentW && flushed == a.sentF {
		return nil
	}
	a.sentW, a.sentF = written, flushed
	if err := writeFrame(a.w, frameAck, encodeAck(written, flushed)); err != nil {
		return err
	}
	return a.w.Flush()
}

// apply appends one data frame, recording its epoch first if it is new.
func (f *Follower) apply(b []byte) error {
	h, recs, err := decodeData(b)
	if err != nil {
		return err
	}
	f.masterEnd.Store(max(h.MasterEnd, h.Offset+int64(len(recs))))
	f.lagMs.Store(max(0, time.Now().UnixMilli()-h.MasterTime))
	last := f.cfg.Epochs.Last()
	switch {
	case h.Epoch < last.Epoch:
		return fmt.Errorf("records of epoch %d at %d, the replica is at epoch %d: %w", h.Epoch, h.Offset, last.Epoch, ErrStaleMaster)
	case h.Epoch > last.Epoch || len(f.cfg.Epochs.Epochs()) == 0:
		if len(recs) == 0 {
			break // a heartbeat: the epoch is recorded with its first record
		}
		if err := f.cfg.Epochs.Add(Epoch{Epoch: h.Epoch, Start: h.EpochStart}); err != nil {
			return fmt.Errorf("record epoch %d: %w", h.Epoch, err)
		}
	}
	f.epoch.Store(h.Epoch)
	if len(recs) == 0 {
		return nil
	}
	if _, err := f.cfg.Store.AppendRaw(h.Offset, recs); err != nil {
		return fmt.Errorf("append records of epoch %d at %d: %w", h.Epoch, h.Offset, err)
	}
	return nil
}

func (f *Follower) ackLoop(ctx context.Context, a *acker, kick, done chan struct{}) error {
	t := time.NewTicker(f.cfg.AckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
			return nil
		case <-kick:
		case <-t.C:
		}
		if err := a.ack(); err != nil {
			return err
		}
	}
}
