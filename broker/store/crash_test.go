package store

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flowd-io/flowd/protocol"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var crashCycles = flag.Int("crash.cycles", 3, "kill -9 cycles in TestCrashRecovery")

const crashChildEnv = "FLOWD_STORE_CRASH_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(dir)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func bodyHash(b []byte) uint64 {
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}

// crashChild appends forever from several goroutines (sync flush, or async with the
// mapped segment), Put, PutBatch and PutAsync, and prints each acknowledged message as
// "qid qoff cloff hash ." until it is killed.
func crashChild(dir string) {
	o := testOptions()
	o.SegmentSize = 256 << 10
	o.ConsumeQueueUnits = 500
	o.FlushMode = FlushSync
	if os.Getenv(crashChildEnv+"_ASYNC") != "" {
		// A process crash loses nothing acknowledged in either mode; async maps the
		// active segment, so both write paths get killed mid-append.
		o.FlushMode = FlushAsync
	}
	s, err := Open(dir, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(2)
	}
	var out sync.Mutex
	w := os.Stdout // one write(2) per line: a kill cannot split a line except the last
	var wg sync.WaitGroup
	// One more appender keeps up to 16 PutAsync calls waiting at once, printing each
	// acknowledgement from its completion (the group commit's goroutine in FlushSync mode).
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 99))
		window := make(chan struct{}, 16)
		for {
			window <- struct{}{}
			m := newMsg("K", 3, "", "t3")
			m.Body = make([]byte, 1+rng.IntN(3000))
			for j := range m.Body {
				m.Body[j] = byte(rng.Uint32())
			}
			h := bodyHash(m.Body)
			s.PutAsync(context.Background(), m, func(r PutResult, err error) {
				if err != nil {
					fmt.Fprintln(os.Stderr, "put async:", err)
					os.Exit(3)
				}
				out.Lock()
				fmt.Fprintf(w, "%d %d %d %d .\n", 3, r.QueueOffset, r.CommitLogOffset, h)
				out.Unlock()
				<-window
			})
		}
	}()
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(g)))
			for i := 0; ; i++ {
				qid := int32(rng.IntN(3))
				body := make([]byte, 1+rng.IntN(3000))
				for j := range body {
					body[j] = byte(rng.Uint32())
				}
				m := newMsg("K", qid, "", "t"+strconv.Itoa(int(qid)))
				m.Body = body
				if i%7 == 0 {
					m2 := newMsg("K", qid, "", "t"+strconv.Itoa(int(qid)))
					m2.Body = body[:len(body)/2]
					rs, err := s.PutBatch(context.Background(), []*protocol.MessageExt{m, m2})
					if err != nil {
						fmt.Fprintln(os.Stderr, "put batch:", err)
						os.Exit(3)
					}
					out.Lock()
					fmt.Fprintf(w, "%d %d %d %d .\n%d %d %d %d .\n", qid, rs[0].QueueOffset, rs[0].CommitLogOffset, bodyHash(m.Body),
						qid, rs[1].QueueOffset, rs[1].CommitLogOffset, bodyHash(m2.Body))
					out.Unlock()
					continue
				}
				r, err := s.Put(context.Background(), m)
				if err != nil {
					fmt.Fprintln(os.Stderr, "put:", err)
					os.Exit(3)
				}
				out.Lock()
				fmt.Fprintf(w, "%d %d %d %d .\n", qid, r.QueueOffset, r.CommitLogOffset, bodyHash(body))
				out.Unlock()
			}
		}()
	}
	wg.Wait()
}

type ack struct {
	qid         int32
	qoff, cloff int64
	hash        uint64
}

func TestCrashRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	dir := t.TempDir()
	var acks []ack
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for cycle := range *crashCycles {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
		if cycle%2 == 1 {
			cmd.Env = append(cmd.Env, crashChildEnv+"_ASYNC=1")
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		lines := make(chan []ack, 1)
		appending := make(chan struct{}) // closed at the first acknowledgement
		go func() {
			var got []ack
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				var a ack
				var end string
				if _, err := fmt.Sscan(sc.Text(), &a.qid, &a.qoff, &a.cloff, &a.hash, &end); err == nil && end == "." {
					if got == nil {
						close(appending)
					}
					got = append(got, a)
				}
			}
			lines <- got
		}()
		// The kill lands at a random point of the appends, never before the child opened
		// the store (starting a race-instrumented binary on a loaded machine can take longer
		// than any fixed delay), so that every cycle kills a store mid-write.
		select {
		case <-appending:
		case got := <-lines:
			cmd.Wait()
			t.Fatalf("child stopped after %d acknowledgements: %s", len(got), stderr.String())
		}
		time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond) // where to crash, not a wait
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		got := <-lines
		cmd.Wait()
		require.NotContains(t, stderr.String(), "put", "child failed: %s", stderr.String())
		acks = append(acks, got...)
		t.Logf("cycle %d: %d acknowledged (%d in total)", cycle, len(got), len(acks))

		s := openT(t, dir, testOptions2())
		rep := s.Stats().Recovery
		assert.False(t, rep.Clean)
		assert.True(t, rep.CheckpointFound)
		verifyAcks(t, s, acks)
		checkConsistent(t, s)
		require.NoError(t, s.Close())
		if t.Failed() {
			return
		}
	}
}

// testOptions2 are the crash child's options (segment and file sizes must match).
func testOptions2() Options {
	o := testOptions()
	o.SegmentSize = 256 << 10
	o.ConsumeQueueUnits = 500
	return o
}

func verifyAcks(t *testing.T, s *Store, acks []ack) {
	t.Helper()
	maxQ := map[int32]int64{}
	for _, a := range acks {
		b, err := s.MessageAt(a.cloff)
		if !assert.NoError(t, err, "acknowledged message at %d lost", a.cloff) {
			return
		}
		m, _, err := protocol.DecodeStored(b)
		require.NoError(t, err)
		require.Equal(t, a.hash, bodyHash(m.Body), "body of %d", a.cloff)
		require.Equal(t, a.qoff, m.QueueOffset)
		require.Equal(t, a.qid, m.QueueID)
		off, _, _, err := s.queue("K", a.qid).unitAt(a.qoff)
		require.NoError(t, err)
		require.Equal(t, a.cloff, off, "unit %d/%d", a.qid, a.qoff)
		maxQ[a.qid] = max(maxQ[a.qid], a.qoff+1)
	}
	for qid, n := range maxQ {
		assert.GreaterOrEqual(t, s.MaxOffset("K", qid), n)
	}
}

func TestCorruptionFlippedByte(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, testOptions())
	res := putN(t, s, "T", 0, 100, "")
	require.NoError(t, s.Close())

	path := filepath.Join(dir, "commitlog", offsetName(0))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	bad := res[50]
	b[bad.CommitLogOffset+int64(bad.Size)-30] ^= 0x40 // inside the body
	require.NoError(t, os.WriteFile(path, b, 0o644))

	s = openT(t, dir, testOptions())
	defer s.Close()
	rep := s.Stats().Recovery
	assert.True(t, rep.Cut)
	assert.Equal(t, bad.CommitLogOffset, rep.CutAt)
	assert.Contains(t, rep.CutReason, "CRC")
	assert.Equal(t, res[99].CommitLogOffset+int64(res[99].Size)-bad.CommitLogOffset, rep.CutBytes)
	assert.Equal(t, int64(50), rep.RemovedUnits)
	assert.Equal(t, int64(50), s.MaxOffset("T", 0))
	checkConsistent(t, s)
	r := putN(t, s, "T", 0, 1, "")
	assert.Equal(t, int64(50), r[0].QueueOffset)
	assert.Equal(t, bad.CommitLogOffset, r[0].CommitLogOffset)
	waitDispatch(t, s)
	checkConsistent(t, s)
}

func TestCorruptionTornTail(t *testing.T) {
	dir := t.TempDir()
	o := testOptions()
	o.SegmentSize = 8192
	s := openT(t, dir, o)
	res := putN(t, s, "T", 0, 60, "")
	require.NoError(t, s.Close())
	last := res[59]
	// A torn last write: the segment file ends in the middle of the last message, and the
	// store did not close (abort marker present).
	seg := filepath.Join(dir, "commitlog", offsetName(last.CommitLogOffset-last.CommitLogOffset%8192))
	require.NoError(t, os.Truncate(seg, last.CommitLogOffset%8192+int64(last.Size)/2))
	require.NoError(t, os.WriteFile(filepath.Join(dir, abortFile), nil, 0o644))

	s = openT(t, dir, o)
	defer s.Close()
	rep := s.Stats().Recovery
	assert.False(t, rep.Clean)
	assert.True(t, rep.Cut)
	assert.Equal(t, last.CommitLogOffset, rep.CutAt)
	assert.Equal(t, int64(last.Size)/2, rep.CutBytes)
	assert.Equal(t, last.CommitLogOffset, rep.End)
	assert.Equal(t, int64(59), s.MaxOffset("T", 0))
	checkConsistent(t, s)
	fi, err := os.Stat(seg)
	require.NoError(t, err)
	assert.Equal(t, int64(8192), fi.Size())
}

func TestCorruptionLaterSegmentsRemoved(t *testing.T) {
	dir := t.TempDir()
	o := testOptions()
	o.SegmentSize = 4096
	s := openT(t, dir, o)
	res := putN(t, s, "T", 0, 80, "")
	require.NoError(t, s.Close())
	// Garbage at the start of the second segment.
	b, err := os.ReadFile(filepath.Join(dir, "commitlog", offsetName(4096)))
	require.NoError(t, err)
	b[4] ^= 0xFF
	require.NoError(t, os.WriteFile(filepath.Join(dir, "commitlog", offsetName(4096)), b, 0o644))
	os.Remove(filepath.Join(dir, checkpointFile)) // forces a full validation

	s = openT(t, dir, o)
	defer s.Close()
	rep := s.Stats().Recovery
	assert.False(t, rep.CheckpointFound)
	assert.True(t, rep.Cut)
	assert.Equal(t, int64(4096), rep.CutAt)
	assert.NotEmpty(t, rep.RemovedSegments)
	assert.Equal(t, 2, s.Stats().Segments)
	n := 0
	for _, r := range res {
		if r.CommitLogOffset < 4096 {
			n++
		}
	}
	assert.Equal(t, int64(n), s.MaxOffset("T", 0))
	checkConsistent(t, s)
}
