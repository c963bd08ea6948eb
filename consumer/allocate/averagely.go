package allocate

import (
	"context"
	"slices"

	"github.com/flowd-io/flowd/protocol"
)

// Averagely returns RocketMQ's default strategy, "AVG": member i of nc takes a contiguous
// range of the sorted queues, the first nq%nc members one queue more than the rest. With more
// members than queues, the first nq members take one queue each and the others none.
//
// 10 queues among 4 members: [0 1 2] [3 4 5] [6 7] [8 9].
//
// # Notes
//
//   - Contiguous ranges keep a member's queues on as few brokers as possible, which is also
//     why a membership change shifts nearly every range: use [Sticky] to avoid that.
func Averagely() Strategy { return averagely{} }

type averagely struct{}

func (averagely) Name() string { return NameAveragely }

func (averagely) Allocate(ctx context.Context, req Request) ([]protocol.MessageQueue, error) {
	index, err := begin(ctx, req)
	if err != nil {
		return nil, err
	}
	if index < 0 {
		return none(), nil
	}
	start, count := averageShare(len(req.Queues), len(req.ClientIDs), index)
	if count == 0 {
		return none(), nil
	}
	return slices.Clone(req.Queues[start : start+count]), nil
}

// ByCircle returns "AVG_BY_CIRCLE": queue k goes to member k%nc, round robin.
//
// 10 queues among 4 members: [0 4 8] [1 5 9] [2 6] [3 7].
//
// # Notes
//
//   - Queues sort by broker first, so round robin spreads each member's queues across
//     brokers: good for balancing broker load, at the cost of more connections per member.
func ByCircle() Strategy { return byCircle{} }

type byCircle struct{}

func (byCircle) Name() string { return NameByCircle }

func (byCircle) Allocate(ctx context.Context, req Request) ([]protocol.MessageQueue, error) {
	index, err := begin(ctx, req)
	if err != nil {
		return nil, err
	}
	if index < 0 {
		return none(), nil
	}
	nq, nc := len(req.Queues), len(req.ClientIDs)
	if index >= nq {
		return none(), nil
	}
	out := make([]protocol.MessageQueue, 0, (nq-index+nc-1)/nc)
	for k := index; k < nq; k += nc {
		out = append(out, req.Queues[k])
	}
	return out, nil
}
