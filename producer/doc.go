// Package producer is flowd's message producer, wire-compatible with RocketMQ brokers.
//
//	p, err := producer.New("order-service", producer.WithClientOptions(client.WithNameServers("127.0.0.1:9876")))
//	if err != nil { … }
//	if err := p.Start(ctx); err != nil { … }
//	defer p.Close(context.Background())
//	res, err := p.Send(ctx, &producer.Message{Topic: "orders", Tags: "created", Keys: []string{"order-42"}, Body: body})
//
// The settings a producer shares with the consumers of its process (name servers, client id,
// logger, heartbeat and route intervals) are those of its client core, package client:
// WithClientOptions passes them for a core of the producer's own, WithClient hands it one to
// share.
//
// Send waits for the broker to store the message and retries retriable failures on another
// queue (another broker when there is one) within the send timeout; SendAsync does the same in
// the background, with at most WithMaxInFlightAsync sends outstanding, callbacks not yet
// returned included (past that it blocks, on its context, like franz-go's buffered-records
// bound); SendOneway does not wait at all;
// SendBatch stores several messages of one topic together in one queue with one request
// (SEND_BATCH_MESSAGE) and returns a result per message. WithAsyncBatching (off by default)
// makes SendAsync gather the messages of each queue into such requests by itself, each
// message keeping its own callback and result; WithAsyncBatchesInFlight says how many of a
// queue's batches may be in flight at once, and what order that keeps.
//
// A message the broker stored but could not flush (or replicate) in time is reported as sent,
// with a SendResult.Status other than SendOK, and is never sent again: only failures after
// which nothing was stored are retried.
//
// Every message gets a RocketMQ-style unique id (the UNIQ_KEY property, 32 hex digits),
// which consumers see as its MsgID. Bodies over the compression threshold (4 KiB) are
// zlib-compressed; consumers inflate them. A topic that does not exist yet is sent to through
// the auto-create key's route (TBW102), and a broker that allows it creates the topic on the
// first send.
//
// The queue of each message is chosen by a QueueSelector: RoundRobin (the default), Random,
// or HashByKey, which keeps the messages of one key in one queue, and so in order.
//
// Transactions: a producer built WithTransactionListener sends with SendInTransaction. The
// broker stores the message as a half message that no consumer sees, the listener's
// ExecuteLocal runs the local transaction, and its outcome (TxCommit, TxRollback, TxUnknown)
// goes to the broker; for a message left unknown the broker later asks the group, and the
// listener's Check answers.
//
// Errors: the sentinels (ErrNotStarted, ErrMessageTooLarge, ErrNoRoute, …) are tested with
// errors.Is; a broker's refusal is a *BrokerError carrying its response code and remark; a
// send that ran out of time wraps context.DeadlineExceeded. Every option documents its
// default; the defaults are also the Default… constants.
//
// # Lock order
//
// A Producer's lifecycle lock, its batcher's lock and its callback queue's lock are never
// held together, nor while waiting; see Producer.
//
// # Notes
//
//   - Like the consumer, a Producer owns its client core and client id (WithClientOptions)
//     unless one is shared with WithClient: there is no process-wide state, unlike
//     RocketMQ's clients which share one instance per instance name.
//   - Oneway sends are never retried and report only local failures.
//   - Concurrent sends to a topic without a route ask the name servers once: route fetches
//     are shared (the client core's).
package producer
