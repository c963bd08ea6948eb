package broker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A batch acknowledgement answers each handle on its own: good ones of two queues are done,
// a forged one, one acknowledged before and one of another group fail, each with its error.
// What it acknowledged is journaled, one record each, and stays acknowledged through a
// kill -9.
func TestPopAckBatchPerHandleOutcomesSurviveKill(t *testing.T) {
	dir := t.TempDir()
	b := newPopBroker(t, dir)
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 2, WriteQueueNums: 2, Perm: 6}))
	popSendN(t, b, "T", 0, 4, nil)
	popSendN(t, b, "T", 1, 4, nil)
	ctx := context.Background()
	var got []PoppedMessage
	for len(got) < 8 {
		more, err := b.Pop(ctx, popReq("G", "T", 32))
		require.NoError(t, err)
		require.NotEmpty(t, more)
		got = append(got, more...)
	}
	other, err := b.Pop(ctx, popReq("H", "T", 1))
	require.NoError(t, err)
	require.Len(t, other, 1)
	require.NoError(t, b.PopAck(ctx, "G", "T", got[0].Handle))

	forged := []byte(got[1].Handle)
	forged[len(forged)-1] ^= 1
	handles := []string{got[1].Handle, string(forged), got[0].Handle, other[0].Handle}
	for _, m := range got[2:7] {
		handles = append(handles, m.Handle)
	}
	before := journalSize(t, dir)
	errs := b.PopAckBatch(ctx, "G", "T", handles)
	require.Len(t, errs, len(handles))
	assert.NoError(t, errs[0])
	assert.ErrorIs(t, errs[1], ErrInvalidReceiptHandle, "forged")
	assert.ErrorIs(t, errs[2], ErrInvalidReceiptHandle, "acknowledged before")
	assert.ErrorIs(t, errs[3], ErrInvalidReceiptHandle, "another group's handle")
	for i, err := range errs[4:] {
		assert.NoError(t, err, "entry %d", i+4)
	}
	// Six acknowledgements of 21 bytes each (8 of frame, kind, queue id, offset).
	assert.Equal(t, int64(6*21), journalSize(t, dir)-before)
	assert.ErrorIs(t, b.PopAck(ctx, "G", "T", got[1].Handle), ErrInvalidReceiptHandle, "done by the batch")

	crashed := copyDir(t, dir)
	b2 := newPopBroker(t, crashed)
	var inflight, acked int
	for _, st := range b2.PopStats("G") {
		inflight += st.InFlight
		acked += int(st.Acked)
	}
	assert.Equal(t, 1, inflight, "only got[7] is still in flight")
	assert.Equal(t, 7, acked)
	for _, m := range got[:7] {
		assert.ErrorIs(t, b2.PopAck(ctx, "G", "T", m.Handle), ErrInvalidReceiptHandle, fmt.Sprintf("%d/%d", m.Message.QueueID, m.Message.QueueOffset))
	}
	require.NoError(t, b2.PopAck(ctx, "G", "T", got[7].Handle))
}

// journalSize is the size of the pop journal of dir.
func journalSize(t *testing.T, dir string) int64 {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "pop", "journal-*.log"))
	require.NoError(t, err)
	require.Len(t, files, 1)
	st, err := os.Stat(files[0])
	require.NoError(t, err)
	return st.Size()
}
