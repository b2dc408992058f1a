//go:build unix && !tentinvariants

package slab

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Without the tentinvariants tag, Free and Alloc do not touch block memory.
func TestNoPoisonByDefault(t *testing.T) {
	baseline(t)
	s := newSlab(t, 64, 4)
	b, err := s.Alloc()
	require.NoError(t, err)
	mem := b.Bytes()
	copy(mem, "still here")
	require.NoError(t, s.Free(b))
	require.Equal(t, "still here", string(mem[:10]))
	nb, err := s.Alloc()
	require.NoError(t, err)
	require.Equal(t, "still here", string(nb.Bytes()[:10]), "contents are not cleared on reuse")
}
