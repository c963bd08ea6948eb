package allocate

import (
	"cmp"
	"context"
	"crypto/md5"
	"encoding/binary"
	"slices"
	"strconv"

	"github.com/flowd-io/flowd/protocol"
)

// DefaultVirtualNodes is the number of ring points per member [ConsistentHash] uses when given
// none, the Java client's default.
const DefaultVirtualNodes = 10

// ConsistentHash returns "CONSISTENT_HASH", compatible with the Java client's
// AllocateMessageQueueConsistentHash: every member puts virtualNodes points on a ring of
// 32-bit values, point j of member id at the first four bytes, big-endian, of
// MD5(id + "-" + j); a queue goes to the member owning the first point at or after the
// first four bytes of MD5 of its Java string form, "MessageQueue [topic=T, brokerName=B,
// queueId=N]", wrapping round to the lowest point.
//
// When a member leaves only its queues move, and when one joins only queues it takes move:
// the rest of the ring is unchanged. The price is balance: with few points per member, shares
// can be quite uneven.
//
// # Notes
//
//   - virtualNodes <= 0 means [DefaultVirtualNodes]. (Java rejects negative counts and with 0
//     assigns nothing; neither is useful.) Every member must use the same count; it is not
//     part of the name, as in Java.
//   - If two points hash equal, the one inserted last wins, as with Java's TreeMap.put over
//     members in sorted order and points in index order.
//   - Each call hashes nc*virtualNodes+nq strings: O((nc*virtualNodes+nq)·log) per member,
//     the costliest built-in strategy.
func ConsistentHash(virtualNodes int) Strategy {
	if virtualNodes <= 0 {
		virtualNodes = DefaultVirtualNodes
	}
	return consistentHash{vnodes: virtualNodes}
}

type consistentHash struct{ vnodes int }

func (consistentHash) Name() string { return NameConsistentHash }

// ringPoint is one virtual node. seq is its insertion order, c*vnodes+j for point j of member
// c, which gives both the owner and the TreeMap tie-break.
type ringPoint struct {
	hash uint32
	seq  int
}

func (s consistentHash) Allocate(ctx context.Context, req Request) ([]protocol.MessageQueue, error) {
	index, err := begin(ctx, req)
	if err != nil {
		return nil, err
	}
	if index < 0 {
		return none(), nil
	}

	buf := make([]byte, 0, 128)
	ring := make([]ringPoint, 0, len(req.ClientIDs)*s.vnodes)
	for c, id := range req.ClientIDs {
		for j := range s.vnodes {
			buf = strconv.AppendInt(append(append(buf[:0], id...), '-'), int64(j), 10)
			ring = append(ring, ringPoint{hash: ringHash(buf), seq: c*s.vnodes + j})
		}
	}
	slices.SortFunc(ring, func(a, b ringPoint) int {
		if c := cmp.Compare(a.hash, b.hash); c != 0 {
			return c
		}
		return cmp.Compare(a.seq, b.seq)
	})
	// Keep the last point of every run of equal hashes.
	kept := ring[:0]
	for i, p := range ring {
		if i+1 < len(ring) && ring[i+1].hash == p.hash {
			continue
		}
		kept = append(kept, p)
	}
	ring = kept

	var out []protocol.MessageQueue
	for _, q := range req.Queues {
		h := ringHash(appendQueueKey(buf[:0], q))
		at, _ := slices.BinarySearchFunc(ring, h, func(p ringPoint, h uint32) int { return cmp.Compare(p.hash, h) })
		if at == len(ring) {
			at = 0
		}
		if ring[at].seq/s.vnodes == index {
			out = append(out, q)
		}
	}
	if out == nil {
		return none(), nil
	}
	return out, nil
}

// ringHash is the Java client's MD5 hash: the first four digest bytes as a big-endian
// unsigned number.
func ringHash(key []byte) uint32 {
	sum := md5.Sum(key)
	return binary.BigEndian.Uint32(sum[:4])
}

// appendQueueKey appends q.String() without going through fmt: the hash key of a queue.
func appendQueueKey(b []byte, q protocol.MessageQueue) []byte {
	b = append(b, "MessageQueue [topic="...)
	b = append(b, q.Topic...)
	b = append(b, ", brokerName="...)
	b = append(b, q.BrokerName...)
	b = append(b, ", queueId="...)
	b = strconv.AppendInt(b, int64(q.QueueID), 10)
	return append(b, ']')
}
