// Package clientcore is the client core shared by flowd's producer and lite-pull consumer:
// what RocketMQ calls the MQClientInstance. Users see it as client.Client, which carries a
// core (Handle) and exposes only its construction, id and Close; the producer and consumer
// reach the core with Of, and Open picks a shared core or builds their own.
//
// A Client owns one remoting connection per broker and name server, a topic route cache, the
// heartbeats that keep its consumer groups' membership alive on every broker, and the handler
// for the requests brokers send to clients (NOTIFY_CONSUMER_IDS_CHANGED,
// GET_CONSUMER_RUNNING_INFO, RESET_CONSUMER_OFFSET, CHECK_TRANSACTION_STATE,
// PUSH_REPLY_MESSAGE_TO_CLIENT). Producers and consumers register into it by group.
//
// There is no package-level state: every producer or consumer builds its own Client unless
// one is handed to it, so two consumers in one process always have distinct client ids,
// which RocketMQ only achieves when told a different instance name.
//
// The daemon's own short-lived clients (a pipeline checking its sink topic) and tests use a
// Client directly:
//
//	cl, err := clientcore.New(clientcore.Options{NameServers: []string{"127.0.0.1:9876"}})
//	if err != nil { … }
//	defer cl.Close(ctx)
//	if err := cl.Start(); err != nil { … } // heartbeats and route refreshes; Start is idempotent
//	if err := cl.RegisterConsumer("group", hooks); err != nil { … }
//	r, err := cl.Route(ctx, "orders")     // cached; refreshed every RouteRefreshInterval
//	addr, _ := r.BrokerAddr(r.SubscribeQueues[0].BrokerName)
//	resp, err := cl.InvokeOK(ctx, addr, req) // any other code than SUCCESS is a *BrokerError
//	…
//	_ = cl.UnregisterConsumer(ctx, "group")
//
// # Lock order
//
//	hbMu → mu
//
// hbMu serializes heartbeats with unregistrations; it is held across network I/O and while
// calling Consumer.ConsumerData, which therefore must not call back into the heartbeat or
// unregistration methods. mu guards the route cache, the route fetches in flight, the
// registrations and the name-server cursor. It is a leaf: it is never held across network I/O
// or while calling into a registered consumer (hooks run after it is released), so a consumer
// may call back into the Client from any other hook.
package clientcore
