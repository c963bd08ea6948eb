package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowd-io/flowd/protocol"
	"github.com/stretchr/testify/require"
)

var testHost = netip.MustParseAddrPort("10.1.2.3:10911")

func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 4}))
}

func testOptions() Options {
	return Options{
		StoreHost:          testHost,
		Logger:             testLogger(),
		SegmentSize:        1 << 20,
		FlushInterval:      10 * time.Millisecond,
		CleanInterval:      time.Hour,
		MaxDiskUsage:       -1,
		CheckpointInterval: 50 * time.Millisecond,
	}
}

func openT(t testing.TB, dir string, o Options) *Store {
	t.Helper()
	s, err := Open(dir, o)
	require.NoError(t, err)
	return s
}

func newMsg(topic string, qid int32, body string, tags string) *protocol.MessageExt {
	m := &protocol.MessageExt{QueueID: qid, BornTimestamp: 1700000000000, BornHost: netip.MustParseAddrPort("192.168.0.9:5555")}
	m.Topic = topic
	m.Body = []byte(body)
	m.Properties = map[string]string{protocol.PropertyUniqueKey: "u-" + body}
	if tags != "" {
		m.Properties[protocol.PropertyTags] = tags
	}
	return m
}

func putN(t testing.TB, s *Store, topic string, qid int32, n int, tags string) []PutResult {
	t.Helper()
	var out []PutResult
	for i := range n {
		r, err := s.Put(context.Background(), newMsg(topic, qid, fmt.Sprintf("%s-%d-body-%d", topic, qid, i), tags))
		require.NoError(t, err)
		out = append(out, r)
	}
	return out
}

func waitDispatch(t testing.TB, s *Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.waitDispatched(ctx, s.written.Load()))
}

func get(t testing.TB, s *Store, topic string, qid int32, off int64, maxMsgs, maxBytes int, f *Filter) *GetResult {
	t.Helper()
	r, err := s.GetMessage(context.Background(), topic, qid, off, maxMsgs, maxBytes, f)
	require.NoError(t, err)
	return r
}

func decodeAll(t testing.TB, r *GetResult) []*protocol.MessageExt {
	t.Helper()
	var out []*protocol.MessageExt
	for _, b := range r.Messages {
		m, n, err := protocol.DecodeStored(b)
		require.NoError(t, err)
		require.Equal(t, len(b), n)
		out = append(out, m)
	}
	return out
}

// checkConsistent verifies every consume-queue unit of every queue: it points at a valid
// message of that queue with that queue offset, and units are contiguous.
func checkConsistent(t testing.TB, s *Store) {
	t.Helper()
	for topic, ids := range s.Queues() {
		for _, id := range ids {
			q := s.queue(topic, id)
			lo, hi := q.min.Load(), q.max.Load()
			prev := int64(-1)
			for i := lo; i < hi; i++ {
				off, size, tags, err := q.unitAt(i)
				require.NoError(t, err, "unit %s/%d@%d", topic, id, i)
				require.Greater(t, off, prev, "unit %s/%d@%d", topic, id, i)
				prev = off
				b, err := s.MessageAt(off)
				require.NoError(t, err, "unit %s/%d@%d -> %d", topic, id, i, off)
				require.Len(t, b, int(size))
				m, _, err := protocol.DecodeStored(b)
				require.NoError(t, err)
				require.Equal(t, topic, m.Topic)
				require.Equal(t, id, m.QueueID)
				require.Equal(t, i, m.QueueOffset)
				require.Equal(t, protocol.TagsCode(m.Properties[protocol.PropertyTags]), tags)
			}
		}
	}
}

// tagsOf is the filter of a tag subscription.
func tagsOf(tags ...string) *Filter {
	f := &Filter{TagsCodes: []int64{}}
	for _, t := range tags {
		f.TagsCodes = append(f.TagsCodes, protocol.TagsCode(t))
	}
	return f
}

var errFilterTest = errors.New("filter unavailable")

// countingFilter is a BatchFilter that keeps the candidates match accepts (all when match
// is nil) and counts its calls and the candidates it saw.
type countingFilter struct {
	match func(Candidate) bool
	// failOn makes the failOn-th call and every later one fail (0: never); panics makes
	// them panic instead.
	failOn   int64
	panics   bool
	calls    atomic.Int64
	seen     atomic.Int64
	maxBatch atomic.Int64
}

func (c *countingFilter) MatchBatch(ctx context.Context, msgs []Candidate, keep []bool) error {
	call := c.calls.Add(1)
	c.seen.Add(int64(len(msgs)))
	for {
		m := c.maxBatch.Load()
		if int64(len(msgs)) <= m || c.maxBatch.CompareAndSwap(m, int64(len(msgs))) {
			break
		}
	}
	if c.failOn > 0 && call >= c.failOn {
		if c.panics {
			panic("filter bug")
		}
		return errFilterTest
	}
	for i, m := range msgs {
		keep[i] = c.match == nil || c.match(m)
	}
	return nil
}

func runtimeGosched() { time.Sleep(time.Millisecond) }
