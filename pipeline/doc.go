// Package pipeline runs flowd's pipelines: lite-pull consumers hosted in the daemon that
// read one or more topics, keep the messages a selector admits, pass them through Wasm
// transforms and deliver the result to a sink (a topic on this flowd or on a remote
// RocketMQ cluster, a NATS subject, an HTTP webhook, or JSON lines on a file or stdout).
//
// A topic sink's topic must exist when the pipeline starts, or the definition must have it
// created (SinkDefinition.CreateQueues): a mistyped topic fails the start with
// ErrNoSinkTopic rather than becoming a new topic through the producer's auto-create route.
// Every field and sink is documented for users in docs/pipelines.md.
//
// A Definition describes a pipeline as plain data (a config file or a KV entry holds it);
// it and its validation live in package pipeline/definition, aliased here. A Manager runs
// definitions by name and resolves what they name (transform and allocator plugins, the
// NATS connection). A pipeline reads through the Manager's name servers, or through its
// definition's SourceNameServers (the topics of another flowd). Managers in several daemons
// that run the same definition against the same source share its queues through the
// consumer group, and hand them over on join and leave.
//
// # Delivery guarantee: at least once
//
// A pipeline commits its consumer offsets by hand (auto-commit is off). Polled batches go
// to Parallelism workers, a queue always to the same worker, so a queue's messages are
// delivered in order and a worker finishes one batch before it starts the next of that
// queue. After every record of a batch was acknowledged by the sink (stored by the topic's
// broker, acked by JetStream or flushed to the NATS server, answered 2xx by the webhook,
// written and synced to the file), the worker commits the offset past the batch; the workers
// commit their queues independently, so a commit the broker is slow to take holds up its own
// queue only. So an offset is committed only after the sink acknowledged every message before
// it in its queue, and a crash or a kill can only make a pipeline deliver again what it had not
// committed: the records the sink acknowledged, and the record being delivered when it
// stopped, which the sink may have received although its answer never came back (a
// webhook can read a request written before the kill after the pipeline has stopped). All
// of them belong to the batch each queue was processing: at most one batch per queue
// (PullBatchSize). A commit is durable once the broker wrote it: flowd's broker keeps
// commits in memory and writes them within its offset flush interval (the daemon's
// store.offset_flush_interval, 500ms by default, after an fsync of the store), so a kill of
// the daemon hosting both the pipeline and its source broker also delivers again what the
// commits since the last flush covered (e2e/ measures both terms).
//
// Messages the selector rejects are skipped by the broker and reach no batch. Between two
// polls, at most once a second (and after every poll that found nothing), the poll loop
// commits the consumer's position of each queue with no batch in flight when it is past
// the offset committed last, so a queue whose messages the selector rejects is committed
// past them too (at the latest when the broker answers the parked pull that skipped them,
// after its suspend time) and its lag goes to 0.
//
// A record the sink refuses is tried MaxAttempts times with exponential backoff
// (RetryBackoff doubling up to MaxBackoff); then its message is sent back with
// consumer.SendBack to the group's retry topic %RETRY%<group>, from which the pipeline
// reads it again after the delay level's delay, and after MaxReconsumeTimes the broker
// moves it to the dead-letter topic %DLQ%<group>. The batch is committed past a message
// only once it was delivered or sent back; a send-back that fails is retried until the
// pipeline stops, holding the queue, rather than losing the message.
//
// Transforms may turn a message into several records (each delivered, in order) or none
// (counted as filtered and committed past). A transform that fails MaxAttempts times sends
// its whole batch back; one whose plugin fails open passes the messages unchanged.
//
// # Stopping
//
// Manager.Stop drains: polling stops, the batches already polled are delivered and
// committed, and the consumer leaves the group, so the other members take the queues at
// the committed offsets, without duplicates. Cancelling the context given to Start kills
// the pipeline instead: deliveries in progress are abandoned (a record one had already
// written may still reach the sink after the stopped event), nothing more is committed,
// and the next owner (or the same pipeline restarted) delivers the uncommitted window
// again. When a rebalance takes queues away, batches of them not yet started are dropped
// and the hand-over waits for the batch in progress to be delivered and committed, so a
// running pipeline never delivers a message that another member delivers too.
//
// # Counters and status
//
// Status reports the state, each owned queue's committed offset (read from the broker),
// and counters: in, out (records acknowledged), filtered (messages the transforms turned
// into nothing; what the selector rejects never leaves the broker), failed (messages sent
// back) and sink errors (failed attempts). A queue's lag is known when the Manager was
// given Options.QueueEnd (the daemon reads queue ends from its store); otherwise it is -1.
package pipeline
