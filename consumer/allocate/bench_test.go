package allocate

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/flowd-io/flowd/protocol"
)

// BenchmarkAllocate is one member's call in a group of 100 members sharing 1 000 queues on 10
// brokers in 3 rooms (members in 2 of them).
func BenchmarkAllocate(b *testing.B) {
	const nq, nc = 1000, 100
	// As from a route table: one string per broker, shared by its queues.
	brokers := make([]string, 10)
	for b := range brokers {
		brokers[b] = fmt.Sprintf("r%d@broker-%d", b%3, b)
	}
	queues := make([]protocol.MessageQueue, 0, nq)
	for k := range nq {
		queues = append(queues, protocol.MessageQueue{Topic: "BenchTopic", BrokerName: brokers[k/100], QueueID: k % 100})
	}
	slices.SortFunc(queues, protocol.MessageQueue.Compare)
	members := propertyClients(nc)
	weights := make(map[string]int)
	for i, id := range members {
		weights[id] = 1 + i%2
	}
	req := Request{Group: "bench", ClientID: members[nc/2], Queues: queues, ClientIDs: members}
	// History for Sticky: the averagely assignment before the last member joined.
	prev := allocateAll(b, Averagely(), Request{Group: "bench", Queues: queues, ClientIDs: members[:nc-1]})

	for _, s := range []Strategy{
		Averagely(),
		ByCircle(),
		ByConfig(queues[:10]),
		ByMachineRoom([]string{"r0", "r1", "r2"}),
		MachineRoomNearby(Averagely(), prefixResolver{}),
		ConsistentHash(0),
		ByWeight(weights),
		Sticky(Averagely()),
	} {
		r := req
		if s.Name() == PrefixSticky+NameAveragely {
			r.Previous = prev
		}
		b.Run(s.Name(), func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			for b.Loop() {
				if _, err := s.Allocate(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
