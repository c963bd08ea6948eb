package allocate

import (
	"context"
	"crypto/md5"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

func TestQueueKeyIsJavaString(t *testing.T) {
	for _, q := range []protocol.MessageQueue{
		{Topic: "topic_test", BrokerName: "brokerName", QueueID: 0},
		{Topic: "", BrokerName: "", QueueID: -7},
		{Topic: "主题", BrokerName: "room1@broker-a", QueueID: math.MaxInt32},
	} {
		assert.Equal(t, q.String(), string(appendQueueKey(nil, q)))
	}
	assert.Equal(t, "MessageQueue [topic=T, brokerName=B, queueId=3]",
		string(appendQueueKey(nil, protocol.MessageQueue{Topic: "T", BrokerName: "B", QueueID: 3})))
}

// The ring hash against digests computed outside Go (coreutils md5sum): first 4 bytes,
// big-endian, unsigned.
func TestRingHash(t *testing.T) {
	tests := []struct {
		key  string
		want uint32
	}{
		{"CID-0-0", 0x71479af9}, // md5 71479af9a4586a33aaef3e2d737d08f9
		{"CID-0-1", 0x9ba72d02}, // md5 9ba72d0239fb75d00e757ee62fc08694
		{"CID-1-0", 0x4229c993}, // md5 4229c9931246e06b064a4fde92b57daf
		{"CID-1-1", 0x44401f7a}, // md5 44401f7a6746a75f860eee979c611a97
		{"MessageQueue [topic=topic_test, brokerName=brokerName, queueId=0]", 0x81744117},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, ringHash([]byte(tt.key)), tt.key)
	}
}

// A hard vector, worked by hand from md5sum output and confirmed against the Java client's
// AllocateMessageQueueConsistentHash(2):
//
//	ring: 0x4229c993 CID-1, 0x44401f7a CID-1, 0x71479af9 CID-0, 0x9ba72d02 CID-0
//	q0 0x81744117 → 0x9ba72d02 CID-0     q3 0x56b437f6 → 0x71479af9 CID-0
//	q1 0xd7ed6ff6 → wraps, CID-1          q4 0xcf2ca26e → wraps, CID-1
//	q2 0x2470c278 → 0x4229c993 CID-1     q5 0x61fc9f0b → 0x71479af9 CID-0
func TestConsistentHashVector(t *testing.T) {
	qs := make([]protocol.MessageQueue, 6)
	for i := range qs {
		qs[i] = protocol.MessageQueue{Topic: "topic_test", BrokerName: "brokerName", QueueID: i}
	}
	all := allocateAll(t, ConsistentHash(2), Request{Group: "g", Queues: qs, ClientIDs: []string{"CID-0", "CID-1"}})
	assert.Equal(t, []int{0, 3, 5}, queueIDs(all["CID-0"]))
	assert.Equal(t, []int{1, 2, 4}, queueIDs(all["CID-1"]))
}

// referenceRing is the slow, obvious consistent hash: for each queue, scan every ring point
// for the smallest hash >= the queue's, else the smallest of all; equal hashes go to the
// point inserted last. It shares no code with the strategy beyond crypto/md5.
func referenceRing(clients []string, vnodes int, queues []protocol.MessageQueue) map[string][]protocol.MessageQueue {
	hash := func(s string) uint32 {
		d := md5.Sum([]byte(s))
		return binary.BigEndian.Uint32(d[:])
	}
	type point struct {
		h     uint32
		owner string
	}
	var ring []point
	for _, c := range clients {
		for j := 0; j < vnodes; j++ {
			h := hash(c + "-" + strconv.Itoa(j))
			replaced := false
			for i := range ring {
				if ring[i].h == h {
					ring[i].owner, replaced = c, true
				}
			}
			if !replaced {
				ring = append(ring, point{h, c})
			}
		}
	}
	out := make(map[string][]protocol.MessageQueue)
	for _, q := range queues {
		h := hash(q.String())
		var best, lowest *point
		for i := range ring {
			p := &ring[i]
			if p.h >= h && (best == nil || p.h < best.h) {
				best = p
			}
			if lowest == nil || p.h < lowest.h {
				lowest = p
			}
		}
		if best == nil {
			best = lowest
		}
		out[best.owner] = append(out[best.owner], q)
	}
	return out
}

func TestConsistentHashMatchesReference(t *testing.T) {
	for _, vnodes := range []int{1, 3, 10} {
		for _, shape := range [][2]int{{1, 1}, {6, 2}, {20, 3}, {64, 9}, {100, 30}, {5, 12}} {
			req := Request{Group: "g", Queues: propertyQueues(shape[0]), ClientIDs: propertyClients(shape[1])}
			got := allocateAll(t, ConsistentHash(vnodes), req)
			want := referenceRing(req.ClientIDs, vnodes, req.Queues)
			for _, id := range req.ClientIDs {
				assert.Equal(t, queueIDsOrEmpty(want[id]), queueIDsOrEmpty(got[id]), "vnodes=%d shape=%v %s", vnodes, shape, id)
			}
		}
	}
}

func queueIDsOrEmpty(qs []protocol.MessageQueue) []string {
	out := []string{}
	for _, q := range qs {
		out = append(out, q.String())
	}
	return out
}

// A real collision: "CID-10147-0" and "CID-122836-0" share their first four MD5 bytes
// (d7a5471a, found by brute force). With one point each, the later-inserted point (the later
// member in sorted order) replaces the earlier, as Java's TreeMap.put does, so CID-10147 has no
// point at all. The expected shares are the Java client's output for the same input.
func TestConsistentHashTieGoesToLastInserted(t *testing.T) {
	require.Equal(t, ringHash([]byte("CID-10147-0")), ringHash([]byte("CID-122836-0")))
	require.Equal(t, uint32(0xd7a5471a), ringHash([]byte("CID-10147-0")))

	qs := make([]protocol.MessageQueue, 8)
	for i := range qs {
		qs[i] = protocol.MessageQueue{Topic: "topic_test", BrokerName: "brokerName", QueueID: i}
	}
	all := allocateAll(t, ConsistentHash(1), Request{Group: "g", Queues: qs, ClientIDs: []string{"CID-10147", "CID-122836", "CID-5"}})
	assert.Equal(t, []int{}, queueIDs(all["CID-10147"]))
	assert.Equal(t, []int{0, 2, 3, 4, 5, 6, 7}, queueIDs(all["CID-122836"]))
	assert.Equal(t, []int{1}, queueIDs(all["CID-5"]))
}

// Removing a member moves only its queues; adding one moves only queues to it.
func TestConsistentHashMinimalDisruption(t *testing.T) {
	for _, vnodes := range []int{0, 1, 3} {
		for _, shape := range [][2]int{{20, 10}, {10, 20}, {64, 5}, {7, 3}, {128, 17}} {
			nq, nc := shape[0], shape[1]
			name := fmt.Sprintf("vnodes=%d nq=%d nc=%d", vnodes, nq, nc)
			s := ConsistentHash(vnodes)
			qs := propertyQueues(nq)
			members := propertyClients(nc)
			before := ownerOf(allocateAll(t, s, Request{Group: "g", Queues: qs, ClientIDs: members}))

			for _, gone := range members {
				rest := slices.DeleteFunc(slices.Clone(members), func(id string) bool { return id == gone })
				if len(rest) == 0 {
					continue
				}
				after := ownerOf(allocateAll(t, s, Request{Group: "g", Queues: qs, ClientIDs: rest}))
				for q, was := range before {
					if was != gone {
						require.Equal(t, was, after[q], "%s: %s left, %v moved", name, gone, q)
					}
				}
			}

			for _, joiner := range []string{"a-first", "r0-c000x", "zz-last"} {
				grown := append(slices.Clone(members), joiner)
				slices.Sort(grown)
				after := ownerOf(allocateAll(t, s, Request{Group: "g", Queues: qs, ClientIDs: grown}))
				for q, now := range after {
					if now != joiner {
						require.Equal(t, before[q], now, "%s: %s joined, %v moved elsewhere", name, joiner, q)
					}
				}
			}
		}
	}
}

func ownerOf(all map[string][]protocol.MessageQueue) map[protocol.MessageQueue]string {
	out := make(map[protocol.MessageQueue]string)
	for id, qs := range all {
		for _, q := range qs {
			out[q] = id
		}
	}
	return out
}

func TestConsistentHashDefaultVirtualNodes(t *testing.T) {
	req := Request{Group: "g", Queues: propertyQueues(50), ClientIDs: propertyClients(6)}
	want := allocateAll(t, ConsistentHash(DefaultVirtualNodes), req)
	assert.Equal(t, want, allocateAll(t, ConsistentHash(0), req))
	assert.Equal(t, want, allocateAll(t, ConsistentHash(-3), req))
	assert.NotEqual(t, want, allocateAll(t, ConsistentHash(1), req))

	got, err := ConsistentHash(0).Allocate(context.Background(), Request{ClientID: "x", Queues: qsOne(), ClientIDs: []string{"x"}})
	require.NoError(t, err)
	assert.Len(t, got, 1)
}

func qsOne() []protocol.MessageQueue { return queueList(1) }
