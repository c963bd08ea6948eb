// Command go-averagely is a flowd allocator plugin: RocketMQ's default strategy, "AVG", for
// the whole group. Member i of nm takes a contiguous range of the sorted queues, the first
// nq%nm members one queue more than the others; with more members than queues, the first nq
// members take one queue each.
package main

import flowd "github.com/flowd-io/flowd/plugins/sdk/go"

func main() {}

var owners []int32 // reused: the SDK copies the result as soon as the allocator returns

func init() {
	flowd.RegisterAllocator(func(in flowd.Input) ([]int32, error) {
		nq, nm := len(in.Queues), len(in.Members)
		if nm == 0 {
			return nil, flowd.CodeInput
		}
		owners = owners[:0]
		for i := range nm {
			start, count := share(nq, nm, i)
			for range count {
				owners = append(owners, int32(i))
			}
			_ = start // ranges are contiguous and in member order
		}
		return owners, nil
	})
}

// share is member index's range [start, start+count) of nq queues among nm members.
func share(nq, nm, index int) (start, count int) {
	mod, size := nq%nm, nq/nm
	if nq <= nm {
		size = 1
	} else if mod > 0 && index < mod {
		size++
	}
	if mod > 0 && index < mod {
		start = index * size
	} else {
		start = index*size + mod
	}
	return start, max(0, min(size, nq-start))
}
