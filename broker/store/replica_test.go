package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/flowd-io/flowd/protocol"
	"github.com/stretchr/testify/require"
)

func smallSegOptions() Options {
	o := testOptions()
	o.SegmentSize = 8192 // a few dozen messages a segment: replication crosses rolls
	return o
}

// replicate copies everything from src to dst through ReadRaw and AppendRaw, in chunks of
// at most max bytes, as the HA stream does, and returns the number of chunks.
func replicate(t *testing.T, src, dst *Store, max int) int {
	t.Helper()
	chunks := 0
	for {
		off := dst.Stats().CommitLogMaxOffset
		b, next, err := src.ReadRaw(off, max)
		require.NoError(t, err)
		if len(b) == 0 {
			require.Equal(t, off, next)
			return chunks
		}
		end, err := dst.AppendRaw(off, b)
		require.NoError(t, err)
		require.Equal(t, next, end, "the replica's end after a chunk is where the master reads next")
		chunks++
	}
}

func readQueue(t *testing.T, s *Store, topic string, qid int32) []*protocol.MessageExt {
	t.Helper()
	var out []*protocol.MessageExt
	for off := int64(0); ; {
		r := get(t, s, topic, qid, off, 100, 1<<20, nil)
		if len(r.Messages) == 0 {
			return out
		}
		out = append(out, decodeAll(t, r)...)
		off = r.NextBeginOffset
	}
}

func TestReplicaAppendBuildsItsOwnQueuesAndIndex(t *testing.T) {
	o := smallSegOptions()
	master := openT(t, t.TempDir(), o)
	defer master.Close()
	replica := openT(t, t.TempDir(), o)
	defer replica.Close()

	for i := range 120 {
		m := newMsg("orders", int32(i%3), fmt.Sprintf("body-%03d", i), "tagA")
		m.Properties[protocol.PropertyKeys] = fmt.Sprintf("k%d", i)
		_, err := master.Put(context.Background(), m)
		require.NoError(t, err)
	}
	require.Greater(t, master.Stats().Segments, 2, "the test must cross segment rolls")
	waitDispatch(t, master)
	chunks := replicate(t, master, replica, 700)
	require.Greater(t, chunks, 10)
	waitDispatch(t, replica)

	require.Equal(t, master.Stats().CommitLogMaxOffset, replica.Stats().CommitLogMaxOffset)
	for q := range int32(3) {
		require.Equal(t, master.MaxOffset("orders", q), replica.MaxOffset("orders", q))
		want := readQueue(t, master, "orders", q)
		got := readQueue(t, replica, "orders", q)
		require.Len(t, got, 40)
		for i := range want {
			require.Equal(t, want[i].Body, got[i].Body)
			require.Equal(t, want[i].CommitLogOffset, got[i].CommitLogOffset)
		}
	}
	checkConsistent(t, replica)
	qr, err := replica.QueryMessages(context.Background(), "orders", "k77", false, 4, 0, 1<<62)
	require.NoError(t, err)
	require.Len(t, qr.Messages, 1, "the replica's dispatcher indexed the keys")

	// A promoted replica takes sends after the replicated messages, in queue order.
	r, err := replica.Put(context.Background(), newMsg("orders", 1, "after-promotion", ""))
	require.NoError(t, err)
	require.Equal(t, int64(40), r.QueueOffset)
	require.Equal(t, master.Stats().CommitLogMaxOffset, r.CommitLogOffset)
}

func TestAppendRawRefusesWhatWouldCorruptTheLog(t *testing.T) {
	o := smallSegOptions()
	master := openT(t, t.TempDir(), o)
	defer master.Close()
	replica := openT(t, t.TempDir(), o)
	defer replica.Close()
	putN(t, master, "t", 0, 5, "")

	b, _, err := master.ReadRaw(0, 1<<20)
	require.NoError(t, err)

	_, err = replica.AppendRaw(100, b)
	require.ErrorIs(t, err, ErrNotAtEnd)

	bad := append([]byte(nil), b...)
	bad[protocol.StoredBodyCRCAt] ^= 0xff
	_, err = replica.AppendRaw(0, bad)
	require.ErrorIs(t, err, ErrBadRecords, "a bad body CRC")

	_, err = replica.AppendRaw(0, b[:len(b)-3])
	require.ErrorIs(t, err, ErrBadRecords, "a torn last record")

	// A queue offset that skips: the second record alone, at offset 0, has a PHYSICALOFFSET
	// that is not 0.
	first := int(binary.BigEndian.Uint32(b))
	_, err = replica.AppendRaw(0, b[first:])
	require.ErrorIs(t, err, ErrBadRecords)

	require.Equal(t, int64(0), replica.Stats().CommitLogMaxOffset, "nothing was written")
	end, err := replica.AppendRaw(0, b)
	require.NoError(t, err)
	require.Equal(t, master.Stats().CommitLogMaxOffset, end)
}

func TestReadRawBounds(t *testing.T) {
	s := openT(t, t.TempDir(), smallSegOptions())
	defer s.Close()
	res := putN(t, s, "t", 0, 3, "")
	b, next, err := s.ReadRaw(0, 1) // smaller than one message: still that one message
	require.NoError(t, err)
	require.Len(t, b, int(res[0].Size))
	require.Equal(t, res[1].CommitLogOffset, next)

	_, _, err = s.ReadRaw(res[0].CommitLogOffset+1, 1<<20)
	require.ErrorIs(t, err, ErrNotFound, "not where a record starts")
	_, _, err = s.ReadRaw(s.Stats().CommitLogMaxOffset+1, 1<<20)
	require.ErrorIs(t, err, ErrNotFound)
	b, next, err = s.ReadRaw(s.Stats().CommitLogMaxOffset, 1<<20)
	require.NoError(t, err)
	require.Empty(t, b)
	require.Equal(t, s.Stats().CommitLogMaxOffset, next)
}

func TestTruncateCutsLogQueuesAndIndex(t *testing.T) {
	o := smallSegOptions()
	dir := t.TempDir()
	s := openT(t, dir, o)
	var res []PutResult
	for i := range 100 {
		m := newMsg("t", int32(i%2), fmt.Sprintf("m-%03d", i), "")
		m.Properties[protocol.PropertyKeys] = fmt.Sprintf("k%d", i)
		r, err := s.Put(context.Background(), m)
		require.NoError(t, err)
		res = append(res, r)
	}
	waitDispatch(t, s)
	require.NoError(t, s.Close())

	cut := res[61].CommitLogOffset // keeps messages 0..60
	require.NoError(t, Truncate(dir, cut, o))

	s = openT(t, dir, o)
	require.Equal(t, cut, s.Stats().CommitLogMaxOffset)
	require.Equal(t, int64(31), s.MaxOffset("t", 0)) // 0, 2, ..., 60
	require.Equal(t, int64(30), s.MaxOffset("t", 1)) // 1, 3, ..., 59
	checkConsistent(t, s)
	qr, err := s.QueryMessages(context.Background(), "t", "k70", false, 4, 0, 1<<62)
	require.NoError(t, err)
	require.Empty(t, qr.Messages, "the key index forgot what was cut")
	qr, err = s.QueryMessages(context.Background(), "t", "k60", false, 4, 0, 1<<62)
	require.NoError(t, err)
	require.Len(t, qr.Messages, 1)

	// Appends continue at the cut, and a restart keeps them.
	r, err := s.Put(context.Background(), newMsg("t", 1, "new", ""))
	require.NoError(t, err)
	require.Equal(t, cut, r.CommitLogOffset)
	require.Equal(t, int64(30), r.QueueOffset)
	require.NoError(t, s.Close())
	s = openT(t, dir, o)
	defer s.Close()
	got := decodeAll(t, get(t, s, "t", 1, 30, 10, 1<<20, nil))
	require.Len(t, got, 1)
	require.Equal(t, "new", string(got[0].Body))
	checkConsistent(t, s)
}

func TestTruncateRefusesBelowTheLogAndAnOpenStore(t *testing.T) {
	o := smallSegOptions()
	dir := t.TempDir()
	s := openT(t, dir, o)
	putN(t, s, "t", 0, 3, "")
	err := Truncate(dir, 0, o)
	require.True(t, errors.Is(err, ErrLocked), "an open store is not cut under it: %v", err)
	require.NoError(t, s.Close())
	require.NoError(t, Truncate(dir, 0, o))
	s = openT(t, dir, o)
	defer s.Close()
	require.Equal(t, int64(0), s.Stats().CommitLogMaxOffset)
	require.Equal(t, int64(0), s.MaxOffset("t", 0))
}
