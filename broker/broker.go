// Package broker is flowd's RocketMQ-compatible broker: the remoting server, the built-in
// name service, and the processors for every request code of the protocol, over the store in
// broker/store.
//
// # Lock order
//
// The broker's tables (topics, groups, consumers, producers, offsets, locks, long polling,
// pending transactions) each have their own mutex and never call into one another while
// holding it. The event bus's lock is a leaf below them all: the offset, group and consumer
// tables and the rebalance watch emit their events while they hold their own lock, so that
// events are numbered in the order the state changed. Emitting only queues the event for each
// subscriber's goroutine, so no subscriber runs under a table's lock and one may call back
// into the broker. Members are notified (NOTIFY_CONSUMER_IDS_CHANGED) only after every lock
// is released. The store's locks are below all of these.
package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// Broker serves RocketMQ clients. Create it with New, then Start; Shutdown stops it.
type Broker struct {
	cfg     Config
	log     *slog.Logger
	delays  []time.Duration
	started time.Time // when New returned, for Status's uptime

	store     *store.Store
	topics    *topicTable
	groups    *groupTable
	consumers *consumerManager
	producers *producerManager
	txn       *txnTable
	offsets   *offsetTable
	locks     *lockTable
	rebalance *rebalanceWatch // GroupRebalanced events from lock changes
	poll      *longPoll
	pop       *popTable // pop consumption (pop.go)
	events    *eventBus

	// deleteMu orders topic deletion against the broker's own deliveries into existing
	// topics (the delay service): a delivery holds it shared from its topic lookup to its
	// append, a deletion holds it exclusively, so a delivery either lands before the store
	// drops the topic's queues or sees the topic gone. Client sends do not take it, to keep
	// it off the send path: a send that found the topic before a deletion and appends after
	// the store dropped its queues is answered SUCCESS and stored past the tombstone, where
	// no route reads it until a topic of that name is created again.
	deleteMu sync.RWMutex

	// txnChecker takes check-backs for producers outside remoting (SetTransactionChecker).
	txnChecker atomic.Pointer[func(context.Context, TransactionCheck) bool]

	// consumeRate derives GET_CONSUME_STATS's consumeTps (handle_admin.go).
	consumeRate consumeRates

	ln, nsLn net.Listener
	server   *remoting.Server
	nsServer *remoting.Server
	addr     string // advertised broker address
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	// bgMu orders every wg.Add of a notification goroutine before Shutdown's wg.Wait: a
	// connection that closes while Shutdown runs (its server's Shutdown timed out) would
	// otherwise Add after Wait returned and outlive the broker and its closed store. Shutdown
	// cancels ctx under it, so ctx.Err() read under it says whether Wait may have begun.
	bgMu      sync.Mutex
	closeOnce sync.Once
	closeErr  error
}

// New opens the data directory (recovering the store if the last run crashed) and binds the
// listeners. Nothing is served until Start.
func New(c Config) (*Broker, error) {
	cfg, err := c.withDefaults()
	if err != nil {
		return nil, err
	}
	delays, err := parseDelayLevels(cfg.DelayLevels)
	if err != nil {
		return nil, err
	}
	events := newEventBus(cfg.Cluster, cfg.BrokerName, cfg.EventQueueSize)
	b := &Broker{cfg: cfg, log: cfg.Logger, delays: delays, started: time.Now(), events: events, consumers: newConsumerManager(events, cfg.Logger), producers: newProducerManager(), txn: newTxnTable(), locks: newLockTable(cfg.LockLease)}
	b.poll = newLongPoll(b.serveParked)
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.rebalance = newRebalanceWatch(cfg.RebalanceSettle, func(group string) map[protocol.MessageQueue]string {
		return b.locks.held(group, time.Now())
	}, events.emit)

	confDir := filepath.Join(cfg.DataDir, "config")
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	if b.topics, err = openTopicTable(filepath.Join(confDir, "topics.json"), 2*cfg.MaxGroups); err != nil {
		return nil, err
	}
	if b.groups, err = openGroupTable(filepath.Join(confDir, "subscriptionGroups.json"), cfg.MaxGroups); err != nil {
		return nil, err
	}
	if b.offsets, err = openOffsetTable(filepath.Join(confDir, "consumerOffset.json"), b.log); err != nil {
		return nil, err
	}
	if err := b.openPop(); err != nil {
		return nil, err
	}
	// fail closes what New opened from here on (listeners, pop journal, store).
	fail := func(err error) (*Broker, error) {
		b.closeListeners()
		b.pop.jnl.close()
		if b.store != nil {
			b.store.Close()
		}
		return nil, err
	}

	if b.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return fail(fmt.Errorf("broker listen %s: %w", cfg.Listen, err))
	}
	if cfg.NamesrvListen != "off" {
		if b.nsLn, err = net.Listen("tcp", cfg.NamesrvListen); err != nil {
			return fail(fmt.Errorf("name service listen %s: %w", cfg.NamesrvListen, err))
		}
	}
	bound := b.ln.Addr().(*net.TCPAddr).AddrPort()
	b.addr = cfg.AdvertisedAddr
	if b.addr == "" {
		b.addr = advertisable(bound).String()
	}

	sopts := cfg.Store
	if !sopts.StoreHost.IsValid() {
		// The store host goes into every message and its offset id: an IP, not a name.
		sopts.StoreHost = parseAddrPort(b.addr)
		if !sopts.StoreHost.IsValid() {
			sopts.StoreHost = advertisable(bound)
		}
	}
	sopts.OnDispatch = func(ev store.DispatchEvent) {
		b.poll.arrived(ev)
		b.pop.waiters.wake(ev.Topic)
	}
	// A parked pull or receive waits for the next message: the dispatcher must not hold it back.
	sopts.DispatchAwaited = func() bool { return b.poll.parked.Load() > 0 || b.pop.waiters.n.Load() > 0 }
	sopts.OnFailure = func(err error) {
		b.events.emit(Event{Type: StoreFailed, Time: time.Now(), Reason: err.Error()})
	}
	if b.store, err = store.Open(filepath.Join(cfg.DataDir, "store"), sopts); err != nil {
		return fail(err)
	}
	b.offsets.sync = b.store.Sync
	for _, c := range b.offsets.clamp(b.store.MaxOffset) {
		b.log.Warn("consumer offset lowered to the end of its queue: the commit log it pointed into did not survive",
			"group", c.group, "topic", c.topic, "queue", c.queueID, "offset", c.from, "max", c.to)
	}
	if err := b.createSystemTopics(); err != nil {
		return fail(err)
	}
	if err := b.loadTransactions(b.ctx); err != nil {
		return fail(fmt.Errorf("restore pending transactions: %w", err))
	}
	return b, nil
}

func (b *Broker) createSystemTopics() error {
	if !b.cfg.DisableAutoCreateTopics {
		tc := TopicConfig{Name: protocol.AutoCreateTopicKey, ReadQueueNums: 8, WriteQueueNums: 8, Perm: protocol.PermRead | protocol.PermWrite | protocol.PermInherit}
		if _, _, err := b.topics.createIfAbsent(tc); err != nil {
			return err
		}
	}
	if _, _, err := b.topics.createIfAbsent(b.replyTopicConfig()); err != nil {
		return err
	}
	tc := TopicConfig{Name: ScheduleTopic, ReadQueueNums: len(b.delays), WriteQueueNums: len(b.delays), Perm: protocol.PermRead | protocol.PermWrite}
	if cur, ok := b.topics.get(ScheduleTopic); !ok || cur.ReadQueueNums != len(b.delays) {
		if _, err := b.topics.put(tc); err != nil {
			return err
		}
	}
	return nil
}

// Start serves the broker and name service listeners and starts the background loops.
func (b *Broker) Start() error {
	opts := b.cfg.Transport.serverOptions()
	opts.Logger = b.log
	opts.OnConnClose = b.connClosed
	b.server = remoting.NewServer(brokerHandler{b}, opts)
	b.goServe(b.server, b.ln)
	if b.nsLn != nil {
		b.nsServer = remoting.NewServer(remoting.HandlerFunc(b.serveNamesrv), remoting.ServerOptions{Logger: b.log})
		b.goServe(b.nsServer, b.nsLn)
	}
	b.goLoop(func(ctx context.Context) { b.offsets.run(ctx, b.cfg.OffsetFlushInterval) })
	b.goLoop(b.popExpireLoop)
	b.goEvery(min(b.cfg.ClientExpiry/4, 5*time.Second), b.expire)
	b.goEvery(b.cfg.TableFlushInterval, b.flushTables) // Shutdown writes them once more
	b.goEvery(min(max(b.cfg.GroupRetention/4, 10*time.Millisecond), time.Minute), b.sweepGroups)
	b.goEvery(b.cfg.TransactionCheckInterval, b.checkTransactions)
	for level := range b.delays {
		b.goLoop(func(ctx context.Context) { b.scheduleLoop(ctx, level) })
	}
	return nil
}

func (b *Broker) goServe(s *remoting.Server, ln net.Listener) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		if err := s.Serve(ln); err != nil && !errors.Is(err, remoting.ErrServerClosed) {
			b.log.Error("server stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
}

func (b *Broker) goLoop(fn func(ctx context.Context)) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		fn(b.ctx)
	}()
}

// goEvery runs fn every interval until Shutdown.
func (b *Broker) goEvery(interval time.Duration, fn func(ctx context.Context, now time.Time)) {
	b.goLoop(func(ctx context.Context) {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				fn(ctx, now)
			}
		}
	})
}

// Addr is the broker's advertised address.
func (b *Broker) Addr() string { return b.addr }

// NamesrvAddr is the name service's address, or "" when it is off.
func (b *Broker) NamesrvAddr() string {
	if b.nsLn == nil {
		return ""
	}
	return b.nsLn.Addr().String()
}

// Subscribe calls fn for every broker event, in Seq order, until cancel is called or the
// broker shuts down. fn runs on a goroutine of its own, never on a request's, so it may take
// its time and call the broker (cancel included); events that find its queue
// (Config.EventQueueSize) full are dropped and counted in EventsDropped. cancel does not wait
// for a running fn. Shutdown delivers the events already queued before it returns (bounded
// by its context).
func (b *Broker) Subscribe(fn func(Event)) (cancel func()) { return b.events.subscribe(fn) }

// EventsDropped counts the events, over all subscribers, dropped because a subscriber's queue
// was full.
func (b *Broker) EventsDropped() uint64 { return b.events.dropped.Load() }

// Shutdown stops accepting connections, answers parked pulls, lets in-flight requests finish
// (bounded by ctx), persists consumer offsets, and closes the store, which flushes it and
// removes its abort marker.
func (b *Broker) Shutdown(ctx context.Context) error {
	b.closeOnce.Do(func() {
		var errs []error
		b.bgMu.Lock()
		b.cancel()
		b.bgMu.Unlock()
		b.poll.wakeAll()
		for _, s := range []*remoting.Server{b.nsServer, b.server} {
			if s != nil {
				if err := s.Shutdown(ctx); err != nil {
					errs = append(errs, fmt.Errorf("stop server: %w", err))
				}
			}
		}
		if b.server == nil {
			b.closeListeners()
		}
		b.wg.Wait()
		b.rebalance.close()
		b.events.close(ctx)
		if err := b.topics.flushIfDirty(); err != nil {
			errs = append(errs, err)
		}
		if err := b.groups.flushIfDirty(); err != nil {
			errs = append(errs, err)
		}
		if err := b.offsets.flush(); err != nil {
			errs = append(errs, err)
		}
		if err := b.closePop(); err != nil {
			errs = append(errs, err)
		}
		if err := b.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close store: %w", err))
		}
		b.closeErr = errors.Join(errs...)
	})
	return b.closeErr
}

func (b *Broker) closeListeners() {
	if b.ln != nil {
		b.ln.Close()
	}
	if b.nsLn != nil {
		b.nsLn.Close()
	}
}

// expire removes members that went silent and drops expired queue locks.
func (b *Broker) expire(_ context.Context, now time.Time) {
	b.membersChanged(b.consumers.expire(now.Add(-b.cfg.ClientExpiry)))
	b.producers.expire(now.Add(-b.cfg.ClientExpiry))
	for _, group := range b.locks.sweep(now) {
		b.rebalance.changed(group)
	}
}

// flushTables writes the topic and group files when implicit creations changed them.
func (b *Broker) flushTables(context.Context, time.Time) {
	if err := b.topics.flushIfDirty(); err != nil {
		b.log.Error("topic table write failed", "err", err)
	}
	if err := b.groups.flushIfDirty(); err != nil {
		b.log.Error("group table write failed", "err", err)
	}
}

// sweepGroups forgets every group that has had no live member and no commit for
// GroupRetention: its subscription group entry, offsets, locks and retry topic. Offsets of
// groups that are not in the group table (the table was capped, or an older broker wrote
// them) are forgotten by the same rule. The delay service's own offsets are never touched.
func (b *Broker) sweepGroups(ctx context.Context, now time.Time) {
	deadline := now.Add(-b.cfg.GroupRetention)
	idle := func(group string, since time.Time) bool {
		if b.consumers.live(group) {
			b.groups.markActive(group, now)
			return false
		}
		if at, ok := b.offsets.lastCommitOf(group); ok && !at.Before(deadline) {
			return false
		}
		return since.Before(deadline)
	}
	// With auto-creation off, the group table is the operator's: its entries stay.
	if !b.cfg.DisableAutoCreateGroups {
		for group, since := range b.groups.activity() {
			if ctx.Err() != nil {
				return
			}
			if idle(group, since) {
				b.forgetGroup(group)
			}
		}
	}
	for _, group := range b.offsets.groupsIdleSince(deadline) {
		if _, known := b.groups.get(group); !known && group != scheduleGroup && !b.consumers.live(group) {
			b.offsets.removeGroup(group)
			b.log.Info("forgot the offsets of an idle group", "group", group, "retention", b.cfg.GroupRetention)
		}
	}
}

// forgetGroup removes an idle group and what belongs to it. The group's entry goes last, so
// that a group no longer listed has nothing left behind.
func (b *Broker) forgetGroup(group string) {
	b.locks.dropGroup(group)
	b.rebalance.forget(group)
	retry := RetryTopicPrefix + group
	if _, ok := b.topics.get(retry); ok {
		// As processDeleteTopic: messages first, then the config.
		removed := false
		b.deleteMu.Lock()
		err := b.store.DeleteTopic(retry)
		if err == nil {
			removed, err = b.topics.remove(retry)
		}
		b.deleteMu.Unlock()
		if err != nil {
			// Keep the group: the next sweep tries again.
			b.log.Error("could not delete the retry topic of an idle group", "group", group, "err", err)
			return
		}
		if removed {
			b.offsets.removeTopic(retry)
			b.events.emit(Event{Type: TopicDeleted, Topic: retry})
		}
	}
	b.offsets.removeGroup(group)
	b.forgetPop(group)
	b.groups.remove(group, b.events)
	b.log.Info("forgot an idle group", "group", group, "retention", b.cfg.GroupRetention)
}

func (b *Broker) connClosed(c *remoting.Conn) {
	b.producers.connClosed(c)
	b.membersChanged(b.consumers.connClosed(c))
}

// membersChanged releases departed members' locks and notifies the groups' remaining members
// so they rebalance at once. The consumer manager emitted the events.
func (b *Broker) membersChanged(changes []memberChange) {
	notified := map[string]bool{}
	for _, ch := range changes {
		if !ch.joined {
			b.locks.releaseClient(ch.group, ch.clientID)
			b.rebalance.changed(ch.group)
		}
		if !notified[ch.group] {
			notified[ch.group] = true
			b.notifyGroup(ch.group)
		}
	}
}

// notifyGroup sends NOTIFY_CONSUMER_IDS_CHANGED to every member of group, without waiting.
func (b *Broker) notifyGroup(group string) {
	conns := b.consumers.conns(group)
	if len(conns) == 0 {
		return
	}
	b.bgMu.Lock()
	defer b.bgMu.Unlock()
	if b.ctx.Err() != nil {
		return // shutting down: every connection is closing anyway
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		ctx, cancel := context.WithTimeout(b.ctx, 3*time.Second)
		defer cancel()
		for _, c := range conns {
			req := protocol.NewRequest(protocol.NotifyConsumerIDsChanged, map[string]string{"consumerGroup": group}, nil)
			req.Flag |= protocol.FlagOneway
			if err := c.InvokeOneway(ctx, req); err != nil {
				b.log.Debug("notify consumer ids changed failed", "group", group, "remote", c.RemoteAddr().String(), "err", err)
			}
		}
	}()
}
