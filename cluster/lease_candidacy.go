package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// LogPosition is where a member's log stands: the newest epoch it holds and the end of its
// commit log. With LeaseOptions.Position, of the members that may take a lapsed lease, the
// one whose log goes furthest takes it (RocketMQ's controller elects the replica with the
// largest offset the same way).
type LogPosition struct {
	Epoch int64 `json:"epoch"`
	End   int64 `json:"end"`
}

// candidacy is a member's stand for a lapsed lease, the key candidate.<broker>.<node>:
// which revision of the lease it saw lapse and how far its log goes.
type candidacy struct {
	Node     string      `json:"node"`
	Lapsed   uint64      `json:"lapsed"`
	Position LogPosition `json:"position"`
}

// ahead reports whether a should take the lease before b: its log has a newer epoch or,
// in the same epoch, goes further; of two equal logs the lower node name goes first, so
// that the candidates agree on one.
func ahead(a, b candidacy) bool {
	if a.Position.Epoch != b.Position.Epoch {
		return a.Position.Epoch > b.Position.Epoch
	}
	if a.Position.End != b.Position.End {
		return a.Position.End > b.Position.End
	}
	return a.Node < b.Node
}

// standing is this member's campaign for one lapsed revision of the lease.
type standing struct {
	rev   uint64    // the lapsed revision stood for
	since time.Time // when this member first stood for it
	// seen is, per other candidate, its entry's revision and when that was first seen
	// (local clock): an entry that stops changing for TTL is a candidate gone.
	seen map[string]seenEntry
}

type seenEntry struct {
	rev uint64
	at  time.Time
}

func (l *Lease) candidateKey(node string) string {
	return "candidate." + encodeKey(l.o.BrokerName) + "." + encodeKey(node)
}

// campaign stands for the lapsed lease of revision rev: the member publishes its candidacy
// (with LeaseOptions.Position, its log's position) and, without Position, takes the lease.
// With it, it compares at once with the other eligible members' candidacies and takes the
// lease only when none that is still standing is ahead of it: in sync mode a send
// acknowledged by min_in_sync members is on the longest log of the in-sync set, which a
// replica that merely won the race could lack. It runs again every round while the lease
// stays lapsed.
//
// # Notes
//
// An in-sync member that has not stood yet is waited for up to three CandidacyWindows from
// when this one stood, and a candidate ahead of this one that stops standing (it died, or
// lost JetStream) until its entry has not changed for TTL, both by this member's clock; no
// clocks are compared. With every other in-sync member gone, the lease is taken three
// windows later than without positions.
//
// The candidacy is also this member's probe of JetStream: when the lease lapsed while a KV
// write of this member, or a round's reads, went unanswered (the bucket's stream had no leader: the master could
// not renew either), the first candidacy JetStream takes gives the master two renew
// intervals to renew before this member takes the lease, once per lapsed revision, so that
// losing the stream's leader does not fail the set over.
func (l *Lease) campaign(ctx context.Context, rev uint64, rec LeaderRecord, now time.Time) {
	last := max(rec.Epoch, l.o.LastEpoch)
	l.mu.Lock()
	until := l.graceUntil
	inGrace := l.graceRev == rev && now.Before(until)
	l.mu.Unlock()
	if inGrace {
		l.trace("grace: the master may still renew", "rev", rev, "until", until.Format(time.RFC3339Nano))
		return
	}
	me := candidacy{Node: l.o.Node, Lapsed: rev}
	if l.o.Position != nil {
		me.Position = l.o.Position()
	}
	data, err := json.Marshal(me)
	if err != nil {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, l.o.FenceMargin)
	defer cancel()
	start := time.Now()
	_, err = l.o.KV.Put(wctx, l.candidateKey(l.o.Node), data)
	l.trace("stand", "rev", rev, "epoch", me.Position.Epoch, "end", me.Position.End, "took", time.Since(start), "err", err)
	if err != nil {
		l.unanswered(err)
		l.o.Logger.Debug("replica-set candidacy not published", "broker", l.o.BrokerName, "err", err)
		return
	}
	l.mu.Lock()
	graceDue := l.graceRev != rev && l.outage.After(l.revSeen)
	l.mu.Unlock()
	if graceDue && l.masterServerGone(wctx, rec.Node) {
		// The master's NATS server is not heard from either (it died with its process): no
		// renewal is coming, and the grace would only delay its successor.
		l.trace("no grace: the master's NATS server is gone", "rev", rev, "master", rec.Node)
		graceDue = false
		l.mu.Lock()
		l.graceRev, l.graceUntil = rev, time.Time{}
		l.mu.Unlock()
	}
	l.mu.Lock()
	if graceDue {
		l.graceRev, l.graceUntil = rev, time.Now().Add(2*l.o.RenewInterval)
		l.mu.Unlock()
		l.o.Logger.Info("replica-set lease lapsed while JetStream did not answer: the master has two renew intervals to renew it before this member takes it",
			"broker", l.o.BrokerName, "node", l.o.Node, "master", rec.Node, "epoch", rec.Epoch)
		return
	}
	fresh := l.stand.rev != rev || l.stand.seen == nil
	if fresh {
		l.stand = standing{rev: rev, since: now, seen: map[string]seenEntry{}}
	}
	l.mu.Unlock()
	if fresh {
		l.o.Logger.Info("replica-set lease lapsed: standing for it", "broker", l.o.BrokerName, "node", l.o.Node,
			"epoch", me.Position.Epoch, "end", me.Position.End)
	}
	if l.o.Position == nil {
		l.take(ctx, rev, last)
		return
	}
	if other, ok := l.aheadOfMe(wctx, me, rec, now); ok {
		l.trace("waiting for or deferring to another member", "rev", rev, "other", other.Node, "epoch", other.Position.Epoch, "end", other.Position.End)
		l.o.Logger.Debug("replica-set lease left to a member whose log goes further, or not stood yet", "broker", l.o.BrokerName,
			"node", other.Node, "epoch", other.Position.Epoch, "end", other.Position.End)
		return
	}
	l.trace("no standing member is ahead: taking the lease", "rev", rev)
	l.take(ctx, rev, last)
}

// masterServerGone reports whether the bucket's stream says the NATS server of master (the
// server names are the member names) is offline, or neither current nor heard from for a
// renew interval. Anything it cannot tell (no cluster, no answer, an unknown peer) is not
// gone: the master gets its grace.
func (l *Lease) masterServerGone(ctx context.Context, master string) bool {
	if l.o.ServerName == "" {
		return false // not the embedded servers named after the members
	}
	st, err := l.o.KV.Status(ctx)
	if err != nil {
		return false
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok || bs.StreamInfo().Cluster == nil {
		return false
	}
	ci := bs.StreamInfo().Cluster
	if ci.Leader == master {
		return false
	}
	for _, p := range ci.Replicas {
		if p.Name == master {
			l.trace("the master's NATS server as the stream sees it", "master", master, "current", p.Current, "offline", p.Offline, "active", p.Active)
			return p.Offline || !p.Current && p.Active >= l.o.RenewInterval
		}
	}
	return false
}

// standing returns another eligible member's candidacy for the lapsed revision rev, if one
// stands for it.
func (l *Lease) standing(ctx context.Context, rec LeaderRecord, rev uint64) (candidacy, bool) {
	for _, m := range eligibleMembers(rec) {
		if m == l.o.Node {
			continue
		}
		e, err := l.get(ctx, l.candidateKey(m))
		if err != nil {
			continue
		}
		var c candidacy
		if json.Unmarshal(e.Value(), &c) == nil && c.Node == m && c.Lapsed == rev {
			return c, true
		}
	}
	return candidacy{}, false
}

// eligibleMembers are the members that may take rec's lease once it lapsed: its in-sync set
// and its master, sorted.
func eligibleMembers(rec LeaderRecord) []string {
	members := append(slices.Clone(rec.InSync), rec.Node)
	slices.Sort(members)
	return slices.Compact(members)
}

// aheadOfMe returns a candidate for the same lapsed revision, still standing, whose log
// goes further than me's, among the members that may take the lease.
func (l *Lease) aheadOfMe(ctx context.Context, me candidacy, rec LeaderRecord, now time.Time) (candidacy, bool) {
	l.mu.Lock()
	stoodFor := now.Sub(l.stand.since)
	l.mu.Unlock()
	for _, m := range eligibleMembers(rec) {
		if m == l.o.Node {
			continue
		}
		// An in-sync replica that has not stood yet sees the lapse a round later or less
		// (each member times the lapse by its own clock): it is waited for up to two more
		// windows. The master whose lease lapsed is presumed gone unless it stands.
		notYet := m != rec.Node && stoodFor < 3*l.o.CandidacyWindow
		e, err := l.get(ctx, l.candidateKey(m))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			if notYet {
				return candidacy{Node: m}, true
			}
			continue
		}
		if err != nil {
			// Unreadable: this member cannot tell, so it does not take the lease this round.
			return candidacy{Node: m}, true
		}
		var c candidacy
		if json.Unmarshal(e.Value(), &c) != nil || c.Node != m {
			continue
		}
		if c.Lapsed > me.Lapsed {
			return c, true // this member's read is older than c's: its compare-and-set would fail
		}
		if c.Lapsed < me.Lapsed {
			if notYet {
				return candidacy{Node: m}, true
			}
			continue
		}
		l.mu.Lock()
		s, ok := l.stand.seen[m]
		if !ok || s.rev != e.Revision() {
			s = seenEntry{rev: e.Revision(), at: now}
			l.stand.seen[m] = s
		}
		l.mu.Unlock()
		if now.Sub(s.at) >= l.o.TTL {
			continue // it stopped standing
		}
		if ahead(c, me) {
			return c, true
		}
	}
	return candidacy{}, false
}
