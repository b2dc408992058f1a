package handles

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/status"
)

func TestLookupKinds(t *testing.T) {
	tab := NewTable()
	eng := tab.Add(Engine, 0, "engine")
	reg := tab.Add(Region, eng, "region")

	tests := []struct {
		name string
		kind Kind
		id   uint64
		want any
		err  bool
	}{
		{"engine", Engine, eng, "engine", false},
		{"region", Region, reg, "region", false},
		{"null", Engine, 0, nil, true},
		{"unknown", Engine, 12345, nil, true},
		{"foreign kind", Engine, reg, nil, true},
		{"foreign kind 2", Batch, eng, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := tab.Get(tc.kind, tc.id)
			if tc.err {
				require.Error(t, err)
				require.True(t, errors.Is(err, status.ErrInvalidHandle))
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, v)
		})
	}
}

func TestIDsNeverReused(t *testing.T) {
	tab := NewTable()
	seen := map[uint64]bool{}
	for i := 0; i < 1000; i++ {
		id := tab.Add(Batch, 0, i)
		require.False(t, seen[id])
		seen[id] = true
		_, err := tab.Remove(Batch, id)
		require.NoError(t, err)
		_, err = tab.Remove(Batch, id)
		require.ErrorIs(t, err, status.ErrInvalidHandle, "double remove")
		_, err = tab.Get(Batch, id)
		require.ErrorIs(t, err, status.ErrInvalidHandle, "stale get")
	}
	require.Equal(t, 0, tab.Len())
}

func TestRemoveChildren(t *testing.T) {
	tab := NewTable()
	e1 := tab.Add(Engine, 0, 1)
	e2 := tab.Add(Engine, 0, 2)
	for i := 0; i < 5; i++ {
		tab.Add(Region, e1, i)
		tab.Add(Region, e2, i)
	}
	require.Equal(t, 5, tab.CountChildren(e1))
	require.Len(t, tab.RemoveChildren(e1), 5)
	require.Equal(t, 0, tab.CountChildren(e1))
	require.Equal(t, 5, tab.CountChildren(e2))
	require.Equal(t, 7, tab.Len())
}

func TestConcurrent(t *testing.T) {
	tab := NewTable()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				id := tab.Add(Region, 0, i)
				v, err := tab.Get(Region, id)
				if err != nil || v != i {
					t.Errorf("get %d: %v %v", id, v, err)
					return
				}
				if _, err := tab.Remove(Region, id); err != nil {
					t.Errorf("remove: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 0, tab.Len())
}
