package e2e

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// A data directory holding another replica set's log (restored from the wrong backup, the
// same broker and cluster names) is told apart by the set's identity, which every record of
// epochs.json carries: both sets' histories start with epoch 1 at offset 0, so without it
// the master would stream onto the other set's log, or cut it. Two sets, A and B, each of
// three members; a fourth member of B starts on a copy of the log of A's rs-3: B's master
// refuses it naming both identities, the member says so in its log and on /readyz, and
// its log and history are as they were copied.
func TestReplicaSetRefusesAMemberHoldingAnotherSetsLog(t *testing.T) {
	a := startReplicaSet(t, "sync")
	allInSync(t, a)
	masterA := masterAddr(a)
	for i := range 20 {
		code, remark, err := sendTo(t, masterA, fmt.Sprintf("a-%02d", i))
		require.NoError(t, err)
		require.Equal(t, protocol.Success, code, remark)
	}
	src := a[2]
	require.Eventually(t, func() bool { return len(topicAt(t, src.broker, replTopic)) == 20 }, wait, tick, "A's rs-3 holds every send")
	src.terminate()
	for _, n := range a[:2] {
		n.kill() // set A is done with: its copy is taken
	}
	setA := setOf(t, src.dir)
	require.NotEmpty(t, setA)

	b := startReplicaSet(t, "sync")
	allInSync(t, b)
	setB := setOf(t, nodeAt(b, masterAddr(b)).dir)
	require.NotEqual(t, setA, setB, "two sets chose two identities")

	// The member's data directory but its NATS server's state: that is of A's NATS cluster.
	dir := t.TempDir()
	entries, err := os.ReadDir(filepath.Join(src.dir, "data"))
	require.NoError(t, err)
	for _, e := range entries {
		if e.Name() != "nats" {
			copyTree(t, filepath.Join(src.dir, "data", e.Name()), filepath.Join(dir, "data", e.Name()))
		}
	}
	before := treeSums(t, filepath.Join(dir, "data"), "store/commitlog", "epochs.json")

	d := launchFourth(t, b[0], dir, "")
	line := refusedMember(t, d, setA)
	require.Contains(t, line, setB, "the refusal names both sets")
	require.Equal(t, before, treeSums(t, filepath.Join(dir, "data"), "store/commitlog", "epochs.json"), "its log and history are as copied")
	_, err = os.Stat(filepath.Join(dir, "data", "replication-truncate"))
	require.ErrorIs(t, err, fs.ErrNotExist, "no cut was asked for")
	got := topicAt(t, d.broker, replTopic)
	require.Len(t, got, 20, "it still serves set A's messages from its own log")
	for _, n := range b {
		require.Zero(t, topicAt(t, n.broker, replTopic)["a-00"], "rs-%d of set B holds nothing of A's", n.id)
	}
	t.Logf("refused: %s", line)
}

// setOf is the identity in the epoch history of the member whose directory is dir.
func setOf(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "data", "epochs.json"))
	require.NoError(t, err)
	var eps []struct {
		Set string `json:"set"`
	}
	require.NoError(t, json.Unmarshal(b, &eps))
	require.NotEmpty(t, eps)
	for _, e := range eps {
		require.Equal(t, eps[0].Set, e.Set, "every record carries the set's identity")
	}
	return eps[0].Set
}

// copyTree copies the file or directory src to dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	require.NoError(t, filepath.WalkDir(src, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		if e.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o644)
	}))
}

// treeSums is the SHA-256 of every file under root's paths, by path.
func treeSums(t *testing.T, root string, paths ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range paths {
		require.NoError(t, filepath.WalkDir(filepath.Join(root, p), func(f string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return err
			}
			b, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			out[f] = fmt.Sprintf("%x", sha256.Sum256(b))
			return nil
		}))
	}
	require.NotEmpty(t, out)
	return out
}
