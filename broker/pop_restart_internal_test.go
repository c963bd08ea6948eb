package broker

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// copyDir copies a live broker's data directory: the files as the page cache holds them,
// which is what a kill -9 of the broker leaves behind (no snapshot, no flush, the store's
// abort marker in place).
func copyDir(t *testing.T, from string) string {
	t.Helper()
	to := t.TempDir()
	err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), data, 0o644)
	})
	require.NoError(t, err)
	return to
}

// popRestartScenario receives 10 messages of 2 queues, acknowledges the even ones and
// leaves the odd ones in flight; it returns the handles of each.
//
// Its invisibility is long (restartInvisible): the scenario's handles must outlive a copy of
// the data directory and a second broker's start on a loaded machine; the check moves the
// pop clock past it.
func popRestartScenario(t *testing.T, b *Broker) (acked, unacked []PoppedMessage) {
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 2, WriteQueueNums: 2, Perm: 6}))
	popSendN(t, b, "T", 0, 5, nil)
	popSendN(t, b, "T", 1, 5, nil)
	ctx := context.Background()
	got, err := b.Pop(ctx, restartPopReq())
	require.NoError(t, err)
	more, err := b.Pop(ctx, restartPopReq())
	require.NoError(t, err)
	got = append(got, more...)
	require.Len(t, got, 10)
	for _, m := range got {
		if m.Message.QueueOffset%2 == 0 {
			require.NoError(t, b.PopAck(ctx, "G", "T", m.Handle))
			acked = append(acked, m)
		} else {
			unacked = append(unacked, m)
		}
	}
	return acked, unacked
}

// restartInvisible is the invisibility of popRestartScenario's receives.
const restartInvisible = 2 * time.Minute

func restartPopReq() PopRequest {
	r := popReq("G", "T", 32)
	r.Invisible = restartInvisible
	return r
}

// popCheckAfterRestart: nothing acknowledged comes back, everything unacknowledged does
// once its invisibility passes, with its attempt counted on; old handles still work until
// then.
func popCheckAfterRestart(t *testing.T, b *Broker, acked, unacked []PoppedMessage) {
	ctx := context.Background()
	none, err := b.Pop(ctx, popReq("G", "T", 32))
	require.NoError(t, err)
	require.Empty(t, none, "in-flight messages stay invisible across a restart")
	require.ErrorIs(t, b.PopAck(ctx, "G", "T", acked[0].Handle), ErrInvalidReceiptHandle, "acknowledged before the restart")
	// A handle from before the restart still acknowledges (the MAC key is persisted).
	require.NoError(t, b.PopAck(ctx, "G", "T", unacked[0].Handle))

	advance(b, restartInvisible+time.Second)
	var back []PoppedMessage
	for range 4 {
		got, err := b.Pop(ctx, popReq("G", "T", 32))
		require.NoError(t, err)
		back = append(back, got...)
	}
	want := map[[2]int64]bool{}
	for _, m := range unacked[1:] {
		want[[2]int64{int64(m.Message.QueueID), m.Message.QueueOffset}] = true
	}
	gotSet := map[[2]int64]bool{}
	for _, m := range back {
		gotSet[[2]int64{int64(m.Message.QueueID), m.Message.QueueOffset}] = true
		assert.Equal(t, 2, m.Attempt)
		require.NoError(t, b.PopAck(ctx, "G", "T", m.Handle))
	}
	require.Equal(t, want, gotSet)
	for _, st := range b.PopStats("G") {
		assert.EqualValues(t, 5, st.ConsumedOffset, "queue %d", st.QueueID)
		assert.Equal(t, 0, st.InFlight)
	}
	// New messages after the restart are handed out from where the group was.
	popSendN(t, b, "T", 0, 1, nil)
	got, err := b.Pop(ctx, popReq("G", "T", 32))
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.EqualValues(t, 5, got[0].Message.QueueOffset)
}

func TestPopSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	b := newPopBroker(t, dir)
	acked, unacked := popRestartScenario(t, b)
	require.NoError(t, b.Shutdown(context.Background()))
	popCheckAfterRestart(t, newPopBroker(t, dir), acked, unacked)
}

func TestPopSurvivesKill(t *testing.T) {
	dir := t.TempDir()
	b := newPopBroker(t, dir)
	acked, unacked := popRestartScenario(t, b)
	crashed := copyDir(t, dir) // as kill -9 leaves it: journal only, no snapshot
	_, err := os.Stat(filepath.Join(crashed, "pop", "snapshot.json"))
	require.ErrorIs(t, err, os.ErrNotExist)
	popCheckAfterRestart(t, newPopBroker(t, crashed), acked, unacked)
}

func TestPopJournalCompactionKeepsProgress(t *testing.T) {
	dir := t.TempDir()
	b := newPopBroker(t, dir)
	acked, unacked := popRestartScenario(t, b)
	b.pop.mu.Lock()
	require.NoError(t, b.pop.compact())
	b.pop.mu.Unlock()
	// A record after the compaction, then a crash.
	require.NoError(t, b.PopAck(context.Background(), "G", "T", unacked[0].Handle))
	crashed := copyDir(t, dir)
	names, err := filepath.Glob(filepath.Join(crashed, "pop", "journal-*.log"))
	require.NoError(t, err)
	require.Equal(t, []string{filepath.Join(crashed, "pop", "journal-1.log")}, names)
	b2 := newPopBroker(t, crashed)
	require.ErrorIs(t, b2.PopAck(context.Background(), "G", "T", unacked[0].Handle), ErrInvalidReceiptHandle, "acknowledged after the snapshot")
	_ = acked
}

func TestPopJournalTornTailIsDropped(t *testing.T) {
	dir := t.TempDir()
	b := newPopBroker(t, dir)
	_, unacked := popRestartScenario(t, b)
	crashed := copyDir(t, dir)
	jpath := filepath.Join(crashed, "pop", "journal-0.log")
	f, err := os.OpenFile(jpath, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.Write([]byte{0, 0, 0, 40, 1, 2, 3}) // half a record
	require.NoError(t, err)
	require.NoError(t, f.Close())
	size := fileSize(t, jpath)
	b2 := newPopBroker(t, crashed)
	assert.Equal(t, size-7, fileSize(t, jpath), "the torn record is cut off")
	require.NoError(t, b2.PopAck(context.Background(), "G", "T", unacked[0].Handle))
}

func fileSize(t *testing.T, path string) int64 {
	st, err := os.Stat(path)
	require.NoError(t, err)
	return st.Size()
}

// The journal is compacted when it passes its size, by the expiry loop, whatever the
// deadlines: progress made across several generations survives a kill.
func TestPopJournalCompactsBySize(t *testing.T) {
	dir := t.TempDir()
	b := newPopBroker(t, dir)
	b.pop.jnl.mu.Lock()
	b.pop.jnl.compactAt = 2 << 10
	b.pop.jnl.mu.Unlock()
	require.NoError(t, b.CreateTopic(TopicConfig{Name: "T", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	popSendN(t, b, "T", 0, 300, nil)
	ctx := context.Background()
	r := popReq("G", "T", 10)
	r.Invisible = time.Hour // no deadline wakes the loop meanwhile
	gen := func() uint64 {
		b.pop.jnl.mu.Lock()
		defer b.pop.jnl.mu.Unlock()
		return b.pop.jnl.gen
	}
	var kept []PoppedMessage
	for {
		got, err := b.Pop(ctx, r)
		require.NoError(t, err)
		if len(got) == 0 {
			break
		}
		for i, m := range got {
			if i == 0 {
				kept = append(kept, m) // one of each ten stays in flight
				continue
			}
			require.NoError(t, b.PopAck(ctx, "G", "T", m.Handle))
		}
		// The loop compacts on its own goroutine; on a loaded machine it may not run
		// before the rounds end, so each round past the size waits for it.
		if before := gen(); b.pop.jnl.needsCompaction() {
			require.Eventually(t, func() bool { return gen() > before }, 10*time.Second, time.Millisecond, "compacted once past its size")
		}
	}
	require.Len(t, kept, 30)
	require.GreaterOrEqual(t, gen(), uint64(2), "compacted more than once")
	b.pop.mu.RLock() // no compaction while the directory is copied
	crashed := copyDir(t, dir)
	b.pop.mu.RUnlock()
	b2 := newPopBroker(t, crashed)
	st := b2.PopStats("G")
	require.Len(t, st, 1)
	assert.Equal(t, 30, st[0].InFlight)
	assert.EqualValues(t, 270, st[0].Acked)
	for _, m := range kept {
		require.NoError(t, b2.PopAck(ctx, "G", "T", m.Handle))
	}
	assert.EqualValues(t, 300, b2.PopStats("G")[0].ConsumedOffset)
}
