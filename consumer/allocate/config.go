package allocate

import (
	"context"
	"slices"

	"github.com/flowd-io/flowd/protocol"
)

// ByConfig returns "CONFIG": every member gets the configured queues, whatever the topic's
// queues and the group's members are. The list is copied; later changes to queues do not
// affect the strategy.
//
// # Notes
//
//   - This is the one strategy that does not partition: each member consuming the same list
//     is the point (it is how RocketMQ users pin a consumer to queues). Its result is in the
//     configured order and is not checked against req.Queues, as in the Java client.
//   - Unlike the Java client, which returns the list before checking anything, the request is
//     validated like any other and a non-member gets nothing: one rule for all strategies.
func ByConfig(queues []protocol.MessageQueue) Strategy {
	return byConfig{queues: slices.Clone(queues)}
}

type byConfig struct{ queues []protocol.MessageQueue }

func (byConfig) Name() string { return NameByConfig }

func (s byConfig) Allocate(ctx context.Context, req Request) ([]protocol.MessageQueue, error) {
	index, err := begin(ctx, req)
	if err != nil {
		return nil, err
	}
	if index < 0 || len(s.queues) == 0 {
		return none(), nil
	}
	return slices.Clone(s.queues), nil
}
