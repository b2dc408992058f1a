package core

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// addUses takes uses of a region the caller holds only while no
// unregister has started; otherwise it leaves the use count as it was.
func TestAddUses(t *testing.T) {
	var none *Region
	require.True(t, none.addUses(0))
	require.True(t, none.addUses(3), "a nil region takes nothing")

	r := &Region{}
	r.Addr, r.Len = 0x1000, 0x100
	r.users.Store(1) // the caller's use

	require.True(t, r.addUses(0))
	require.EqualValues(t, 1, r.users.Load())
	require.True(t, r.addUses(5))
	require.EqualValues(t, 6, r.users.Load())

	r.closing.Store(true)
	require.False(t, r.addUses(2), "an unregister has started")
	require.EqualValues(t, 6, r.users.Load(), "the uses taken to look are given back")
}
