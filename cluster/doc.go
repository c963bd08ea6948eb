// Package cluster makes a flowd broker a member of a cluster of brokers that share their
// state through JetStream KV on a NATS cluster, the NATS servers playing RocketMQ's name
// server.
//
// A Member keeps three buckets in step with its broker:
//
//   - the registry (Options.BrokersBucket): one entry per live broker (BrokerInfo), rewritten
//     every Options.HeartbeatInterval; the bucket's max age is Options.TTL, so the entry of a
//     node that stops heartbeating expires and every watcher is told (a BrokerLeft event);
//   - the topics (Options.TopicsBucket): one entry per topic (TopicRecord). A topic created on
//     any broker is written there, and every broker materialises it with the same queue count;
//     an update is written with compare-and-set on the last revision;
//   - the subscription groups (Options.GroupsBucket): one entry per group (GroupRecord),
//     created, updated and deleted on every broker alike.
//
// The buckets are watched into memory, so the name service (the Member is the broker's
// Config.Peers) answers routes without waiting on NATS.
//
// A replica set's node runs a Member with Options.ReplicaSet: the set's master holds its
// broker name's registry entry (with its epoch and the set's addresses by broker id), the
// next master's entry replacing it; replicas watch the buckets and write nothing.
//
// A PluginStore shares the Wasm plugins: a plugins.Store whose modules are in a JetStream
// object store and whose versions, active versions and per-node reports are in a KV bucket.
// Each node's plugins.Registry runs on it with a local plugins.DirStore as its copy, and
// follows every deploy, activation and removal made on any node. docs/cluster.md has the
// rules.
package cluster
