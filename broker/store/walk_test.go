package store

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

func TestWalkMessagesStops(t *testing.T) {
	s := openT(t, t.TempDir(), testOptions())
	defer s.Close()
	res := putN(t, s, "T", 0, 2, "")
	end := s.written.Load()
	msgs := make([]byte, end)
	require.NoError(t, s.readLog(msgs, 0))
	segEnd := s.opts.SegmentSize

	walk := func(chunk []byte, checkCRC bool) (int64, walkStop, string, []int64) {
		var seen []int64
		p, stop, reason, err := walkMessages(chunk, 0, segEnd, checkCRC, func(m *msgInfo) error {
			seen = append(seen, m.phys)
			return nil
		})
		require.NoError(t, err)
		return p, stop, reason, seen
	}
	all := []int64{res[0].CommitLogOffset, res[1].CommitLogOffset}

	p, stop, _, seen := walk(append(append([]byte(nil), msgs...), make([]byte, blankMin)...), true)
	assert.Equal(t, walkZero, stop)
	assert.Equal(t, end, p)
	assert.Equal(t, all, seen)

	blank := binary.BigEndian.AppendUint32(nil, uint32(segEnd-end))
	blank = binary.BigEndian.AppendUint32(blank, protocol.MagicBlank)
	p, stop, _, seen = walk(append(append([]byte(nil), msgs...), blank...), true)
	assert.Equal(t, walkBlank, stop)
	assert.Equal(t, end, p)
	assert.Equal(t, all, seen)

	p, stop, reason, _ := walk(append(append([]byte(nil), msgs...), 0, 0, 0, 5, 0, 0, 0, 1), true)
	assert.Equal(t, walkBad, stop)
	assert.Equal(t, end, p)
	assert.Contains(t, reason, "TOTALSIZE 5")

	p, stop, _, seen = walk(msgs[:end-10], true)
	assert.Equal(t, walkNeedMore, stop, "the second message is cut short")
	assert.Equal(t, res[1].CommitLogOffset, p)
	assert.Equal(t, all[:1], seen)

	torn := append([]byte(nil), msgs...)
	torn[res[1].CommitLogOffset-1] ^= 0xFF // the first message's last property byte
	p, stop, _, seen = walk(torn, false)
	assert.Equal(t, walkNeedMore, stop, "without the CRC check a changed byte in the properties passes")
	assert.Equal(t, end, p)
	assert.Equal(t, all, seen)
	body := append([]byte(nil), msgs...)
	body[protocol.StoredBornHostAt+8+8+8+4+8+4] ^= 0xFF // the first message's first body byte
	p, stop, reason, seen = walk(body, true)
	assert.Equal(t, walkBad, stop)
	assert.Equal(t, int64(0), p)
	assert.Contains(t, reason, "CRC")
	assert.Empty(t, seen)

	boom := errors.New("boom")
	_, _, _, err := walkMessages(msgs, 0, segEnd, true, func(*msgInfo) error { return boom })
	assert.ErrorIs(t, err, boom)
}
