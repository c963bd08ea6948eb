package allocate_test

import (
	"context"
	"fmt"

	"github.com/flowd-io/flowd/consumer/allocate"
	"github.com/flowd-io/flowd/protocol"
)

func queues(n int) []protocol.MessageQueue {
	qs := make([]protocol.MessageQueue, n)
	for i := range qs {
		qs[i] = protocol.MessageQueue{Topic: "T", BrokerName: "broker-a", QueueID: i}
	}
	return qs
}

func ids(qs []protocol.MessageQueue) []int {
	out := []int{}
	for _, q := range qs {
		out = append(out, q.QueueID)
	}
	return out
}

func ExampleAveragely() {
	req := allocate.Request{Group: "g", Queues: queues(10), ClientIDs: []string{"a", "b", "c", "d"}}
	for _, id := range req.ClientIDs {
		req.ClientID = id
		got, _ := allocate.Averagely().Allocate(context.Background(), req)
		fmt.Println(id, ids(got))
	}
	// Output:
	// a [0 1 2]
	// b [3 4 5]
	// c [6 7]
	// d [8 9]
}

// Member "a" leaves a group of three sharing nine queues. Averagely would also move queue 5
// from b to c; Sticky moves only a's queues.
func ExampleSticky() {
	prev := map[string][]protocol.MessageQueue{"a": queues(9)[0:3], "b": queues(9)[3:6], "c": queues(9)[6:9]}
	req := allocate.Request{Group: "g", Queues: queues(9), ClientIDs: []string{"b", "c"}, Previous: prev}
	for _, id := range req.ClientIDs {
		req.ClientID = id
		sticky, _ := allocate.Sticky(allocate.Averagely()).Allocate(context.Background(), req)
		avg, _ := allocate.Averagely().Allocate(context.Background(), req)
		fmt.Println(id, "sticky", ids(sticky), "averagely", ids(avg))
	}
	// Output:
	// b sticky [0 1 3 4 5] averagely [0 1 2 3 4]
	// c sticky [2 6 7 8] averagely [5 6 7 8]
}

func ExampleByName() {
	s, err := allocate.ByName("STICKY-CONSISTENT_HASH")
	fmt.Println(s.Name(), err)
	_, err = allocate.ByName("WEIGHT")
	fmt.Println(err)
	// Output:
	// STICKY-CONSISTENT_HASH <nil>
	// allocate: unknown strategy: "WEIGHT" (strategies needing configuration have constructors)
}
