package replication

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEpochFilePersistsInOrder(t *testing.T) {
	path := filepath.Join(t.TempDir(), EpochFileName)
	f, err := OpenEpochFile(path)
	require.NoError(t, err)
	require.Equal(t, Epoch{}, f.Last())
	require.NoError(t, f.Add(Epoch{Epoch: 1, Start: 0}))
	require.NoError(t, f.Add(Epoch{Epoch: 1, Start: 0}), "adding the last epoch again is a no-op")
	require.NoError(t, f.Add(Epoch{Epoch: 3, Start: 500}))
	require.ErrorIs(t, f.Add(Epoch{Epoch: 2, Start: 900}), ErrEpochOrder)
	require.ErrorIs(t, f.Add(Epoch{Epoch: 4, Start: 100}), ErrEpochOrder)

	g, err := OpenEpochFile(path)
	require.NoError(t, err)
	require.Equal(t, []Epoch{{Epoch: 1, Start: 0}, {Epoch: 3, Start: 500}}, g.Epochs())

	require.NoError(t, g.TruncateTo(500))
	h, err := OpenEpochFile(path)
	require.NoError(t, err)
	require.Equal(t, []Epoch{{Epoch: 1, Start: 0}}, h.Epochs())
}

func TestCommonOffset(t *testing.T) {
	master := []Epoch{{Epoch: 1, Start: 0}, {Epoch: 2, Start: 100}, {Epoch: 4, Start: 300}}
	for _, c := range []struct {
		name    string
		replica []Epoch
		end     int64
		want    int64
	}{
		{"empty replica", nil, 0, 0},
		{"behind in the same epoch", []Epoch{{Epoch: 1, Start: 0}, {Epoch: 2, Start: 100}, {Epoch: 4, Start: 300}}, 350, 350},
		{"behind in an older epoch", []Epoch{{Epoch: 1, Start: 0}}, 80, 80},
		{"older epoch ran on alone", []Epoch{{Epoch: 1, Start: 0}}, 150, 100},
		{"a term the master never had", []Epoch{{Epoch: 1, Start: 0}, {Epoch: 2, Start: 100}, {Epoch: 3, Start: 200}}, 260, 200},
		{"ahead of the master", []Epoch{{Epoch: 1, Start: 0}, {Epoch: 2, Start: 100}, {Epoch: 4, Start: 300}}, 500, 400},
		{"no shared epoch", []Epoch{{Epoch: 7, Start: 0}}, 50, 0},
		{"a log with no history", nil, 50, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, CommonOffset(master, 400, c.replica, c.end))
		})
	}
}

func TestEpochAt(t *testing.T) {
	eps := []Epoch{{Epoch: 1, Start: 0}, {Epoch: 2, Start: 100}, {Epoch: 3, Start: 100}, {Epoch: 5, Start: 300}}
	e, end, ok := EpochAt(eps, 150)
	require.True(t, ok)
	require.Equal(t, Epoch{Epoch: 3, Start: 100}, e, "an epoch that wrote nothing is passed over")
	require.Equal(t, int64(300), end)
	e, end, _ = EpochAt(eps, 300)
	require.Equal(t, Epoch{Epoch: 5, Start: 300}, e)
	require.Equal(t, int64(-1), end)
}
