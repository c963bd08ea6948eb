// Package consumer is flowd's lite-pull consumer: RocketMQ's DefaultLitePullConsumer, with
// hand-overs that never deliver a message twice.
//
// A LitePull pulls the queues it owns in the background, bounded by flow-control thresholds,
// and hands the messages out through Poll, one pull's batch of one queue at a time:
//
//	c, err := consumer.NewLitePull("order-audit",
//		consumer.WithClientOptions(client.WithNameServers("127.0.0.1:9876")),
//		consumer.WithConsumeFrom(consumer.ConsumeFromFirst),
//	)
//	if err != nil { … }
//	if err := c.Subscribe("orders", "created || paid"); err != nil { … }
//	if err := c.Start(ctx); err != nil { … }
//	defer c.Close(context.Background())
//	for ctx.Err() == nil {
//		msgs, err := c.Poll(ctx) // nil, nil after the poll timeout
//		if err != nil { … }
//		for _, m := range msgs { handle(m) }
//	}
//
// Poll moves the polled queue's consume offset past the messages it returns, and auto-commit
// (on by default, every 5 s) stores that offset on the broker: a polled message counts as
// consumed, as in RocketMQ. Turn auto-commit off and call Commit or CommitOffsets to commit
// only what has been processed. A message that cannot be processed now goes back to the
// broker with SendBack and returns later through the group's retry topic. WithOnQueuesRevoked
// tells the application which queues a rebalance takes away, before they are handed over.
//
// The settings a consumer shares with the producers of its process (name servers, client id,
// logger, heartbeat and route intervals, request and dial timeouts) are those of its client
// core, package client: WithClientOptions passes them for a core of the consumer's own,
// WithClient hands it one to share.
//
// # Getting queues
//
// Subscribe (or SubscribeSelector) shares each topic's queues among the members of the
// consumer group with an allocation strategy (package allocate; averagely by default), and
// rebalances whenever membership or the topic's queues change. Assign reads an explicit list
// of queues instead, outside any sharing (SetAssignSelector filters them); the two are
// mutually exclusive. Broadcasting (WithMessageModel) gives every member every queue and
// keeps offsets in a local file. NewReader makes a consumer of assigned queues that keeps no
// state anywhere: no group, no offsets, no retry topic (see protocol.ReaderGroup).
//
// # Errors
//
// Poll fails for a pull the broker refuses for a reason retrying cannot change: a
// subscription it cannot compile (ErrSubscriptionRefused), a topic that does not exist
// (ErrTopicNotExist), a group it will not create (ErrGroupNotExist). Everything else (a lost
// connection, a busy broker, a filter that failed on some message) is retried in the
// background, as RocketMQ's consumers do.
//
// # Where flowd differs from RocketMQ
//
//   - Rebalances run the moment the broker reports a member joining or leaving
//     (NOTIFY_CONSUMER_IDS_CHANGED), when a topic's queues change and on start; the 20 s timer
//     is only a safety net. Members heartbeat every 10 s rather than 30 s.
//   - Hand-over locks (WithHandoverLocks, on by default in clustering): a queue moves to its
//     new owner only after the previous owner stopped handing out its messages, committed the
//     offset past what Poll returned, and released the queue's broker lock; the new owner reads
//     the committed offset only after it took the lock. So a message Poll returned is never
//     returned again by another member because of a rebalance. A member that crashes loses its
//     locks when its connection closes.
//   - The group's current assignment is passed to the strategy as the previous one, so
//     sticky strategies (allocate.Sticky) move as few queues as possible when a member
//     leaves. It is read from the broker's lock table (GET_LOCK_OWNERS, a flowd extension):
//     with hand-over locks every member locks what it reads, so that table is the assignment,
//     and all members read the same one whatever joins and leaves each happened to see.
//   - Every consumer has its own client core and client id (WithClientOptions) unless one
//     is shared on purpose (WithClient, a client.Client); there is no process-wide state.
//
// # Notes
//
//   - Auto-commit runs on a timer of its own, not inside Poll as in Java, so offsets are
//     committed even while the application stops polling.
//   - Without auto-commit, a queue taken away is handed over at the offset the application last
//     committed: what was polled but not committed is read again by the next owner. That is
//     the at-least-once choice; commit before acting on a rebalance if that matters.
//   - A queue's committed offset only moves forward: a queue's commits run one at a time
//     (those of different queues at once), and an offset below one this consumer already
//     sent for the queue is dropped, so concurrent CommitOffsets calls end at the highest
//     offset whatever order they ran in. Seek (or a broker's offset reset) is the way back.
//   - A consumer bounded to fewer pull goroutines than it owns queues (WithPullGoroutines;
//     unbounded by default) can make a queue with new messages wait behind long-polling
//     pulls of idle queues, as Java's pull threads would.
//   - A broker drops a member whose connection closes and releases its locks at once (so that
//     a crashed member's queues move without waiting for the lease). A member whose
//     connection merely dropped stops handing those queues out the moment it notices, then
//     rejoins and locks them again; but the member that took a queue over meanwhile starts
//     from the offset committed last, so what was polled and not yet committed before the
//     drop can be handed out again. The zero-duplicate hand-over holds for rebalances, not
//     for lost connections.
//   - Pulls of a replica set's queues follow the broker's suggestWhichBrokerId, per queue:
//     to a replica for history when the broker steers reads (replication.replica_reads),
//     back to the master once caught up, to the lowest-id replica for 5 s when the master
//     fails (docs/cluster.md, "Reads from replicas"). Offsets and locks stay at the master:
//     with hand-over locks a lost master connection still stops the broker's queues until
//     they are locked again, so the fallback serves consumers without them. ReadStats
//     shows which member served what.
//
// # Lock order
//
// See LitePull: startMu → commitMu → a queue's commit lock → mu, and the client core's
// heartbeat lock → mu.
package consumer
