//go:build unix && tentinvariants

package slab

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tent-dev/tent/status"
)

func TestPoisonDetectsWriteAfterFree(t *testing.T) {
	baseline(t)
	s := newSlab(t, 100, 4)
	b, err := s.Alloc()
	require.NoError(t, err)
	mem := b.Bytes() // kept past Free on purpose: this is the bug being caught
	copy(mem, "live data")
	require.NoError(t, s.Free(b))
	require.Equal(t, bytes.Repeat([]byte{poisonByte}, len(mem)), mem, "a freed block is poisoned")

	mem[77] = 1 // write after free
	_, err = s.Alloc()
	requireCode(t, err, status.Internal, "write after free detected in block 0/0 at byte 77")
	st := s.Stats()
	require.Equal(t, 1, st.Quarantined)
	require.Zero(t, st.InUse)

	// The quarantined block is never handed out again.
	for range 7 {
		nb, err := s.Alloc()
		require.NoError(t, err)
		require.False(t, nb.chunk == 0 && nb.index == 0, "quarantined block reused")
	}
	requireCode(t, s.Free(b), status.InvalidArgument, "double free")
}

func TestPoisonIntactBlockIsReused(t *testing.T) {
	baseline(t)
	s := newSlab(t, 5000, 2) // blocks larger than the 4 KiB poison page
	b, err := s.Alloc()
	require.NoError(t, err)
	require.NoError(t, s.Free(b))
	nb, err := s.Alloc()
	require.NoError(t, err)
	require.Equal(t, b.index, nb.index)
	require.Equal(t, byte(poisonByte), nb.Bytes()[4999], "poison is left in place for the new owner")

	// A write in the second poison page is found too.
	mem := nb.Bytes()
	require.NoError(t, s.Free(nb))
	mem[4500] = 0
	_, err = s.Alloc()
	requireCode(t, err, status.Internal, "at byte 4500")
}
