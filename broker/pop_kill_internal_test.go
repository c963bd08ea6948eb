package broker

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// popKillChildDir is the environment variable that makes TestPopKilledProcessChild run: the
// child process of TestPopSurvivesKillOfTheProcess.
const popKillChildDir = "FLOWD_POP_KILL_CHILD_DIR"

type poppedLine struct {
	QueueID int32  `json:"q"`
	Offset  int64  `json:"o"`
	Handle  string `json:"h"`
	Acked   bool   `json:"a"`
}

// TestPopKilledProcessChild is the broker process the parent kills: it receives and
// acknowledges (popRestartScenario), prints what it handed out, and waits to be killed.
func TestPopKilledProcessChild(t *testing.T) {
	dir := os.Getenv(popKillChildDir)
	if dir == "" {
		t.Skip("the child of TestPopSurvivesKillOfTheProcess")
	}
	b := newPopBroker(t, dir)
	acked, unacked := popRestartScenario(t, b)
	enc := json.NewEncoder(os.Stdout)
	for _, m := range acked {
		require.NoError(t, enc.Encode(poppedLine{m.Message.QueueID, m.Message.QueueOffset, m.Handle, true}))
	}
	for _, m := range unacked {
		require.NoError(t, enc.Encode(poppedLine{m.Message.QueueID, m.Message.QueueOffset, m.Handle, false}))
	}
	os.Stdout.WriteString("READY\n")
	time.Sleep(time.Minute) // killed long before
	t.Fatal("not killed")
}

// A real kill -9 of a broker process with messages acknowledged and in flight: after a
// restart on its directory nothing acknowledged comes back and everything else does.
// FLOWD_SOAK=N repeats it N times.
func TestPopSurvivesKillOfTheProcess(t *testing.T) {
	rounds := 1
	if n, err := strconv.Atoi(os.Getenv("FLOWD_SOAK")); err == nil && n > 1 {
		rounds = n
	}
	for i := range rounds {
		t.Run(strconv.Itoa(i), popKillRound)
	}
}

func popKillRound(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPopKilledProcessChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), popKillChildDir+"="+dir)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var acked, unacked []PoppedMessage
	sc := bufio.NewScanner(out)
	ready := false
	for sc.Scan() {
		if sc.Text() == "READY" {
			ready = true
			break
		}
		var l poppedLine
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue // test framework output
		}
		m := PoppedMessage{Message: &protocol.MessageExt{QueueID: l.QueueID, QueueOffset: l.Offset}, Handle: l.Handle}
		if l.Acked {
			acked = append(acked, m)
		} else {
			unacked = append(unacked, m)
		}
	}
	require.True(t, ready, "the child did not get ready")
	require.NoError(t, cmd.Process.Kill()) // SIGKILL
	_ = cmd.Wait()
	require.Len(t, acked, 6)
	require.Len(t, unacked, 4)
	_, err = os.Stat(filepath.Join(dir, "pop", "snapshot.json"))
	require.ErrorIs(t, err, os.ErrNotExist, "killed: the journal is all there is")
	popCheckAfterRestart(t, newPopBroker(t, dir), acked, unacked)
}
