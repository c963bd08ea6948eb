// Command go-sticky is a flowd allocator plugin that keeps queues where they were. Every
// member ends with nq/nm or nq/nm+1 queues (nq%nm of them with one more), as with "AVG", but
// a queue stays with its previous owner whenever that owner is still a member and under its
// share; only the queues left over move, to the members with the fewest. After a member
// joins, only the queues it takes move; after one leaves, mostly only its queues move.
//
// Without a previous assignment it allocates like "AVG".
package main

import flowd "github.com/flowd-io/flowd/plugins/sdk/go"

func main() {}

var owners, counts []int32 // reused between calls

func init() {
	flowd.RegisterAllocator(func(in flowd.Input) ([]int32, error) {
		nq, nm := len(in.Queues), len(in.Members)
		if nm == 0 {
			return nil, flowd.CodeInput
		}
		base, extra := int32(nq/nm), nq%nm
		owners = grow(owners, nq)
		counts = grow(counts, nm)
		for k := range owners {
			owners[k] = -1
		}
		clear(counts)
		if len(in.Previous) == nq {
			// Keep previous owners up to their base share, then let them keep one more while
			// extra shares remain.
			for k, p := range in.Previous {
				if p >= 0 && int(p) < nm && counts[p] < base {
					owners[k] = p
					counts[p]++
				}
			}
			for k, p := range in.Previous {
				if extra > 0 && owners[k] < 0 && p >= 0 && int(p) < nm && counts[p] == base {
					owners[k] = p
					counts[p]++
					extra--
				}
			}
		}
		// The rest go to members under their base share, then to those that may take one more.
		under, atBase := 0, 0
		for k := range owners {
			if owners[k] >= 0 {
				continue
			}
			for under < nm && counts[under] >= base {
				under++
			}
			var m int
			if under < nm {
				m = under
			} else {
				for atBase < nm && counts[atBase] != base {
					atBase++
				}
				if atBase == nm || extra == 0 {
					return nil, flowd.CodeGeneric // unreachable: shares add up to nq
				}
				m = atBase
				extra--
			}
			owners[k] = int32(m)
			counts[m]++
		}
		return owners, nil
	})
}

func grow(s []int32, n int) []int32 {
	if cap(s) < n {
		return make([]int32, n)
	}
	return s[:n]
}
