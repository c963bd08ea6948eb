// Package allocate holds the queue-allocation strategies a consumer group uses to share a
// topic's queues among its members during a rebalance.
//
// Allocation is decentralised: there is no coordinator, every member computes its own share
// from the same inputs (the topic's queues and the group's client ids, both sorted) and trusts
// that the others, running the same strategy on the same inputs, take the rest. A [Strategy]
// is therefore a pure function of its [Request]: same inputs, same answer, on every member,
// in every language.
//
// Strategies compatible with the Java client (a group may mix Java and flowd members):
//
//   - [Averagely] ("AVG"): contiguous ranges, the first nq%nc members take one more.
//   - [ByCircle] ("AVG_BY_CIRCLE"): round robin.
//   - [ByConfig] ("CONFIG"): a fixed list.
//   - [ByMachineRoom] ("MACHINE_ROOM"): only queues of brokers named "room@broker" whose room
//     is in a configured set.
//   - [MachineRoomNearby] ("MACHINE_ROOM_NEARBY-"+inner): a room's queues go to that room's
//     members while it has any.
//   - [ConsistentHash] ("CONSISTENT_HASH"): an MD5 ring; a membership change moves only the
//     queues of the member that joined or left.
//
// flowd's own:
//
//   - [ByWeight] ("WEIGHT"): queue counts proportional to per-member weights.
//   - [Sticky] ("STICKY-"+inner): balanced like AVG, but every member keeps as many of the
//     queues it held before as balance allows, so a membership change moves the fewest queues.
//     This uses [Request.Previous], which RocketMQ's stateless allocators never get.
//
// # Notes
//
//   - [Validate] is shared by every strategy and is stricter than RocketMQ: besides rejecting an
//     empty client id and empty lists, it rejects unsorted or duplicated queues and client ids.
//     The whole scheme rests on every member seeing identical sorted inputs; a member that
//     does not is a bug that would otherwise show up only as queues consumed twice or not at
//     all.
//   - A client id that is not a member gets an empty result and no error, as in RocketMQ: a
//     member whose view of the group is stale simply sits out until the next rebalance.
//   - Results are always fresh slices (never nil when err is nil) and inputs are never
//     modified, so callers may keep or change either freely.
//   - Strategies hold no mutable state and are safe for concurrent use.
package allocate
