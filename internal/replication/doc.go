// Package replication is a replica set's commit-log stream (RocketMQ's HA service): the
// master serves its commit log over a TCP listener of its own; each replica dials it, says
// where its log ends and which epochs wrote it, is told where to cut if its history
// diverged, and then appends the master's raw records with store.Store.AppendRaw, building
// its own consume queues and key index, and acknowledges what it wrote and fsynced.
//
// The master tracks which replicas are in sync (within MasterConfig.MaxLagBytes and
// MaxLagTime) and, in sync mode, completes a send only once MinInSync members (itself
// included) hold it (Master.Await: waiters kept by offset and completed by acks, no
// goroutine per send). State other than the log (consumer offsets, delay progress) travels
// as named snapshots on the same connection every SnapshotInterval.
//
// Who is master, and with which epoch, is decided elsewhere (the cluster's lease in
// JetStream KV); this package only streams, checks epochs and counts acknowledgements.
package replication

import (
	"errors"
	"strconv"
)

// Errors a caller must tell apart.
var (
	// ErrProtocol: the peer sent a frame this side cannot read.
	ErrProtocol = errors.New("replication protocol error")
	// ErrRefused: the master refused the replica (another replica set or cluster, another
	// segment size, a log too far behind). Retrying cannot help; an operator must act.
	ErrRefused = errors.New("replica refused by master")
	// ErrNotEnoughInSync: in sync mode, fewer than MinInSync members are in sync, so a
	// send cannot be acknowledged safely (RocketMQ's in-sync-replicas-not-enough); or the
	// members did not acknowledge it within the send's deadline.
	ErrNotEnoughInSync = errors.New("not enough in-sync replicas")
	// ErrStaleMaster: a master streamed records of an epoch older than the replica's last:
	// it was deposed, and the replica does not follow it.
	ErrStaleMaster = errors.New("master's epoch is older than the replica's")
	// ErrClosed: the master was closed.
	ErrClosed = errors.New("replication closed")
)

// DivergedError tells a replica that its log holds records the master never had (written by
// a deposed master after its epoch ended): the store must be cut back to TruncateTo
// (store.Truncate, EpochFile.TruncateTo) before it follows.
type DivergedError struct {
	TruncateTo int64
	End        int64
}

func (e *DivergedError) Error() string {
	return "replica log diverged from the master's: cut it from " + strconv.FormatInt(e.End, 10) + " back to " + strconv.FormatInt(e.TruncateTo, 10)
}
