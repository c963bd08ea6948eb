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
	require.NoError(t, f.Add(Epoch{1, 0}))
	require.NoError(t, f.Add(Epoch{1, 0}), "adding the last epoch again is a no-op")
	require.NoError(t, f.Add(Epoch{3, 500}))
	require.ErrorIs(t, f.Add(Epoch{2, 900}), ErrEpochOrder)
	require.ErrorIs(t, f.Add(Epoch{4, 100}), ErrEpochOrder)

	g, err := OpenEpochFile(path)
	require.NoError(t, err)
	require.Equal(t, []Epoch{{1, 0}, {3, 500}}, g.Epochs())

	require.NoError(t, g.TruncateTo(500))
	h, err := OpenEpochFile(path)
	require.NoError(t, err)
	require.Equal(t, []Epoch{{1, 0}}, h.Epochs())
}

func TestCommonOffset(t *testing.T) {
	master := []Epoch{{1, 0}, {2, 100}, {4, 300}}
	for _, c := range []struct {
		name    string
		replica []Epoch
		end     int64
		want    int64
	}{
		{"empty replica", nil, 0, 0},
		{"behind in the same epoch", []Epoch{{1, 0}, {2, 100}, {4, 300}}, 350, 350},
		{"behind in an older epoch", []Epoch{{1, 0}}, 80, 80},
		{"older epoch ran on alone", []Epoch{{1, 0}}, 150, 100},
		{"a term the master never had", []Epoch{{1, 0}, {2, 100}, {3, 200}}, 260, 200},
		{"ahead of the master", []Epoch{{1, 0}, {2, 100}, {4, 300}}, 500, 400},
		{"no shared epoch", []Epoch{{7, 0}}, 50, 0},
		{"a log with no history", nil, 50, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, CommonOffset(master, 400, c.replica, c.end))
		})
	}
}

func TestEpochAt(t *testing.T) {
	eps := []Epoch{{1, 0}, {2, 100}, {3, 100}, {5, 300}}
	e, end, ok := EpochAt(eps, 150)
	require.True(t, ok)
	require.Equal(t, Epoch{3, 100}, e, "an epoch that wrote nothing is passed over")
	require.Equal(t, int64(300), end)
	e, end, _ = EpochAt(eps, 300)
	require.Equal(t, Epoch{5, 300}, e)
	require.Equal(t, int64(-1), end)
}
