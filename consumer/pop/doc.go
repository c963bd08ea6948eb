// Package pop is a pop consumer: the broker, not the consumer, keeps each message's
// progress (RocketMQ 5's pop consumption over the remoting protocol).
//
// Receive pops up to a batch of messages of the topic for the group from the topic's
// brokers; each is invisible to the group's other receives for the invisible duration
// (WithInvisibleDuration). Ack acknowledges messages for good, many in one request per
// broker; ChangeInvisibleDuration makes one invisible for another while (0: visible again
// at once, a negative acknowledgement). A message not acknowledged in time is received
// again with its Attempt counted up; after the group's last attempt the broker moves it to
// the group's dead-letter topic. The group needs no membership, no rebalance and no
// offsets: any number of consumers of a group share its messages.
//
//	c, err := pop.New("my-group", "my-topic", pop.WithClientOptions(client.WithNameServers("127.0.0.1:9876")))
//	...
//	msgs, err := c.Receive(ctx, 32)
//	... handle them ...
//	err = c.Ack(ctx, msgs...)
package pop
