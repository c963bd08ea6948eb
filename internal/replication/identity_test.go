package replication

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// followTo runs a follower of m on r until r's log ends where m's does, then stops it.
func followTo(t *testing.T, r, m *node, addr string) {
	t.Helper()
	stop, _ := follow(t, r, addr, "b")
	eventually(t, r.name+" caught up with "+m.name, func() bool { return r.end() == m.end() })
	stop()
}

// stripIdentity rewrites n's epoch file as a version before identities wrote it.
func stripIdentity(t *testing.T, n *node) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(n.dir, EpochFileName), mustJSON(t, terms(n.epochs.Epochs())), 0o644))
	ep, err := OpenEpochFile(filepath.Join(n.dir, EpochFileName))
	require.NoError(t, err)
	require.Zero(t, ep.Identity())
	n.epochs = ep
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// onDisk is the identity of every record of n's epoch file as written.
func onDisk(t *testing.T, n *node) []SetID {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.dir, EpochFileName))
	require.NoError(t, err)
	var eps []Epoch
	require.NoError(t, json.Unmarshal(b, &eps))
	var out []SetID
	for _, e := range eps {
		out = append(out, e.Set)
	}
	return out
}

func fill(t *testing.T, n *node, from, to int) {
	for i := from; i < to; i++ {
		n.put(t, "t", i)
	}
}

// Every epoch history starts "epoch 1 at 0": only the set's identity tells the log of
// another replica set (a data directory restored from the wrong backup) from a log of this
// one. A replica of another set is refused with both identities named, whether its log is
// shorter than the master's (it would have been streamed onto) or longer (it would have been
// cut), and nothing of it changes; a history written before identities adopts the
// master's, and so does an empty one.
func TestReplicaSetIdentity(t *testing.T) {
	for _, c := range []struct {
		name string
		// master, if set, prepares the master's data directory (default: empty).
		master func(t *testing.T) *node
		// replica prepares the replica's data directory, given the running master m.
		replica func(t *testing.T, m *node, addr string) *node
		refused bool
	}{
		{name: "an empty replica adopts the new set's identity",
			replica: func(t *testing.T, _ *node, _ string) *node { return newNode(t, "r") }},
		{name: "a replica of this set behind the master follows",
			replica: func(t *testing.T, m *node, addr string) *node {
				r := newNode(t, "r")
				followTo(t, r, m, addr)
				fill(t, m, 20, 30)
				return r
			}},
		{name: "a history written before identities adopts the master's",
			replica: func(t *testing.T, m *node, addr string) *node {
				r := newNode(t, "r")
				followTo(t, r, m, addr)
				stripIdentity(t, r)
				fill(t, m, 20, 30)
				return r
			}},
		{name: "a master whose history predates identities chooses one",
			master: func(t *testing.T) *node {
				m := newNode(t, "m")
				require.NoError(t, m.epochs.Add(Epoch{Epoch: 1, Start: 0}))
				fill(t, m, 100, 110)
				stripIdentity(t, m)
				return m
			},
			replica: func(t *testing.T, _ *node, _ string) *node { return newNode(t, "r") }},
		{name: "another set's shorter log is refused, not streamed onto", refused: true,
			replica: func(t *testing.T, _ *node, _ string) *node { return otherSetsMember(t, 5) }},
		{name: "another set's longer log is refused, not cut", refused: true,
			replica: func(t *testing.T, _ *node, _ string) *node { return otherSetsMember(t, 60) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newNode(t, "m")
			if c.master != nil {
				m = c.master(t)
			}
			ma := startMaster(t, m, max(m.epochs.Last().Epoch+1, 1), false, 1)
			addr := ma.Addr().String()
			set := m.epochs.Identity()
			require.NotZero(t, set, "the master chose the set's identity")
			for _, id := range onDisk(t, m) {
				require.Equal(t, set, id, "every record of the master's history carries the identity")
			}
			fill(t, m, 0, 20)
			r := c.replica(t, m, addr)
			mine := r.epochs.Identity()
			end := r.end()
			before, _ := os.ReadFile(filepath.Join(r.dir, EpochFileName))

			_, done := follow(t, r, addr, "b")
			if c.refused {
				var err error
				select {
				case err = <-done:
				case <-time.After(15 * time.Second):
					t.Fatal("the replica of another set was not refused")
				}
				require.ErrorIs(t, err, ErrRefused)
				require.Contains(t, err.Error(), mine.String(), "the error names the replica's set")
				require.Contains(t, err.Error(), set.String(), "the error names the master's set")
				require.Equal(t, end, r.end(), "nothing of its log was cut or added")
				after, _ := os.ReadFile(filepath.Join(r.dir, EpochFileName))
				require.Equal(t, before, after, "its history is untouched")
				require.Empty(t, ma.Replicas())
				return
			}
			eventually(t, "the replica caught up", func() bool { return r.end() == m.end() })
			sameLog(t, m.st, r.st)
			require.Equal(t, set, r.epochs.Identity())
			require.Equal(t, terms(m.epochs.Epochs()), terms(r.epochs.Epochs()))
			for _, id := range onDisk(t, r) {
				require.Equal(t, set, id, "every record of the replica's history carries the identity")
			}
		})
	}
}

// otherSetsMember is a replica of another set (its own master, identity and n records),
// whose history, like every set's, starts with epoch 1 at 0.
func otherSetsMember(t *testing.T, n int) *node {
	t.Helper()
	o := newNode(t, "o")
	om := startMaster(t, o, 1, false, 1)
	fill(t, o, 1000, 1000+n)
	r := newNode(t, "r")
	followTo(t, r, o, om.Addr().String())
	require.NoError(t, om.Close())
	require.Equal(t, []Epoch{{Epoch: 1, Start: 0}}, terms(r.epochs.Epochs()))
	require.Equal(t, o.epochs.Identity(), r.epochs.Identity())
	return r
}

// A master that does not check identities (a version before them) still tells its own in
// its welcome: the replica refuses to follow another set's master itself.
func TestReplicaRefusesAMasterOfAnotherSet(t *testing.T) {
	r := otherSetsMember(t, 5)
	end := r.end()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	other := NewSetID()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br, bw := bufio.NewReader(c), bufio.NewWriter(c)
		var h hello
		if readJSON(br, frameHello, &h) == nil {
			_ = writeJSON(bw, frameWelcome, welcome{Epochs: []Epoch{{Epoch: 1, Start: 0, Set: other}}, TruncateTo: -1, Epoch: 1, Set: other})
		}
		_, _ = c.Read(make([]byte, 1))
	}()
	_, done := follow(t, r, ln.Addr().String(), "b")
	select {
	case err = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the replica followed a master of another set")
	}
	require.ErrorIs(t, err, ErrRefused)
	require.Contains(t, err.Error(), other.String())
	require.Contains(t, err.Error(), r.epochs.Identity().String())
	require.Equal(t, end, r.end())
}

// An epoch file whose records name two sets is not one history.
func TestEpochFileOfTwoSetsIsRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		eps  []Epoch
		err  error
	}{
		{"two identities", []Epoch{{Epoch: 1, Start: 0, Set: 1}, {Epoch: 2, Start: 10, Set: 2}}, ErrOtherSet},
		{"one identity and records before identities", []Epoch{{Epoch: 1, Start: 0}, {Epoch: 2, Start: 10, Set: 2}}, nil},
		{"none", []Epoch{{Epoch: 1, Start: 0}}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), EpochFileName)
			require.NoError(t, os.WriteFile(path, mustJSON(t, c.eps), 0o644))
			f, err := OpenEpochFile(path)
			if c.err != nil {
				require.ErrorIs(t, err, c.err)
				return
			}
			require.NoError(t, err)
			if f.Identity() != 0 {
				require.ErrorIs(t, f.SetIdentity(3), ErrOtherSet)
			} else {
				require.NoError(t, f.SetIdentity(3))
			}
			require.ErrorIs(t, f.Add(Epoch{Epoch: 9, Start: 20, Set: 4}), ErrOtherSet)
		})
	}
}

// A member that joined a new set before its first message keeps the set's identity on disk:
// reopened (a whole set restarted before any traffic), it still has it, and its history is
// the master's terms so far, so that, promoted then, it does not choose another identity.
func TestAnEmptyReplicaKeepsTheAdoptedIdentity(t *testing.T) {
	m := newNode(t, "m")
	ma := startMaster(t, m, 1, false, 1)
	set := m.epochs.Identity()
	r := newNode(t, "r")
	stop, _ := follow(t, r, ma.Addr().String(), "b")
	eventually(t, "the replica adopted the identity", func() bool { return r.epochs.Identity() == set })
	stop()
	require.Zero(t, r.end(), "no message was sent")

	r.close()
	r.open()
	require.Equal(t, set, r.epochs.Identity(), "the identity survives a restart")
	require.Equal(t, terms(m.epochs.Epochs()), terms(r.epochs.Epochs()), "the master's term at 0, as the master has it")

	// Promoted, it carries the set on: a master of epoch 2 keeps the identity.
	rm := startMaster(t, r, 2, false, 1)
	require.NoError(t, rm.Close())
	require.Equal(t, set, r.epochs.Identity())
	for _, id := range onDisk(t, r) {
		require.Equal(t, set, id)
	}
}
