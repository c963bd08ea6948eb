package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// Replication is the broker's view of its replica set (Config.Replication): whether it may
// take writes now, and, in sync mode, when a stored record is held by enough members. The
// daemon implements it over the replica set's stream and the cluster's lease; nil is a
// single node, exactly as without replica sets.
type Replication interface {
	// Writable is nil while this node is the master and may take writes. Otherwise it is
	// why not: an error wrapping ErrNotMaster (a replica, or a master that fenced itself),
	// or one wrapping ErrNotEnoughInSync (sync mode with fewer than min_in_sync members in
	// sync). It is called on every send, so it must answer from memory.
	Writable() error
	// Sync reports sync mode: a send is answered only once Await completes.
	Sync() bool
	// Await calls done once the record ending at commit-log offset end is held by enough
	// members, or with an error if that did not happen by deadline. done must not block.
	Await(end int64, deadline time.Time, done func(error))
}

// ReplicaAddrs is implemented by a Replication that knows its set's members: a route names
// this broker with the addresses it returns (self is this broker's own) instead of
// {0: self}: the master as broker id 0, replicas by their ids, as RocketMQ's name server
// lists a master and its slaves.
type ReplicaAddrs interface {
	BrokerAddrs(self string) map[int64]string
}

// ReplicaReads is implemented by a Replication that knows its set's members' broker ids:
// with Config.ReplicaReads set, pulls are then steered between master and replicas by the
// answer's suggestWhichBrokerId, as RocketMQ's slave reads do. On the master, a pull whose
// messages the store counts on disk (its last one more than store.Options.MemoryBudget
// behind the commit log's end: RocketMQ's accessMessageInMemoryMaxRatio rule) is answered
// with ReadReplica's id, so that a consumer far behind reads its history from a replica; a
// replica suggests itself for such a pull and the master (0) otherwise, and answers a
// consumer that caught up with PULL_RETRY_IMMEDIATELY, so that it goes back to the master.
type ReplicaReads interface {
	// ReadReplica is the broker id of an in-sync replica that a route lists (ok false:
	// none; the master keeps the pull). It is called on pulls: it must answer from memory.
	ReadReplica() (brokerID int64, ok bool)
	// BrokerID is this member's broker id.
	BrokerID() int64
}

// replicaReads reports whether this broker steers pulls (Config.ReplicaReads with a
// Replication that implements ReplicaReads).
func (b *Broker) replicaReads() (ReplicaReads, bool) {
	if !b.cfg.ReplicaReads {
		return nil, false
	}
	rr, ok := b.cfg.Replication.(ReplicaReads)
	return rr, ok
}

// suggestBroker is the broker id a pull's answer suggests for the next pull of its queue,
// inDisk telling whether the pull's messages lie beyond the memory budget (the store's
// read says, GetResult.InDisk): 0 (the master) unless ReplicaReads says otherwise.
func (b *Broker) suggestBroker(inDisk bool) int64 {
	if !inDisk {
		return 0
	}
	rr, ok := b.replicaReads()
	if !ok {
		return 0
	}
	if b.isReplica() {
		return rr.BrokerID()
	}
	if id, ok := rr.ReadReplica(); ok {
		return id
	}
	return 0
}

// replicaCaughtUp turns the answer of a replica's pull that found nothing past the end of
// its queue (caught up, or ahead of this replica's copy: an offset the master gave) into
// PULL_RETRY_IMMEDIATELY at the same offset: RocketMQ's slave answers so (offsetCheckInSlave
// off), so that the client pulls at the master, which has what comes next, instead of
// waiting on a replica that may lag, or being moved back to where this replica's queue
// ends. A caught-up pull is turned only with Config.ReplicaReads (otherwise it waits here as
// on any broker); an offset the replica would correct always is, past its end or before
// its head alike (OFFSET_MOVED), and one whose consume-queue file the replica no longer has
// (OFFSET_FOUND_NULL): the replica's retention runs on its own clock, and correcting an
// offset from its copy could move a consumer past messages the master still holds, or back
// to the queue's start. Neither happens while the routes name no other master
// (masterElsewhere). It reports whether it did.
func (b *Broker) replicaCaughtUp(res *store.GetResult, code protocol.ResponseCode, requested int64) (protocol.ResponseCode, bool) {
	switch res.Status {
	case store.OffsetOverflowOne:
		if _, ok := b.replicaReads(); !ok {
			return code, false
		}
	case store.OffsetFoundNull:
	case store.OffsetOverflowBadly, store.OffsetTooSmall, store.NoMessageInQueue, store.NoMatchedLogicQueue:
		if code != protocol.PullOffsetMoved {
			return code, false
		}
	default:
		return code, false
	}
	if !b.isReplica() || !b.masterElsewhere() {
		return code, false
	}
	res.NextBeginOffset = requested
	return protocol.PullRetryImmediately, true
}

// masterElsewhere reports whether this broker's routes name another member as the master
// (broker id 0). While none does (the lease lapsed, a promotion under way; or this is a
// master that fenced itself) a replica's caught-up consumer has nowhere to go: its pulls
// are held here as usual rather than sent round to a master that is not there.
func (b *Broker) masterElsewhere() bool {
	ra, ok := b.cfg.Replication.(ReplicaAddrs)
	if !ok {
		return true // no routes to go by: the replica set's master is another member
	}
	m, ok := ra.BrokerAddrs(b.addr)[protocol.MasterID]
	return ok && m != "" && m != b.addr
}

// Errors of Replication.Writable, which the send path answers.
var (
	// ErrNotMaster: this broker is a replica (or a fenced master): it takes no sends.
	// Answered SERVICE_NOT_AVAILABLE, as RocketMQ's slave answers, so that a client tries
	// the master its refreshed route names.
	ErrNotMaster = errors.New("broker is not its replica set's master")
	// ErrNotEnoughInSync: sync mode with fewer than min_in_sync members in sync; nothing
	// was stored. Answered SYSTEM_ERROR with a remark starting "in-sync replicas not
	// enough", as RocketMQ 5 answers IN_SYNC_REPLICAS_NOT_ENOUGH.
	ErrNotEnoughInSync = errors.New("in-sync replicas not enough")
	// ErrNotReplicated: sync mode, the message is stored on the master but was not held by
	// enough members before the deadline (remoting answers FLUSH_SLAVE_TIMEOUT). Produce
	// and Send return their result with it: the message stands, so it must not be sent again.
	ErrNotReplicated = errors.New("stored, not held by enough replicas in time")
)

// ownAddrs is this broker's addresses in a route: {0: its own}, or its replica set's.
func (b *Broker) ownAddrs() map[int64]string {
	if ra, ok := b.cfg.Replication.(ReplicaAddrs); ok {
		return ra.BrokerAddrs(b.addr)
	}
	return map[int64]string{0: b.addr}
}

// syncReplicaTimeout bounds a sync-mode send's wait for its replicas when its context
// has no deadline: the answer is then FLUSH_SLAVE_TIMEOUT (stored, not known replicated).
const syncReplicaTimeout = 3 * time.Second

// writable is nil when the broker may write (no replica set, or its master).
func (b *Broker) writable() error {
	if r := b.cfg.Replication; r != nil {
		return r.Writable()
	}
	return nil
}

// isReplica reports whether the replica set has another master now (or this one fenced
// itself): the broker's own background writers (delay deliveries, transaction check-backs)
// then wait.
func (b *Broker) isReplica() bool { return errors.Is(b.writable(), ErrNotMaster) }

// replicationRefusal answers a send the replica set does not let this broker take.
func replicationRefusal(req *protocol.Command, err error) *protocol.Command {
	if errors.Is(err, ErrNotEnoughInSync) {
		return errorResponse(req, protocol.SystemError, err)
	}
	return errorResponse(req, protocol.ServiceNotAvailable, err)
}

// sendSysFlag is a send request's sysFlag, read from its header fields.
func sendSysFlag(req *protocol.Command) int32 {
	key := "f"
	if req.RequestCode() == protocol.SendMessage {
		key = "sysFlag"
	}
	flag, _ := strconv.ParseInt(req.Ext(key), 10, 32)
	return int32(flag)
}

// syncReplicated reports whether sends wait for replicas.
func (b *Broker) syncReplicated() bool {
	r := b.cfg.Replication
	return r != nil && r.Sync()
}

func replicaDeadline(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(syncReplicaTimeout)
}

// sendReplicated puts m and answers once enough members hold it (sync mode). Like
// sendSyncFlush, the answer is deferred and given by whoever completes the wait (the
// store's group commit, then the replication ack reader), so no goroutine per send waits;
// a send that cannot be deferred waits here.
func (b *Broker) sendReplicated(ctx context.Context, req *protocol.Command, m *protocol.MessageExt) *protocol.Command {
	stub := answerStub(req)
	topic, queueID, n := m.Topic, m.QueueID, len(m.Body)
	deadline := replicaDeadline(ctx)
	answer := func(res store.PutResult, err error, respond func(*protocol.Command)) {
		if err != nil && !storedUnflushed(err, res.Size > 0) {
			respond(b.answerOne(stub, topic, queueID, n, res, err))
			return
		}
		b.cfg.Replication.Await(res.CommitLogOffset+int64(res.Size), deadline, func(rerr error) {
			if rerr != nil {
				respond(replicaTimeoutAnswer(b.answerOne(stub, topic, queueID, n, res, err), rerr))
				return
			}
			respond(b.answerOne(stub, topic, queueID, n, res, err))
		})
	}
	if d, ok := remoting.DeferInFlight(ctx, nil); ok {
		respond := func(c *protocol.Command) { d.Respond(c) }
		b.store.PutAsync(ctx, m, func(res store.PutResult, err error) { answer(res, err, respond) })
		return nil
	}
	ch := make(chan *protocol.Command, 1)
	res, err := b.store.PutUnnamed(ctx, m)
	answer(res, err, func(c *protocol.Command) { ch <- c })
	return <-ch
}

// replicaTimeoutAnswer turns a stored message's answer into FLUSH_SLAVE_TIMEOUT: it is
// stored on the master (msgId, queue and offset stand) but not known to be held by enough
// replicas, so the client must not send it again.
func replicaTimeoutAnswer(c *protocol.Command, err error) *protocol.Command {
	if protocol.ResponseCode(c.Code) != protocol.Success {
		return c
	}
	c.Code = int32(protocol.FlushSlaveTimeout)
	c.Remark = err.Error()
	return c
}

// awaitReplicated blocks until the record ending at end is held by enough members (sync
// mode; at once otherwise), for the sends that store through a blocking Put (batches,
// half messages).
func (b *Broker) awaitReplicated(ctx context.Context, end int64) error {
	if !b.syncReplicated() {
		return nil
	}
	ch := make(chan error, 1)
	b.cfg.Replication.Await(end, replicaDeadline(ctx), func(err error) { ch <- err })
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// replicated waits, for the sends outside remoting (Produce, Send), until the record
// ending at end is held by enough members; an error wraps ErrNotReplicated.
func (b *Broker) replicated(ctx context.Context, topic string, end int64) error {
	if err := b.awaitReplicated(ctx, end); err != nil {
		return fmt.Errorf("send to %q: %w: %v", topic, ErrNotReplicated, err)
	}
	return nil
}

// Store is the broker's message store, which a replica set's stream reads (on the
// master) and appends to (on a replica). Writing to it other than through the replica
// stream bypasses the broker's bookkeeping.
func (b *Broker) Store() *store.Store { return b.store }

// OffsetsSnapshot is the consumer-offset table (delay-level progress included, under its
// pseudo group) as a replica receives it: {"topic@group": {"queue": offset}}.
func (b *Broker) OffsetsSnapshot() ([]byte, error) {
	b.offsets.mu.Lock()
	out := make(map[string]map[int32]int64, len(b.offsets.offsets))
	for k, qs := range b.offsets.offsets {
		m := make(map[int32]int64, len(qs))
		for q, off := range qs {
			m[q] = off
		}
		out[k.String()] = m
	}
	b.offsets.mu.Unlock()
	data, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("encode offsets snapshot: %w", err)
	}
	return data, nil
}

// MergeOffsets applies a master's OffsetsSnapshot on a replica: each queue keeps the higher
// of its own offset and the master's, so that a commit a consumer made to this replica
// (reading from it while the master was away) is not moved back. An offset the master
// reset lower reaches a replica only on its next commit there.
func (b *Broker) MergeOffsets(data []byte) error {
	var in map[string]map[int32]int64
	if err := json.Unmarshal(data, &in); err != nil {
		return fmt.Errorf("decode offsets snapshot: %w", err)
	}
	now := time.Now()
	for key, qs := range in {
		topic, group, ok := strings.Cut(key, "@")
		if !ok {
			return fmt.Errorf("offsets snapshot key %q is not topic@group", key)
		}
		for q, off := range qs {
			if cur, ok := b.offsets.query(group, topic, q); ok && cur >= off {
				continue
			}
			b.offsets.commit(group, topic, q, off, now, nil)
		}
	}
	return nil
}

// Promoted tells a broker that was a replica that it is its replica set's master now: the
// pending transactions are rebuilt from the replicated half and op topics (a replica does
// not track them), so that half messages left open by the old master are checked back.
func (b *Broker) Promoted(ctx context.Context) error {
	b.txn.reset()
	if err := b.loadTransactions(ctx); err != nil {
		return fmt.Errorf("promote: restore pending transactions: %w", err)
	}
	return nil
}

// reset forgets every pending half message (before they are loaded again).
func (t *txnTable) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pending = map[int64]*halfMessage{}
	t.busy = map[int64]*halfMessage{}
}

// TopicsSnapshot is the topic table as a replica receives it (a JSON list of TopicConfig),
// so that a topic created on the master (explicitly or by a first send) is served by a
// promoted replica with its queues and permissions.
func (b *Broker) TopicsSnapshot() ([]byte, error) {
	data, err := json.Marshal(b.topics.list())
	if err != nil {
		return nil, fmt.Errorf("encode topics snapshot: %w", err)
	}
	return data, nil
}

// MergeTopics applies a master's TopicsSnapshot on a replica: every topic it lists is
// created or updated to the master's configuration. A topic the master deleted stays on
// the replica until it is deleted there (deletions travel as the cluster's, not here).
func (b *Broker) MergeTopics(data []byte) error {
	var tcs []TopicConfig
	if err := json.Unmarshal(data, &tcs); err != nil {
		return fmt.Errorf("decode topics snapshot: %w", err)
	}
	for _, tc := range tcs {
		if cur, ok := b.topics.get(tc.Name); ok && cur == tc {
			continue
		}
		if _, err := b.topics.put(tc); err != nil {
			return fmt.Errorf("merge topic %q: %w", tc.Name, err)
		}
	}
	return nil
}

// GroupsSnapshot is the subscription-group table as a replica receives it (a JSON list of
// GroupConfig), so that a group's settings made on the master (retry max times, orderly
// consumption) hold on a promoted replica, not only the defaults a heartbeat would create.
func (b *Broker) GroupsSnapshot() ([]byte, error) {
	data, err := json.Marshal(b.groups.list())
	if err != nil {
		return nil, fmt.Errorf("encode groups snapshot: %w", err)
	}
	return data, nil
}

// MergeGroups applies a master's GroupsSnapshot on a replica: every group it lists is
// created or updated to the master's settings. A group the master deleted stays on the
// replica (as topics do), where the idle-group sweeper forgets it.
func (b *Broker) MergeGroups(data []byte) error {
	var gcs []GroupConfig
	if err := json.Unmarshal(data, &gcs); err != nil {
		return fmt.Errorf("decode groups snapshot: %w", err)
	}
	now := time.Now()
	for _, g := range gcs {
		if _, err := b.groups.put(g, now, b.events); err != nil {
			return fmt.Errorf("merge group %q: %w", g.Name, err)
		}
	}
	return nil
}

// PopSnapshot is the pop groups' consumed offsets (below each, every message was
// acknowledged or dead-lettered) as a replica receives them, in OffsetsSnapshot's form.
// A replica merges them into its consumer-offset table (MergeOffsets), where a promoted
// replica's first receive of a queue starts (popStart): it hands out again only what
// was in flight, acknowledged out of order above the consumed offset, or consumed within
// the last snapshot interval (docs/cluster.md, "Replica sets").
func (b *Broker) PopSnapshot() ([]byte, error) {
	b.pop.qmu.Lock()
	qs := make([]*popQueue, 0, len(b.pop.queues))
	for _, q := range b.pop.queues {
		qs = append(qs, q)
	}
	b.pop.qmu.Unlock()
	out := map[string]map[int32]int64{}
	for _, q := range qs {
		q.mu.Lock()
		start := q.start
		q.mu.Unlock()
		k := offsetKey{group: q.key.group, topic: q.key.topic}.String()
		if out[k] == nil {
			out[k] = map[int32]int64{}
		}
		out[k][q.key.queueID] = start
	}
	data, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("encode pop snapshot: %w", err)
	}
	return data, nil
}
