package consumer

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/protocol"
)

// Reads from replicas (docs/cluster.md, "Reads from replicas"). A broker that is a replica
// set lists its master as broker id 0 and its replicas by their ids; each pull's answer
// suggests the member for the queue's next pull (suggestWhichBrokerId: with
// replication.replica_reads, a replica for history beyond the master's memory budget, the
// master once caught up). The consumer follows it per queue, as RocketMQ's Java client
// does (pullFromWhichNodeTable); when the suggested member is unknown or fails, the next
// pull goes to the master; when the master fails, the broker's queues are read from its
// replica with the lowest id for masterFallback before the master is tried again. Offsets
// are committed, and queues locked, at the master whatever member serves the pulls.

// masterFallback is how long a broker's pulls go to a replica after its master failed a
// pull (a lost connection, a timeout), before the master is tried again.
const masterFallback = 5 * time.Second

// ReadStat is what one member of a broker's replica set served this consumer's pulls.
type ReadStat struct {
	// BrokerName is the broker (the replica set).
	BrokerName string
	// BrokerID is the member: 0 the master, replicas by their ids.
	BrokerID int64
	// Pulls is how many pull answers the member gave.
	Pulls int64
	// Messages is how many messages those answers brought to the consumer.
	Messages int64
}

// noMember is the member of a pull that went to none (its broker's address was not found).
const noMember = -1

// readMember is a member of a broker: the key of LitePull.reads.
type readMember struct {
	broker string
	id     int64
}

// ReadStats returns, for every broker member that answered a pull of this consumer since
// it was created, how many pulls it answered and the messages they brought, sorted by
// broker name and broker id. A broker without replicas shows only its master (0).
func (l *LitePull) ReadStats() []ReadStat {
	l.mu.Lock()
	out := make([]ReadStat, 0, len(l.reads))
	for m, s := range l.reads {
		out = append(out, ReadStat{BrokerName: m.broker, BrokerID: m.id, Pulls: s.Pulls, Messages: s.Messages})
	}
	l.mu.Unlock()
	slices.SortFunc(out, func(a, b ReadStat) int {
		return cmp.Or(cmp.Compare(a.BrokerName, b.BrokerName), cmp.Compare(a.BrokerID, b.BrokerID))
	})
	return out
}

// readTarget picks the member of a broker to send a queue's pull to, from the members a
// route lists (sorted by id): the replica the last answer suggested when the route lists
// it, else the replica with the lowest id while the master is failing over to replicas
// (masterDown), else the master, else (a route without a master) the member with the
// lowest id. ok is false when the route lists no member.
func readTarget(members []clientcore.Member, suggested int64, masterDown bool) (clientcore.Member, bool) {
	if len(members) == 0 {
		return clientcore.Member{}, false
	}
	var master, replica *clientcore.Member
	for i := range members {
		m := &members[i]
		switch {
		case m.ID == suggested && suggested != protocol.MasterID:
			return *m, true
		case m.ID == protocol.MasterID:
			master = m
		case replica == nil:
			replica = m
		}
	}
	switch {
	case masterDown && replica != nil:
		return *replica, true
	case master != nil:
		return *master, true
	}
	return members[0], true
}

// readOutcome is what a pull's outcome says about where the queue's next pull goes.
type readOutcome struct {
	next         int64 // the member for the next pull (0: the master)
	masterFailed bool  // the master failed the pull: read from a replica for a while
	masterBack   bool  // a replica sent the consumer back: try the master now
}

// nextRead decides the member for a queue's next pull after a pull sent to member from:
// answered is whether the member answered (code and suggest are then its answer's, advanced
// whether its next offset is past the one pulled from), failed whether it failed to answer
// (a lost connection, a timeout; not a cancelled pull).
//
// # Notes
//
// A replica sends a caught-up consumer back with PULL_RETRY_IMMEDIATELY at the offset it
// pulled from; the same code with an offset that moved on is a batch its filter matched
// none of (NO_MATCHED_MSG), which says nothing of the master: a fallback from a failed
// master goes on.
func nextRead(from int64, answered bool, code protocol.ResponseCode, suggest int64, advanced, failed bool) readOutcome {
	switch {
	case from == noMember:
		return readOutcome{}
	case failed && from == protocol.MasterID:
		return readOutcome{masterFailed: true}
	case failed, !answered:
		return readOutcome{} // the replica failed, or the pull was cancelled: the master
	case from != protocol.MasterID && code == protocol.PullRetryImmediately && !advanced:
		// A caught-up replica: what comes next is at the master.
		return readOutcome{next: suggest, masterBack: true}
	}
	switch code {
	case protocol.Success, protocol.PullNotFound, protocol.PullRetryImmediately, protocol.PullOffsetMoved:
		return readOutcome{next: suggest}
	}
	return readOutcome{} // an error answer: a replica may not serve this; the master will say
}

// pullMember is the member of mq's broker that q's next pull goes to, with its address; q's
// suggestion and the broker's fallback state are read under l.mu, the routes outside it.
func (l *LitePull) pullMember(ctx context.Context, q *queue) (addr string, id int64, err error) {
	l.mu.Lock()
	suggested := q.readFrom
	down := time.Now().Before(l.masterDown[q.mq.BrokerName])
	l.mu.Unlock()
	if m, ok := readTarget(l.cl.Members(q.mq.BrokerName), suggested, down); ok {
		return m.Addr, m.ID, nil
	}
	return l.cl.FindSubscribeAddr(ctx, q.mq.BrokerName, q.mq.Topic, protocol.MasterID)
}

// notePullLocked records a pull's outcome at member from for q's next pull and the
// consumer's ReadStats. l.mu is held.
func (l *LitePull) notePullLocked(q *queue, from int64, resp *protocol.Command, res *pullResult, err error) {
	answered := resp != nil
	failed := !answered && err != nil && !errors.Is(err, context.Canceled)
	var code protocol.ResponseCode
	var suggest int64
	advanced := false
	if res != nil {
		code, suggest, advanced = res.code, res.suggest, res.next > res.requested
	} else if answered {
		code = resp.ResponseCode()
	}
	o := nextRead(from, answered, code, suggest, advanced, failed)
	q.readFrom = o.next
	switch {
	case o.masterFailed:
		if !time.Now().Before(l.masterDown[q.mq.BrokerName]) {
			l.log.Warn("pulls of the broker go to a replica for a while: its master failed", "broker", q.mq.BrokerName, "for", masterFallback, "err", err)
		}
		l.masterDown[q.mq.BrokerName] = time.Now().Add(masterFallback)
	case o.masterBack:
		delete(l.masterDown, q.mq.BrokerName)
	}
	if answered {
		s := l.reads[readMember{q.mq.BrokerName, from}]
		if s == nil {
			s = &ReadStat{}
			l.reads[readMember{q.mq.BrokerName, from}] = s
		}
		s.Pulls++
		if res != nil {
			s.Messages += int64(len(res.msgs))
		}
	}
}
