package protocol

// GetLockOwners is a flowd extension, not a RocketMQ request code: it asks a broker who holds
// the queue locks (LOCK_BATCH_MQ) of one consumer group's queues of one topic. The request
// body is a [LockOwnersRequestBody], the answer's body a [LockOwnersResponseBody], both JSON.
// A RocketMQ broker answers it with REQUEST_CODE_NOT_SUPPORTED.
//
// flowd's lite-pull consumer locks every queue it reads, so a group's lock table on the broker
// is its current assignment, and it is the same for every member that reads it. Members pass
// it to their allocation strategy as the previous assignment, so that sticky strategies agree
// across the group whatever join and leave notifications each member happened to see.
//
// The code is far above RocketMQ's (which stay below a few thousand) so that the two never
// meet.
const GetLockOwners RequestCode = 30001

// LockOwnersRequestBody is the body of GET_LOCK_OWNERS (a flowd extension).
type LockOwnersRequestBody struct {
	ConsumerGroup string `json:"consumerGroup"`
	Topic         string `json:"topic"`
}

// LockOwnersResponseBody answers GET_LOCK_OWNERS: for each client id that holds locks of the
// group's queues of the topic, those queues, sorted. Locks whose lease ran out are left out.
// A group with no lock answers an empty (non-null) table.
//
// Allocators maps each member of the group the broker knows to the allocator identity its
// heartbeat reported ([ConsumerData.Allocator]), "" for a member that reported none (a
// RocketMQ client). Members read it before allocating: while they disagree, every flowd
// member falls back to the same built-in strategy, so that the group never splits between
// two algorithms. It is absent from an older flowd broker's answer.
type LockOwnersResponseBody struct {
	Owners     map[string][]MessageQueue `json:"owners"`
	Allocators map[string]string         `json:"allocators,omitempty"`
}
